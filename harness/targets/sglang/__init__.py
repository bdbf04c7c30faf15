"""SGLang as a target (target: the pair it starts), its setup (setup, and the CPU path its servers
get first on their PYTHONPATH: cpu_path/), its overlap paths (paths), its stock findings
(upstream) and the private patched copy a source patch runs in (patched_copy). This package
imports nothing: import the module you need."""
