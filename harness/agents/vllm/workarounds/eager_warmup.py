"""No compiler warm-up under --enforce-eager (a start's cost, not a bug).

Turned on where the release table's fact cpu_warmup_under_eager holds (up to 0.27.0, where vLLM
itself returns early when compilation is off); "cpu_eager_warmup" under the plan's "stock" leaves
vLLM's own warm-up in place. The warm-up is a profile run that only warms a compiler; with none
(every server here runs eager) it changes nothing a step computes, and cost 30 s of each 0.20.2
server's start on this 2-core machine. Kept under pipeline parallelism: the warm-up's _dummy_run is
where V1's runner allocates a later stage's receive buffer (workarounds.pp_receive_buffer).
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = "cpu_warmup_under_eager"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "cpu_warmup"


def patch(orig):
    def warming_up_model(self, *a, **kw):
        cc = getattr(getattr(self, "vllm_config", None), "compilation_config", None)
        eager = getattr(getattr(self, "model_config", None), "enforce_eager", False)
        off = eager or str(getattr(cc, "mode", getattr(cc, "level", ""))).rsplit(".", 1)[-1] in ("NONE", "0")
        pp = getattr(getattr(self, "parallel_config", None), "pipeline_parallel_size", 1)
        if not off or pp > 1 or "cpu_eager_warmup" in state.PLAN.data.get("stock", ()):
            return orig(self, *a, **kw)
        state.facts("worker").add("cpu_eager_warmup_skipped")
        return None
    return warming_up_model


PATCHES = {POINT: patch}
