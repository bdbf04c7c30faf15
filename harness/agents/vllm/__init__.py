"""The vLLM agent: loaded by vLLM itself in every one of its processes (API server, engine
core, worker) through this project's `vllm.general_plugins` entry point (install.register).

Inert unless a plan is handed over (harness.agents.plan). With one it
- keeps async scheduling on when it was asked for: vLLM's CPU platform turns it off silently
  (timing);
- makes the sampled-id copy on CPU what it is on a GPU: asynchronous, into reused host buffers,
  with an event the reader waits on (copy_engine);
- sleeps at named points of the async path by seeded plan and injects the vLLM fault catalogue
  (points: where; faults: which wrapper takes each);
- writes facts: the effective setting in each process, how many schedules ran while another
  batch was in the queue, the host's order of schedule and wait events (what the overlap oracle
  judges), and progress (what the target's hang watchdog polls) (timing); how often each attacked
  path ran (counters); each request's steps (steps);
- dumps every thread's stack into the facts folder on SIGUSR1, for a HANG report (state);
- reads vLLM's own books when the engine goes idle: what harness.oracles.books holds to "nothing
  leaks" (books);
- adapts to the release it runs in (the plan's "release", harness.targets.vllm.releases): it
  patches the points that release has (install), stubs torch.cuda's streams and events where the
  release calls them on CPU (cuda_stubs), and works around the vLLM bugs that release has, one
  module per bug (workarounds/).
Besides: the source patches of vLLM that the kill matrix applies to a private copy (patches), and
the logits processors the vLLM target loads (logitsprocs). Nothing is imported here: each module
is imported for itself (the contract tests read `points` without vLLM).
"""
