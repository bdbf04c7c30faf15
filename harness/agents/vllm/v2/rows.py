"""The path rows (harness.targets.vllm.paths) on V2's runner: which the V2 agent counts, and which
have nothing to attack there.

V1's rows that need a V1 worker point (harness.targets.vllm.releases.ROW_NEEDS "point:...") are
counted on V2 by the V2 point of the same path (harness.agents.vllm.v2.agent counters, V1's
counter names); a row whose path V2 does not have is n/a on V2, with the reason.
"""
from __future__ import annotations

# a V1 worker point a row needs -> the V2 point that counts the same path
SAME_PATH = {"bookkeeping": "v2_postprocess", "penalty_ids": "v2_sampler", "grammar": "v2_grammar",
             "min_tokens": "v2_logit_bias", "logit_bias": "v2_logit_bias"}

ABSENT = {
    "seeded_reorder": "V2 keeps each request in one request-state row from its admission to its end "
                      "(no condense, no swap): nothing reorders a seeded request's row, and seeded noise "
                      "is drawn from the seed and the position, not from a per-row generator",
}


def row_absent(row: str, version: str | None) -> str:
    """"n/a on V2 (V): why" when V2's runner lacks what the row attacks or counts; "" when it has it."""
    from harness.agents.vllm.v2.points import POINTS_BY_NAME
    from harness.targets.vllm import releases as vllm_releases
    where = f"n/a on the V2 runner{f' ({version})' if version else ''}"
    if row in ABSENT:
        return f"{where}: {row}: {ABSENT[row]}"
    for need in vllm_releases.ROW_NEEDS.get(row, ()):
        if not need.startswith("point:"):
            continue
        v1 = need[6:]
        v2 = SAME_PATH.get(v1)
        if v2 is None:  # an engine-core point: shared by both runners (the V1 table says)
            continue
        p = POINTS_BY_NAME[v2]
        if not p.exists_in(version):
            return f"{where}: {row}: {p.module}.{p.qualname} (what it counts) is there from {p.since}"
    return ""
