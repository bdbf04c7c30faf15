"""The engine's own books at idle (issue 23: nothing leaks).

What vLLM allocates, read from its own objects when the engine core goes idle (every request
finished or aborted): the block pool, the scheduler's sets, the requests it still holds and
their placeholder / stale-output counts; in the worker, after each step, the input batch's rows,
the seeded requests' generators and our host buffers. harness.oracles.books judges them.
"""
from __future__ import annotations

import time
from collections import OrderedDict

from harness.agents.vllm import copy_engine, counters, state

_RELEASED: OrderedDict = OrderedDict()  # rid -> (event, a step in flight, block ids)
_RELEASED_KEEP = 512
_BOOKS_SHOWN = 16  # requests / blocks named in the facts, at most


def _blocks_of(sched, rid: str) -> list[int]:
    return [b.block_id for m in sched.kv_cache_manager.coordinator.single_type_managers
            for b in m.req_to_blocks.get(rid, ()) if not b.is_null]


def _note_release(sched, request, event: str) -> None:
    """The blocks a request held as it was preempted or aborted, and whether a step of it was in
    flight: a block still held at idle by no request is named by its last holder."""
    in_flight = bool(getattr(request, "num_in_flight_tokens", 0) or request.num_output_placeholders)
    _RELEASED[request.request_id] = (event, in_flight, _blocks_of(sched, request.request_id))
    _RELEASED.move_to_end(request.request_id)
    while len(_RELEASED) > _RELEASED_KEEP:
        _RELEASED.popitem(last=False)
    if in_flight:
        state.facts("engine").add(f"{event}_in_flight")
    if int(getattr(request, "num_output_placeholders", 0) or 0) >= 2:
        # two decode frames (or a frame with drafts) in flight as it was let go: where vllm#48245
        # lived (k steps in flight, issue 45); the count says whether a run reached it
        state.facts("engine").add(f"{event}_two_frames")


def _books_preempt(orig):
    def _preempt_request(self, request, *a, **kw):
        try:
            _note_release(self, request, "preempted")
        except Exception as e:  # the books must never break the engine
            state.facts("engine").set(books_error=f"preempt: {e}")
        return orig(self, request, *a, **kw)
    return _preempt_request


def _books_abort(orig):
    def finish_requests(self, request_ids, finished_status, *a, **kw):
        if not isinstance(request_ids, (str, type(None))):
            request_ids = list(request_ids)  # read here and by vLLM: an iterator would be spent
        try:
            if getattr(finished_status, "name", "") == "FINISHED_ABORTED":
                ids = (request_ids,) if isinstance(request_ids, str) else list(request_ids or self.requests)
                for rid in ids:
                    r = self.requests.get(rid)
                    if r is not None and not r.is_finished():
                        _note_release(self, r, "aborted")
        except Exception as e:
            state.facts("engine").set(books_error=f"abort: {e}")
        return orig(self, request_ids, finished_status, *a, **kw)
    return finish_requests


def engine_books(sched) -> dict:
    """The engine core's books: every count an idle engine must have returned to zero, and what
    only timing decides (which prefix blocks stay cached, evictable)."""
    pool = sched.kv_cache_manager.block_pool
    owners: dict[int, str] = {}
    for m in sched.kv_cache_manager.coordinator.single_type_managers:
        for rid, blocks in m.req_to_blocks.items():
            for b in blocks:
                if not b.is_null:
                    owners.setdefault(b.block_id, rid)
    real = [b for b in pool.blocks if not b.is_null]
    in_use = [b for b in real if b.ref_cnt > 0]
    free = pool.get_num_free_blocks()
    orphans = [b.block_id for b in in_use if b.block_id not in owners]
    reqs = list(sched.requests.values())
    named = []
    for bid in orphans[:_BOOKS_SHOWN]:  # its last holder, if it was preempted or aborted
        last = next(((rid, ev, fl) for rid, (ev, fl, blocks) in reversed(_RELEASED.items()) if bid in blocks), None)
        named.append({"block": bid, "last_holder": last[0] if last else None,
                      "event": (f"{last[1]}{' with a step in flight' if last[2] else ''}" if last else None)})
    return {
        "blocks_total": len(real), "blocks_free": free, "blocks_in_use": len(in_use),
        "blocks_held_by_no_request": len(orphans),
        "blocks_unaccounted": len(real) - free - len(in_use),  # neither free nor referenced
        "blocks_cached_evictable": sum(1 for b in real if b.ref_cnt == 0 and b.block_hash is not None),
        "deferred_free_blocks": sum(len(bl) for _, bl in getattr(sched, "deferred_frees", ())),
        "requests": len(reqs), "running": len(sched.running), "waiting": len(sched.waiting),
        "kv_holding_waiting": len(getattr(sched, "kv_holding_waiting", ())),
        "deferred_waiting": len(getattr(sched, "deferred_waiting", ())),
        "finished_ids": len(sched.finished_req_ids),
        "inflight_prefills": len(getattr(sched, "_inflight_prefills", ())),
        "kv_requests": len(set(owners.values())),
        "placeholders": sum(r.num_output_placeholders for r in reqs),
        "stale_outputs": sum(getattr(r, "num_stale_output_tokens", 0) for r in reqs),
        "held": [{"rid": r.request_id, "status": r.status.name, "placeholders": r.num_output_placeholders,
                  "stale_outputs": getattr(r, "num_stale_output_tokens", 0),
                  "outputs": r.num_output_tokens, "max_tokens": getattr(r, "max_tokens", None),
                  "blocks": len(_blocks_of(sched, r.request_id)),
                  "released": list(_RELEASED.get(r.request_id, ())[:2]) or None} for r in reqs[:_BOOKS_SHOWN]],
        "orphans": named,
    }


def _books_engine_step(orig):
    """After a step that leaves the engine idle: its books, with the step count they are of."""
    def step(self, *a, **kw):
        out = orig(self, *a, **kw)
        try:
            sched = self.scheduler
            if not sched.has_requests():
                f = state.facts("engine")
                f.add("books_seq")
                f.set(books={**engine_books(sched), "step": f.data.get("steps", 0), "seq": f.data["books_seq"]})
                f.write(True)
            elif time.monotonic() - _STARVED["t"] > 1.0 and not sched.running and len(sched.waiting):
                # requests wait and none runs: nothing can be admitted (a starved pool). The books
                # as they are, at most once a second: what a HANG report says is held, and by whom
                _STARVED["t"] = time.monotonic()
                state.facts("engine").set(starved_books={**engine_books(sched), "step": state.facts("engine").data.get("steps", 0)})
            elif time.monotonic() - _STARVED["t"] > 1.0 and counters.SCHEDULED["tokens"] == 0:
                # the scheduler holds requests and this step scheduled none of them: a livelock's
                # books (which requests it passes over, and their counts), at most once a second
                _STARVED["t"] = time.monotonic()
                state.facts("engine").set(stalled_books={**engine_books(sched), "step": state.facts("engine").data.get("steps", 0)})
        except Exception as e:
            state.facts("engine").set(books_error=f"engine: {e}")
        return out
    return step


_STARVED = {"t": 0.0}


def worker_books(runner) -> dict:
    batch = runner.input_batch
    return {"runner_requests": len(runner.requests), "batch_rows": batch.num_reqs,
            "batch_slots": sum(1 for r in batch._req_ids if r is not None),
            "generators": len(batch.generators),
            "host_buffers_held": copy_engine.COPY.held() if copy_engine.COPY else 0}


def _books_worker_execute(orig):
    """After each of the worker's steps (a step with only finished requests removes their rows):
    its batch's books, with its step count."""
    def execute_model(self, *a, **kw):
        try:
            return orig(self, *a, **kw)
        finally:
            try:
                f = state.facts("worker")
                f.add("books_steps")
                f.set(books={**worker_books(self), "step": f.data["books_steps"]})
            except Exception as e:
                state.facts("worker").set(books_error=f"worker: {e}")
    return execute_model


BOOKS = {"books_preempt": _books_preempt, "books_abort": _books_abort, "engine_step": _books_engine_step,
         "engine_step_sync": _books_engine_step, "worker_execute": _books_worker_execute}
