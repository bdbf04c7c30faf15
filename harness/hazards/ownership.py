"""Slot ownership on the device side (DESIGN.md, "Oracles": every slot a step writes or reads
belongs to its row at that step).

The CPU's reservation checks (`test_reservation`) judge the CPU's idea of a window; this judges
the slots the device actually touched. The access tracker logs every read and write of the KV
pools (`kv[i].k/v`, `draft_kv.k/v`: one unit per slot) with the op that made it, and each op of a
step carries the plan it was launched with (`meta["plan"]`, loop.py): the pages each of its rows
owned when the step was planned. Then:

- a slot a row writes must lie in that row's pages (a padded row writes only the padding page 0,
  and a real row never does). A write is traced to its row through the token order of the pass:
  an index_copy_ into a pool keeps the order of its `out_loc` index, whose tokens are laid out
  row by row (prefill: each row's tokens; decode: a fixed number per row, padded rows last);
- a slot a step reads must lie in the pages of one of its rows, or in the padding page (masked
  positions and padded rows read slot 0). Reads are judged per step, not per row, because how
  attention gathers keys is the model's business (chunked, flat, per group).

"When the step was planned" is the right instant: the CPU may free a finished or retracted
request's pages while a step planned before that is still queued, which is fine because
whatever it reuses them for runs after that step on the forward stream. What is never fine is a
step touching a slot its rows did not own even at planning: a speculative window past the
reservation, pages the CPU freed before it launched a step that still uses them (the
vllm-ascend #13501 class), a stale slot number left in a row by a previous owner. These corrupt
other requests only when the reuse lands at the wrong time, so tokens often come out the same;
this check does not depend on that.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from harness.engine.model import pad_rows

KV_PREFIXES = ("kv[", "draft_kv.")


@dataclass(frozen=True)
class Violation:
    step: int
    op: str
    buffer: str
    write: bool
    slot: int
    who: str  # "request X" (its row wrote), "a padded row", or "the step" (reads: judged per step)
    owner: str  # whose page the slot was in at planning, in words
    n_slots: int = 1  # slots of this access with the same problem

    def __str__(self) -> str:
        verb = "wrote" if self.write else "read"
        more = f" (and {self.n_slots - 1} more slot(s))" if self.n_slots > 1 else ""
        whose = "its row's pages" if self.who.startswith("request") else "the pages of the step's rows"
        return (f"step {self.step} ({self.op}): {self.who} {verb} {self.buffer} slot {self.slot}{more}, outside "
                f"{whose} as planned for this step: {self.owner}")


def _units(part) -> torch.Tensor:
    if isinstance(part, slice):
        return torch.arange(part.start, part.stop, dtype=torch.int64)
    return part.reshape(-1).to(torch.int64)


def _owner(plan: dict, page: int, rids: list[str], history: dict) -> str:
    if page == 0:
        return "it is the padding page"
    for rid, pages in zip(rids, plan["pages"]):
        if page in pages:
            return f"page {page} was request {rid}'s"
    o = plan["owners"].get(page)
    if o is not None:
        return f"page {page} was request {o}'s (not in this step)"
    if page in history:
        rid, step = history[page]
        return (f"page {page} was request {rid}'s in step {step}, and the CPU had released it (to the pool or "
                f"the prefix cache) before it launched this step")
    return f"page {page} belonged to no running request (free, never allocated, or only in the prefix cache)"


def _write_rows(plan: dict, kind: str, n_rows: int, n_units: int) -> torch.Tensor | None:
    """Batch index of each token of one pass (n_rows or more: a padded token), or None if the
    pass's layout is not one this engine produces."""
    if kind == "prefill":
        bounds, acc = [], 0
        for n in plan["ntok"]:
            acc += n
            bounds.append(acc)
        return torch.tensor([bisect.bisect_right(bounds, i) for i in range(n_units)], dtype=torch.int64)
    m = pad_rows(n_rows)
    if n_units % m:
        return None
    return torch.arange(n_units, dtype=torch.int64) // (n_units // m)


def check(log, limit: int = 20) -> list[Violation]:
    """Ownership violations in a tracker log (AccessTracker(log=KV_PREFIXES)), in issue order."""
    out: list[Violation] = []
    history: dict[int, tuple[str, int]] = {}  # page -> (request, step) of the last plan that held it
    last_plan = None
    for a in log:
        plan = a.meta.get("plan") if a.meta else None
        if plan is None or a.thread == "host" or not a.buffer.startswith(KV_PREFIXES):
            continue
        ps = plan["page_size"]
        rids = list(a.meta["rows"].values())
        if plan is not last_plan:  # a new step (its ops share one plan): remember who held what
            last_plan = plan
            for rid, pages in zip(rids, plan["pages"]):
                for p in pages:
                    history[p] = (rid, a.step)
            owned = [torch.tensor(sorted(p), dtype=torch.int64) for p in plan["pages"]]
        B = len(rids)
        if not a.write:
            pages = torch.tensor(a.units, dtype=torch.int64) // ps
            ok = pages == 0
            for o in owned:
                ok |= torch.isin(pages, o)
            if not bool(ok.all()):
                bad = torch.tensor(a.units, dtype=torch.int64)[~ok]
                out.append(Violation(a.step, a.name, a.buffer, False, int(bad[0]), "the step",
                                     _owner(plan, int(bad[0]) // ps, rids, history), int(bad.numel())))
        else:
            for part in a.parts:
                slots = _units(part)
                rows = _write_rows(plan, a.meta.get("kind"), B, slots.numel())
                if rows is None:  # an unknown layout: judge the pass per step, as reads are
                    rows = torch.full_like(slots, -1)
                pages = slots // ps
                for g in torch.unique(rows).tolist():
                    sel = rows == g
                    if g >= B:  # padded tokens: the padding page only
                        bad, who = slots[sel & (pages != 0)], "a padded row"
                    elif g < 0:
                        ok = pages == 0
                        for o in owned:
                            ok |= torch.isin(pages, o)
                        bad, who = slots[sel & ~ok], "the step"
                    else:  # a real row: its own pages, never the padding page
                        bad, who = slots[sel & ~torch.isin(pages, owned[g])], f"request {rids[g]}"
                    if bad.numel():
                        out.append(Violation(a.step, a.name, a.buffer, True, int(bad[0]), who,
                                             _owner(plan, int(bad[0]) // ps, rids, history), int(bad.numel())))
        if len(out) >= limit:
            break
    return out
