"""vLLM as a target (target: the pair it starts), and what the harness knows about vLLM: its
releases (releases, facts), the builds it runs (build, overlay, ops, setup), the path attack
(paths, workload), its server configurations (configs), its known-upstream bugs (upstream), and
the private patched copy a source patch runs in (patched_copy). Import the module you need:
this package imports nothing, so the agent side can read the release table without the pair."""
