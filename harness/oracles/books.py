"""Nothing leaks on a served engine: its own books at idle, async on and off (issue 23).

The agent reads them inside the engine (harness.agents.vllm.books: `engine_books` when the
engine core goes idle, `worker_books` after each worker step); the target collects them once
the engine is idle (VllmTarget.idle_books). Two questions:

- each arm: is everything back? Every count in HELD must be 0 at idle (a block still referenced,
  a request still in a scheduler set, a placeholder never drained, a batch row still occupied).
- async on vs off: does the async arm hold anything at idle that the off arm released? Judged per
  count, so a count both arms leave behind still shows where the async arm leaves more.

What only timing decides is reported, never judged: which prefix blocks stay cached (evictable,
counted free) depends on which requests ran together.
"""
from __future__ import annotations

# count -> what it is, in the words of a finding ("async on: 3 <what> at idle")
HELD = {
    "blocks_in_use": "KV blocks still referenced",
    "blocks_held_by_no_request": "KV blocks referenced by no request (never evictable)",
    "blocks_unaccounted": "KV blocks neither free nor referenced",
    "deferred_free_blocks": "KV blocks parked for a deferred free",
    "requests": "requests still in the scheduler's map",
    "running": "requests still running",
    "waiting": "requests still waiting",
    "kv_holding_waiting": "waiting requests still holding KV blocks",
    "deferred_waiting": "deferred waiting requests",
    "finished_ids": "finished ids never sent to the worker",
    "inflight_prefills": "prefills still marked in flight",
    "kv_requests": "requests still holding KV blocks",
    "placeholders": "output placeholders never drained",
    "stale_outputs": "stale outputs never drained",
    "runner_requests": "request states still in the worker",
    "batch_rows": "input-batch rows still occupied",
    "batch_slots": "input-batch slots still naming a request",
    "generators": "seeded generators still in the batch",
    "host_buffers_held": "host buffers of the sampled-id copy never handed back",
}
TIMING = ("blocks_cached_evictable", "blocks_free")  # reported, not judged


def views(books: dict) -> list[tuple[str, dict]]:
    """One arm's books as the parts judged apart, each with the prefix its findings carry: the
    whole when one worker ran; with several ranks (issue 45) the engine core's, then each rank's
    worker ("rank 1 (tp 1 of 2): "), so one rank's leak is named and never hidden by another's."""
    ranks = books.get("ranks")
    if not ranks or len(ranks) < 2:
        return [("", books)]
    engine = {k: v for k, v in books.items() if k.startswith("engine") or k == "first_leak"}
    parts = [("", engine)] if "engine" in books else []
    return parts + [(f"{lab}: ", {"worker": wb}) for lab, wb in ranks.items()]


def flat(books: dict) -> dict:
    """One arm's books, the engine core's and the worker's counts in one dict."""
    out = {}
    for part in ("engine", "worker"):
        out.update({k: v for k, v in (books.get(part) or {}).items() if isinstance(v, int) and not isinstance(v, bool)})
    return out


def _named(books: dict, key: str) -> str:
    """Who holds what a count says: the requests still held, or a block's last holder."""
    e = books.get("engine") or {}
    if key.startswith("blocks_held_by_no_request") and e.get("orphans"):
        o = e["orphans"][0]
        who = (f"last held by request {o['last_holder']} ({o['event']})" if o.get("last_holder")
               else "its last holder is not known (not preempted or aborted)")
        return f" (block {o['block']}: {who})"
    held = e.get("held") or []
    if held and key in ("blocks_in_use", "requests", "kv_requests", "placeholders", "stale_outputs", "running",
                        "waiting", "kv_holding_waiting"):
        h = held[0]
        how = f", {h['released'][0]}{' with a step in flight' if h['released'][1] else ''}" if h.get("released") else ""
        out = f", {h['outputs']} of {h['max_tokens']} output tokens" if h.get("max_tokens") is not None else ""
        return (f" (request {h['rid']}: {h['status']}{how}, {h['blocks']} block(s), {h['placeholders']} placeholder(s), "
                f"{h['stale_outputs']} stale{out})")
    return ""


def missing(books: dict) -> list[str]:
    """What the books lack (an agent that reported no idle engine, a read that failed), per rank."""
    out = []
    for who, view in views(books):
        for part in ("engine", "worker"):
            if part not in view:  # not asked for (a HANG report: the engine's books only)
                continue
            if not view[part]:
                err = books.get(part + "_error")
                out.append(f"{who}no {part} books at idle" + (f": {err}" if err else ""))
    return out


def leaks(books: dict, arm: str, other: dict | None = None) -> list[str]:
    """Everything an idle engine still holds, one finding per count and rank, naming who holds it
    (and, given the other arm's books, what that arm's same part holds of the same)."""
    others = dict(views(other or {}))
    out = []
    for who, view in views(books):
        c, o = flat(view), flat(others.get(who, {}))
        out += [f"async {arm}: {who}{c[k]} {what} at idle" + (f" (the other arm: {o.get(k, 0)})" if other else "")
                + _named(view, k) for k, what in HELD.items() if c.get(k, 0) > 0]
    return out


def compare(on: dict, off: dict) -> list[str]:
    """What the async-on arm holds at idle beyond the async-off arm, count by count and rank: a
    finding even where vLLM's own counts add up (free + cached + in use = total with a block still in use)."""
    offs = dict(views(off))
    out = []
    for who, view in views(on):
        a, b = flat(view), flat(offs.get(who, {}))
        out += [f"async on holds {who}{a[k]} {what} at idle where async off holds {b.get(k, 0)}{_named(view, k)}"
                for k, what in HELD.items() if a.get(k, 0) > b.get(k, 0)]
    return out


def findings(on: dict, off: dict) -> list[str]:
    """The oracle: books missing, then each arm's counts not back at idle (the async arm first).
    Every count of HELD must be 0, so compare()'s "on beyond off" is within these."""
    out = [f"async {arm}: {m}" for arm, bk in (("on", on), ("off", off)) for m in missing(bk)]
    return out or (leaks(on, "on", off) + leaks(off, "off", on))


def line(books: dict, arm: str) -> str:
    """The books of one arm at idle, as `check` prints them."""
    if missing(books):
        return f"books at idle (async {arm}): {'; '.join(missing(books))}"
    c = flat(books)
    held = [f"{who}{flat(v)[k]} {k}" for who, v in views(books) for k in HELD if flat(v).get(k, 0) > 0]
    return (f"books at idle (async {arm}): KV blocks {c.get('blocks_free', 0)} free of {c.get('blocks_total', 0)} "
            f"({c.get('blocks_cached_evictable', 0)} cached, evictable), {c.get('blocks_in_use', 0)} in use, "
            f"{c.get('blocks_held_by_no_request', 0)} held by no request; scheduler {c.get('requests', 0)} requests "
            f"({c.get('running', 0)} running, {c.get('waiting', 0)} waiting, {c.get('finished_ids', 0)} finished ids); "
            f"placeholders {c.get('placeholders', 0)}, stale outputs {c.get('stale_outputs', 0)}; "
            + _batch_line(books)
            + ("everything back" if not held else "NOT BACK: " + ", ".join(held)))


def _batch_line(books: dict) -> str:
    """The input batch's part of line(): one worker's, or each rank's (issue 45)."""
    ranks = books.get("ranks")
    if ranks and len(ranks) > 1:
        return "".join(f"{lab}: input batch {(wb or {}).get('batch_rows', 0)} rows, "
                       f"{(wb or {}).get('generators', 0)} generators; " for lab, wb in ranks.items())
    if "worker" not in books:
        return ""
    c = flat(books)
    return f"input batch {c.get('batch_rows', 0)} rows, {c.get('generators', 0)} generators; "
