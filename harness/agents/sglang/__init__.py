"""The SGLang agent: loaded by SGLang itself in every process that calls `load_plugins()`, through
this project's `sglang.srt.plugins` entry point (install.register); it acts only inside scheduler
subprocesses and only when the target handed it a plan (harness.agents.plan).

One module per question: the points it patches and its fault catalogue (points), the fence judged
by happens-before on the CPU (fence), entry 0 of padded batches (entry0), each request's steps
(steps), the device operations on the CPU and on a CUDA GPU (cpu_ops, cuda_ops), the source
patches of SGLang (patches), the contract check against SGLang's source (contract), and the
installation (install). Nothing is imported here: each module is imported for itself (the contract
tests read `points` without SGLang).
"""
