"""Every rank of a served engine, judged apart and named (issue 45).

With tensor or pipeline parallelism an engine runs one worker process per rank (vLLM's
multiprocess executor) or one scheduler per rank (SGLang), and the agent in each writes its own
facts file with its rank ("rank", "tp_rank", "pp_rank", ... : harness.agents.vllm.ranks and the
SGLang agent's install). What the host side does with them:

- books and clocks are judged per rank: one rank's leak is a finding of that rank, named ("rank 1:
  3 KV blocks ..."), never hidden by another rank that is clean, nor by keeping only the last file
  read (what the vLLM target did before: rank 1's leak was never judged);
- path counters are not summed across ranks: each TP rank runs the same sampler over the same
  batch (and under PP only the last stage samples), so a path counted by every rank ran once.
  A counter of a ranked role is the largest of its ranks' counts; the counters of the processes
  that exist once (the API server, the engine core) are summed as before.

A process that reports no rank (one worker, an older agent) is rank 0 of one.
"""
from __future__ import annotations


def rank_of(f: dict) -> int:
    """A process's rank: vLLM's global rank, else SGLang's pp_rank * tp_size + tp_rank, else 0."""
    if isinstance(f.get("rank"), int):
        return f["rank"]
    return int(f.get("pp_rank", 0) or 0) * int(f.get("tp_size", 1) or 1) + int(f.get("tp_rank", 0) or 0)


def by_rank(facts: list[dict], role: str) -> dict[int, dict]:
    """{rank: that rank's facts} of one role. Two files of one rank (a process restarted without
    its folder cleared) keep the one further along (more steps), then the later pid."""
    out: dict[int, dict] = {}
    for f in facts:
        if f.get("role") != role:
            continue
        r = rank_of(f)
        old = out.get(r)
        if old is None or _progress(f) >= _progress(old):
            out[r] = f
    return dict(sorted(out.items()))


def _progress(f: dict) -> tuple:
    return (int(f.get("books_steps", 0) or 0) + int(f.get("steps", 0) or 0), int(f.get("pid", 0) or 0))


def label(f: dict) -> str:
    """"rank 1 (tp 1 of 2)", "rank 1 (pp stage 1 of 2)", "rank 3 (tp 1 of 2, pp stage 1 of 2)"."""
    parts = []
    if int(f.get("tp_size", 1) or 1) > 1:
        parts.append(f"tp {f.get('tp_rank', 0)} of {f['tp_size']}")
    if int(f.get("pp_size", 1) or 1) > 1:
        parts.append(f"pp stage {f.get('pp_rank', 0)} of {f['pp_size']}")
    return f"rank {rank_of(f)}" + (f" ({', '.join(parts)})" if parts else "")


def several(facts: list[dict], role: str) -> bool:
    """More than one rank of `role` reported."""
    return len(by_rank(facts, role)) > 1


def counts(facts: list[dict], ranked=("worker",)) -> dict[str, int]:
    """Every numeric fact over the processes: summed over those of unranked roles, the largest of
    the ranks for a role in `ranked` (a path every rank counted ran once)."""
    out: dict[str, int] = {}
    per_role: dict[str, dict[str, int]] = {}
    for f in facts:
        role = f.get("role")
        for k, v in f.items():
            if not isinstance(v, int) or isinstance(v, bool) or k in ("pid", "rank", "tp_rank", "pp_rank",
                                                                        "tp_size", "pp_size"):
                continue
            if role in ranked:
                acc = per_role.setdefault(role, {})
                acc[k] = max(acc.get(k, 0), v)
            else:
                out[k] = out.get(k, 0) + v
    for acc in per_role.values():
        for k, v in acc.items():
            out[k] = out.get(k, 0) + v
    return out


def worst(verdicts: list[tuple[str, tuple]]) -> tuple[str, tuple]:
    """Of (rank label, (effective, why)) the one that decides: LOST (False) before not judged
    (None) before effective (True); the first such rank."""
    order = {False: 0, None: 1, True: 2}
    return min(verdicts, key=lambda v: order[v[1][0]])
