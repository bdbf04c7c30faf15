"""vLLM's workers, rank by rank (issue 45): the runner and async check, the worker's own overlap
and the books at idle, each read from every worker process and named by its rank.

vLLM's multiprocess executor runs one worker per rank (tensor x pipeline parallel size); the
agent in each writes worker-<pid>.json with its rank (harness.agents.vllm.ranks). One worker is
rank 0 of one, and its verdict reads as it did before (no rank named). With several, every
line that is about one worker says which ("rank 1 (tp 1 of 2): ...").
"""
from __future__ import annotations

import os

from harness.targets.served import ranks


def workers(facts: list[dict]) -> dict[int, dict]:
    return ranks.by_rank(facts, "worker")


def who(f: dict, facts: list[dict]) -> str:
    """"" for the only worker, "rank N (...)" when there are several: a verdict's prefix."""
    return f"{ranks.label(f)}: " if ranks.several(facts, "worker") else ""


def setting_errors(facts: list[dict], runner: str, overlap: bool) -> list[str]:
    """Every worker whose runner or async setting is not what the target asked: one line each, its
    rank named (a TP rank that ran the other setting would answer other tokens than its peers)."""
    out = []
    for f in workers(facts).values():
        got = f.get("runner", "v1")  # V1's agent does not name it: only V2's does
        if got != runner:
            out.append(f"{who(f, facts)}the worker runs the {got.upper()} model runner")
        if f.get("use_async_scheduling") != overlap:
            out.append(f"{who(f, facts)}the worker runs use_async_scheduling={f.get('use_async_scheduling')}")
    return out


def overwritten_errors(facts: list[dict], before) -> list[str]:
    """Every worker whose sampled-id copy (the agent's, harness.agents.vllm.copy_engine) was
    overwritten by a later step's before its reader read it, during one run, with no fault asking
    for that: the agent's own error. The reader then hands vLLM another step's ids, and a request
    loses or repeats a token that the engine never lost (issue 45: the pp2 reset divergence). The
    target refuses to judge such a run instead of reporting it as the engine's."""
    out = []
    for f in workers(facts).values():
        b = next((x for x in before or () if x.get("role") == "worker" and x.get("pid") == f.get("pid")), {})
        n = int(f.get("buffer_overwritten", 0) or 0) - int(b.get("buffer_overwritten", 0) or 0)
        if n > 0:
            out.append(f"{who(f, facts)}the agent's host buffer of the sampled ids was overwritten by a later "
                       f"step before its reader read it ({n} time(s)): the agent's own error, the run is not judged")
    return out


NA = "n/a"  # a rank's overlap verdict where its forwards have no copy to overlap (PP: a stage before the last)


def samples(f: dict) -> bool:
    """The rank samples the step's ids and copies them to the host: every TP rank (each runs the
    sampler over the same batch), under PP only the last stage (the others receive the ids)."""
    return int(f.get("pp_rank", 0) or 0) >= int(f.get("pp_size", 1) or 1) - 1


def overlap_verdicts(facts: list[dict], before, judge_worker) -> list[tuple[str, tuple]]:
    """(rank label, (effective, why)) per worker over one run: each sampling rank's forwards judged
    against the previous step's sampled-id copy (judge_worker); a pipeline stage that samples
    nothing (all but the last) has no copy to overlap: (NA, why), never judged."""
    out = []
    for r, f in workers(facts).items():
        if not samples(f):
            out.append((ranks.label(f), (NA, f"{NA}: a pipeline stage before the last samples no ids, so its "
                                             "forwards have no copy to overlap (judged on the last stage)")))
            continue
        b = next((x for x in before or () if x.get("role") == "worker" and x.get("pid") == f.get("pid")), {})
        out.append((ranks.label(f), judge_worker(f.get("forward_copy"), b.get("forward_copy"))))
    return out


def overlap_line(verdicts: list[tuple[str, tuple]]) -> tuple[bool | None, str]:
    """The workers' part of the overlap verdict, decided by the ranks that sample (the worst of
    them), each rank named when several; a rank that samples nothing is listed with its n/a. No
    sampling rank at all (facts missing) is said: never a pass."""
    if not verdicts:
        return None, "worker: no worker facts"
    judged = [v for v in verdicts if v[1][0] != NA]
    if not judged:
        return None, "worker: judged on no rank (no rank samples: " + "; ".join(f"{lab}: {w}" for lab, (_, w) in verdicts) + ")"
    lab, (eff, why) = ranks.worst(judged)
    if len(verdicts) == 1:
        return eff, why
    if eff is False:
        return False, f"{lab}: {why}"
    return eff, "; ".join(f"{lab}: {w}" for lab, (_, w) in verdicts)


def pipeline_size(config) -> int:
    """The pipeline size a server configuration (harness.targets.vllm.configs) asks for."""
    args = list(getattr(config, "args", ()))
    i = args.index("--pipeline-parallel-size") if "--pipeline-parallel-size" in args else -1
    return int(args[i + 1]) if 0 <= i < len(args) - 1 else 1


def adaptations(target) -> list[str]:
    """What a multi-worker configuration needs adapted on vLLM's CPU build (the verdict's "adapted")."""
    if target.runner == "v1" and pipeline_size(target.config) > 1 and target.release.has("cpu_v1_pp_eager_no_intermediate"):
        return ["a later pipeline stage's receive buffer (intermediate_tensors) allocated at its first step, as V1's "
                "warm-up would (the CPU worker skips the warm-up under --enforce-eager and stage 1 dies: KNOWN "
                "UPSTREAM cpu-v1-pp-eager-no-intermediate)"]
    return []


def alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (TypeError, ValueError, ProcessLookupError, PermissionError):
        return False


def books_of(facts: list[dict]) -> dict:
    """The books in the agent's facts: the engine core's only if taken at its latest step; the
    worker's of each rank ("ranks": {rank label: books}, when there are several; "worker" is then
    the first rank's, so an old reader still finds one)."""
    out = {"engine": None, "worker": None}
    for f in facts:
        if f.get("role") != "engine":
            continue
        b = f.get("books")
        if f.get("books_error"):
            out["engine_error"] = f["books_error"]
        if b is not None and b.get("step") != f.get("steps"):
            b = None  # a step ran since: not idle (yet)
        out["engine"] = b
    ws = workers(facts)
    for r, f in ws.items():
        if f.get("books_error"):
            out["worker_error"] = f"{who(f, facts)}{f['books_error']}"
    if ws:
        out["worker"] = next(iter(ws.values())).get("books")
    if len(ws) > 1:
        out["ranks"] = {ranks.label(f): f.get("books") for f in ws.values()}
    return out
