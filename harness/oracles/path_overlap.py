"""Overlap per path (issue 36, item 4): a run can overlap on every path but one.

The run-level oracle (harness.agents.host_order.judge) counts every wait of the engine core: a
chunked prefill that waits for its previous chunk while the other requests keep overlapping
loses the overlap on its path and still leaves the run "effective (529 of 530 waits ...)". So
the agent also judges each wait for each request of the step waited on (overlapped: a batch
scheduled before the wait continued it; early: none did although each had room, and the next
batch after the wait did; host_order.HostOrder), and this oracle sums those verdicts by path
(the path rows of harness.targets.vllm.paths, the features of a stress case).

A path is judged twice: over every wait of its requests, and over the waits on their prefill
steps alone (a chunked prefill loses its overlap on its chunks; its decode steps after would
dilute that). The rule, per path and each way, async on: LOST when at least MIN_JUDGED of its requests' waits were judged,
more than EARLY_FRACTION of them were early, and the path's share of overlapped waits is at
least MIN_DROP below the share of the rest of the run (a run that loses overlap everywhere, or a
path whose requests are the whole run, is the run-level oracle's). The figures go into the line
either way.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.agents.host_order import EARLY_FRACTION, MIN_JUDGED
from harness.agents.vllm.steps import FIELDS, request_key

MIN_DROP = 0.25  # how far below the rest of the run a path's share must fall to be LOST there
_KEY = FIELDS.index("key")
# (overlapped, early) field pairs: every wait of the request, and those on its prefill steps
PHASES = {"all": (FIELDS.index("overlapped"), FIELDS.index("early")),
          "prefill": (FIELDS.index("overlapped_prefill"), FIELDS.index("early_prefill"))}


@dataclass
class Share:
    overlapped: int = 0
    early: int = 0

    @property
    def judged(self) -> int:
        return self.overlapped + self.early

    @property
    def share(self) -> float | None:
        return self.overlapped / self.judged if self.judged else None

    def add(self, other: "Share") -> "Share":
        return Share(self.overlapped + other.overlapped, self.early + other.early)

    def text(self) -> str:
        if not self.judged:
            return "no wait judged"
        return f"{self.overlapped} of {self.judged} waits overlapped ({self.share:.0%}), {self.early} early"


def by_key(records: dict, phase: str = "all") -> dict[str, Share]:
    """The async-on arm's steps books (vLLM request id -> record) summed per request key, over
    every wait ("all") or its prefill steps' ("prefill")."""
    ov, early = PHASES[phase]
    out: dict[str, Share] = {}
    for rec in records.values():
        if len(rec) <= early:
            continue  # an older agent's books: no per-request overlap
        s = out.setdefault(rec[_KEY], Share())
        s.overlapped += int(rec[ov])
        s.early += int(rec[early])
    return out


def share_of(reqs, keys: dict[str, Share]) -> Share:
    """The summed share of these requests (harness Requests: prompt_ids, max_new_tokens); twins
    sharing a key are counted once."""
    seen, total = set(), Share()
    for r in reqs:
        k = request_key(r.prompt_ids, r.max_new_tokens)
        if k in keys and k not in seen:
            seen.add(k)
            total = total.add(keys[k])
    return total


def judge(path: str, mine: Share, everyone: Share) -> tuple[bool | None, str]:
    """(lost, line): lost True (`overlap: LOST on <path> ...`), False (kept) or None (too few
    waits judged). `everyone`: the run's requests, this path's included."""
    rest = Share(everyone.overlapped - mine.overlapped, everyone.early - mine.early)
    figs = f"{mine.text()}; the rest of the run: {rest.text()}"
    if mine.judged < MIN_JUDGED:
        return None, f"overlap on {path}: not judged (fewer than {MIN_JUDGED} waits: {figs})"
    if rest.judged < MIN_JUDGED:  # the path is (almost) the whole run: the run-level oracle's to judge
        return None, f"overlap on {path}: not judged apart (its requests are the run: {figs})"
    rest_share = rest.share
    if mine.early > EARLY_FRACTION * mine.judged and mine.share <= rest_share - MIN_DROP:
        return True, (f"overlap: LOST on {path} ({figs}: the host waited on its requests' steps before "
                      f"scheduling them again, with room in the batch)")
    return False, f"overlap on {path}: kept ({figs})"


def judge_row(path: str, books: dict, mine_reqs, all_reqs) -> tuple[bool | None, str, Share]:
    """Both ways (every wait, prefill steps): the first LOST line, else the every-wait line.
    Returns (lost, line, the path's every-wait share)."""
    lines = []
    for phase in ("all", "prefill"):
        keys = by_key(books, phase)
        mine = share_of(mine_reqs, keys)
        lost, line = judge(path if phase == "all" else f"{path} (its prefill steps)", mine, share_of(all_reqs, keys))
        if lost:
            return True, line, mine
        lines.append((lost, line, mine))
    return lines[0]
