"""The SGLang agent: loaded by SGLang itself in every process that calls `load_plugins()`, through
this project's `sglang.srt.plugins` entry point (install.register); it acts only inside scheduler
subprocesses and only when the target handed it a plan (harness.agents.plan).

One module per question, each wrapper a named function in the module of its question:
- install: register(), the agent's state and WRAPPERS, the ordered table of the points it wraps;
- timing: the forward, the result copy (the seeded delays), the launch and the host's wait on a
  result (the host order the overlap oracle judges, the progress the hang watchdog polls);
- counters: the paths counted on both arms; faults: where the fault catalogue acts;
- fence: the fence judged by happens-before on the CPU, and the req_to_token writes it judges;
- entry0: padded graph batches on entry 0; steps: each request's steps; books: SGLang's books;
- cpu_ops, cuda_ops: the device operations on SGLang's CPU backend and on a CUDA GPU;
- points: the patch points and the fault catalogue, which contract checks against SGLang's source;
- patches: the source patches of SGLang that the kill matrix applies to a private copy.
Nothing is imported here: each module is imported for itself (the contract tests read `points`
without SGLang).
"""
