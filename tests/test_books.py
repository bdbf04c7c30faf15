"""The books oracle (harness.oracles.books) on books shaped as the vLLM agent writes them: quiet on
an idle engine that has everything back (however many prefix blocks stay cached), loud on each
count that is not back, naming who holds it. Against a real vLLM: tests/test_vllm.py (stock vLLM
passes; each leak patch of harness.agents.vllm.patches is caught)."""
import pytest

from harness.oracles import books

ENGINE_BACK = {"blocks_total": 27, "blocks_free": 27, "blocks_in_use": 0, "blocks_held_by_no_request": 0,
               "blocks_unaccounted": 0, "blocks_cached_evictable": 9, "deferred_free_blocks": 0, "requests": 0,
               "running": 0, "waiting": 0, "kv_holding_waiting": 0, "deferred_waiting": 0, "finished_ids": 0,
               "inflight_prefills": 0, "kv_requests": 0, "placeholders": 0, "stale_outputs": 0, "held": [],
               "orphans": [], "step": 812, "seq": 3}
WORKER_BACK = {"runner_requests": 0, "batch_rows": 0, "batch_slots": 0, "generators": 0, "host_buffers_held": 0,
               "step": 640}


def _books(**engine):
    worker = {k: engine.pop(k) for k in list(engine) if k in WORKER_BACK}
    return {"engine": {**ENGINE_BACK, **engine}, "worker": {**WORKER_BACK, **worker}}


def test_everything_back_is_quiet_and_cached_prefixes_are_timing():
    on, off = _books(blocks_cached_evictable=3), _books(blocks_cached_evictable=11)
    assert books.findings(on, off) == [] and books.compare(on, off) == []
    assert books.line(on, "on").endswith("everything back")
    assert "27 free of 27 (3 cached, evictable)" in books.line(on, "on")


@pytest.mark.parametrize("key", sorted(books.HELD))
def test_each_count_not_back_is_a_finding(key):
    on = _books(**{key: 2})
    found = books.findings(on, _books())
    assert found and found[0].startswith(f"async on: 2 {books.HELD[key]} at idle (the other arm: 0)"), found
    assert books.compare(on, _books()) and "NOT BACK" in books.line(on, "on")
    assert books.findings(_books(), on)[0].startswith("async off: 2 ")  # the off arm is held to it too


def test_a_block_held_by_no_request_names_its_last_holder():
    on = _books(blocks_in_use=1, blocks_free=26, blocks_held_by_no_request=1,
                orphans=[{"block": 17, "last_holder": "cmpl-p3-0", "event": "preempted with a step in flight"}])
    found = books.findings(on, _books())
    assert any("block 17: last held by request cmpl-p3-0 (preempted with a step in flight)" in f for f in found), found


def test_a_request_left_in_the_scheduler_is_named_with_its_state():
    held = [{"rid": "cmpl-ab0-0", "status": "FINISHED_ABORTED", "placeholders": 1, "stale_outputs": 0, "blocks": 1,
             "released": ["aborted", True]}]
    on = _books(requests=1, kv_requests=1, blocks_in_use=1, blocks_free=26, placeholders=1, held=held)
    f = books.findings(on, _books())[0]
    assert "request cmpl-ab0-0: FINISHED_ABORTED, aborted with a step in flight, 1 block(s)" in f, f


def test_on_beyond_off_where_both_hold_some():
    assert books.compare(_books(requests=3), _books(requests=1))[0].startswith(
        "async on holds 3 requests still in the scheduler's map at idle where async off holds 1")
    assert books.compare(_books(requests=1), _books(requests=3)) == []


def test_books_never_read_are_a_finding_not_a_pass():
    no_idle = {"engine": None, "worker": WORKER_BACK,
               "engine_error": "the engine core did not go idle within 3 s of the run's end"}
    found = books.findings(no_idle, _books())
    assert found == ["async on: no engine books at idle: the engine core did not go idle within 3 s of the run's end"]
