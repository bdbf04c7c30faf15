"""Which rank a worker process is (issue 45): read from vLLM's own process groups once the worker
built its model runner (vLLM initialises the distributed environment before it, in
`Worker.init_device`), and written into the worker's facts so that the target judges each rank's
facts, books and clocks apart and names the rank in its verdict ("rank 1: ...").

One worker (no tensor or pipeline parallelism) is rank 0 of one; a release or a process without
vLLM's groups reports nothing, and the target then reads it as that single rank."""
from __future__ import annotations


def rank_facts() -> dict:
    """{"rank": the global rank, "tp_rank", "tp_size", "pp_rank", "pp_size"}; {} when vLLM's
    groups are not there (never raises: the facts must never break the engine)."""
    try:
        from vllm.distributed import parallel_state as ps
        tp, pp = ps.get_tp_group(), ps.get_pp_group()
        return {"rank": int(ps.get_world_group().rank_in_group), "tp_rank": int(tp.rank_in_group),
                "tp_size": int(tp.world_size), "pp_rank": int(pp.rank_in_group), "pp_size": int(pp.world_size)}
    except Exception:
        return {}
