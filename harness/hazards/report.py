"""Hazard records and their human-readable / JSON forms (DESIGN.md, "Hazard detection")."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

KINDS = ("RAW", "WAR", "WAW", "host-stall")

# how the dimensions of a few engine buffers are called in reports
_ROW_LABEL = {"req_to_token": "rows", "fwd.kv_indices": "batch rows", "relay.tokens": "entries"}
_COL_LABEL = {"req_to_token": "positions", "fwd.kv_indices": "positions"}


@dataclass
class Side:
    """One access of a hazardous pair."""

    stream: str  # the thread: a stream name, or "host"
    op: str  # op name ("attn_metadata", "req_to_token.write", "host read", "schedule.synchronize", ...)
    site: str  # issue site file:line
    step: int
    access: str  # "read" | "write" | "wait"
    op_id: int | None = None  # the op's id in issue order (None for host accesses)
    requests: dict = field(default_factory=dict)  # row -> request id, for the rows involved, when known

    def describe(self) -> str:
        who = f"{self.stream} stream" if self.stream != "host" else "host"
        req = ""
        if self.requests:
            req = " for " + ", ".join(f"row {r}: {q}" for r, q in sorted(self.requests.items()))
        oid = f" #{self.op_id}" if self.op_id is not None else ""
        return f"{self.access:5s} by {who}, op {self.op}{oid} (step {self.step}) at {self.site}{req}"


@dataclass
class Hazard:
    """Two conflicting accesses that no happens-before edge orders, or a host stall.

    `first` is the access issued first (in program order), `second` the later one;
    the kind names them in that order (WAR: first reads, second writes)."""

    kind: str  # RAW | WAR | WAW | host-stall
    buffer: str  # named buffer ("req_to_token", "kv[0].k", ...); for host-stall the stream blocked on
    elements: str  # summary, e.g. "rows 3 positions 0..17"
    first: Side
    second: Side
    n_elements: int = 0
    rows: list = field(default_factory=list)  # dim-0 indices involved (2-D and larger buffers)
    detail: str = ""
    order: tuple = (0.0, 0.0)  # issue order keys of (first, second): op ids, host accesses in between

    @property
    def step(self) -> int:
        return self.second.step

    def to_dict(self) -> dict:
        d = asdict(self)
        for s in ("first", "second"):
            d[s]["requests"] = {str(k): v for k, v in d[s]["requests"].items()}
        return d

    def __str__(self) -> str:
        return format_hazard(self)


def format_hazard(h: Hazard) -> str:
    if h.kind == "host-stall":
        lines = [f"host-stall: blocking call on the {h.buffer} stream waits behind unfinished work "
                 f"(step {h.second.step})",
                 f"  blocked:  {h.second.describe()}",
                 f"  behind:   {h.first.describe()}"]
        if h.detail:
            lines.append(f"  {h.detail}")
        return "\n".join(lines)
    lines = [f"{h.kind} hazard on {h.buffer} {h.elements} ({h.n_elements} element"
             f"{'s' if h.n_elements != 1 else ''}): no happens-before edge orders these accesses",
             f"  first:  {h.first.describe()}",
             f"  second: {h.second.describe()}"]
    if h.detail:
        lines.append(f"  {h.detail}")
    return "\n".join(lines)


# -- element summaries ---------------------------------------------------------------
def _ranges(vals: list[int], limit: int = 8) -> str:
    """[0,1,2,5,7,8] -> '0..2, 5, 7..8' (at most `limit` ranges, then '... (+k more)')."""
    out: list[str] = []
    if not vals:
        return ""
    lo = prev = vals[0]
    for v in vals[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(lo) if lo == prev else f"{lo}..{prev}")
        if v is not None:
            lo = prev = v
    if len(out) > limit:
        return ", ".join(out[:limit]) + f", ... (+{len(out) - limit} more)"
    return ", ".join(out)


def summarize_elements(name: str, shape: tuple, flat: torch.Tensor, unit: int = 1) -> tuple[str, list[int]]:
    """Summarize flat element indices of a buffer of `shape`: (text, dim-0 rows involved).

    1-D: "elements 0..3, 7"; 2-D: "rows 3 positions 0..17" when every row touches the same
    column range, else one clause per row; more dims: rows of dim 0 ("slots" for the KV
    pools), with "(part of each)" when some rows are touched only in part. With unit > 1
    the indices are already dim-0 rows (a buffer tracked per row)."""
    idx = torch.unique(flat.reshape(-1).to(torch.int64)).tolist()
    if unit > 1 and shape:
        rlabel = _ROW_LABEL.get(name, "slots" if name.startswith("kv[") else "rows")
        return f"{rlabel} {_ranges(idx)}", idx
    if not shape or len(shape) == 1:
        return f"{_ROW_LABEL.get(name, 'elements')} {_ranges(idx)}", []
    rowsize = 1
    for s in shape[1:]:
        rowsize *= int(s)
    by_row: dict[int, list[int]] = {}
    for i in idx:
        by_row.setdefault(i // rowsize, []).append(i % rowsize)
    rows = sorted(by_row)
    rlabel = _ROW_LABEL.get(name, "slots" if name.startswith("kv[") else "rows")
    if len(shape) == 2:
        clabel = _COL_LABEL.get(name, "cols")
        cols = {tuple(v) for v in by_row.values()}
        if len(cols) == 1:
            return f"{rlabel} {_ranges(rows)} {clabel} {_ranges(list(next(iter(cols))))}", rows
        parts = [f"row {r} {clabel} {_ranges(by_row[r], 4)}" for r in rows[:6]]
        more = f"; ... (+{len(rows) - 6} rows)" if len(rows) > 6 else ""
        return "; ".join(parts) + more, rows
    full = all(len(v) == rowsize for v in by_row.values())
    return f"{rlabel} {_ranges(rows)}" + ("" if full else " (part of each)"), rows
