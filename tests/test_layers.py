"""Data flows one way (issue 42, item 2): harness's packages stand in layers, and an import may
only run down (or stay within its layer). The layers, lowest first, in one table:

- base: the package root and the modules that import nothing of harness (cache, jsonl, stopping);
- device: the stream API, its executors and the vector clocks the streams carry;
- agents: code that runs inside a real engine's processes. It learns what it must know about the
  release it runs in from the plan the target writes (harness.agents.plan, harness.agents.release),
  never from the target's modules: it sits below everything the host side builds, so an agent
  module that imports a target, an oracle or the engine is an arrow back up;
- engine, then hazards (the detector reads the engine's named buffers and rows);
- config: the ref engine's fault catalogue and the range checks;
- workloads (request streams, the client's keys), then oracles (which read the facts the agents
  write and the requests the workloads draw);
- targets (which write the agents' plans);
- runs: the front ends' shared flags (the engine's, and the served targets' options, which resolve
  a vLLM build from the targets' tables), the gate, the stress search, the GSM8K evals, the ref
  engine's server, the pytest plugin;
- releases (the sweep runs the gate per release), commands, cli.

Imports are counted at any depth (a function-level import ties two modules as much as a top-level
one): tests/test_layout.import_graph. Tests are not in the graph (a contract test may read both
sides)."""
from tests.test_layout import import_graph

LAYERS = (
    ("base", ("harness", "harness.cache", "harness.jsonl", "harness.stopping", "harness.verdict")),
    ("device", ("harness.device",)),
    ("agents", ("harness.agents",)),
    ("engine", ("harness.engine",)),
    ("hazards", ("harness.hazards",)),
    ("config", ("harness.faults", "harness.validate")),
    ("workloads", ("harness.workloads",)),
    ("oracles", ("harness.oracles",)),
    ("targets", ("harness.targets",)),
    ("runs", ("harness.flags", "harness.gate", "harness.search", "harness.evals", "harness.serve", "harness.plugin")),
    ("releases", ("harness.releases",)),
    ("commands", ("harness.commands",)),
    ("cli", ("harness.cli",)),
)


def layer_of(module: str) -> int | None:
    """The layer of a module: its longest prefix in LAYERS (None: in no layer)."""
    best, depth = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and p.count(".") > depth:
                best, depth = i, p.count(".")
    return best


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
    """One line per import that runs from a lower layer to a higher one."""
    out = []
    for m, deps in sorted(graph.items()):
        lm = layer_of(m)
        for d in sorted(deps):
            ld = layer_of(d)
            if lm is not None and ld is not None and ld > lm:
                out.append(f"{m} ({LAYERS[lm][0]}) imports {d} ({LAYERS[ld][0]})")
    return out


def test_the_layer_check_finds_an_arrow_back_up():
    graph = {"harness.device.stream": {"harness.device.clocks", "harness.hazards.clocks"},
             "harness.agents.vllm.install": {"harness.agents.plan", "harness.targets.vllm.releases"},
             "harness.targets.vllm.target": {"harness.agents.plan"}}
    assert back_arrows(graph) == [
        "harness.agents.vllm.install (agents) imports harness.targets.vllm.releases (targets)",
        "harness.device.stream (device) imports harness.hazards.clocks (hazards)"]
    assert layer_of("harness") == 0 and layer_of("harness.cli") == len(LAYERS) - 1


def test_every_module_of_harness_has_a_layer():
    graph = import_graph()
    assert len(graph) > 50  # the walk saw the package
    assert [m for m in sorted(graph) if layer_of(m) is None] == []


def test_no_import_runs_back_up_a_layer():
    graph = import_graph()
    assert sum(map(len, graph.values())) > 100
    assert back_arrows(graph) == []
