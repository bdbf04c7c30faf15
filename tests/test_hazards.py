"""The happens-before hazard detector (harness/hazards): unit tests on the simulated
device with small named buffers, then the engine with and without its fence."""
import json

import pytest
import torch

from harness.workloads import presets as workloads
from harness.device import make_device
from harness.engine.build import build_engine
from harness.engine.config import EngineConfig
from harness.hazards.report import Hazard, format_hazard
from harness.hazards.tracking import AccessTracker

POLICIES = ["serial", "random:0", "random:1", "random:2", "pct:0:3", "pct:1:3", "pct:2:3", "delay:forward:2",
            "delay:copy:3"]


def setup(policy="serial", **kw):
    dev = make_device("sim", policy)
    tr = AccessTracker(dev, **kw)
    dev.tracker = tr
    return dev, tr


def sig(hs):
    return [(h.kind, h.buffer, h.elements, h.first.stream, h.first.op, h.first.op_id, h.first.access,
             h.second.stream, h.second.op, h.second.op_id, h.second.access) for h in hs]


# -- the basic kinds -------------------------------------------------------------------------
def test_war_unordered_across_streams():
    dev, tr = setup()
    buf, out = dev.alloc("buf", (8,)), dev.alloc("out", (8,))
    a, b = dev.stream("a"), dev.stream("b")
    a.launch("reader", lambda: out.copy_(buf))
    b.launch("writer", lambda: buf.fill_(1.0))
    dev.finish()
    hs = tr.hazards
    assert len(hs) == 1
    h = hs[0]
    assert (h.kind, h.buffer, h.elements, h.n_elements) == ("WAR", "buf", "elements 0..7", 8)
    assert (h.first.stream, h.first.op, h.first.access) == ("a", "reader", "read")
    assert (h.second.stream, h.second.op, h.second.access) == ("b", "writer", "write")
    assert h.first.site.startswith("tests/test_hazards.py:")
    assert tr.first_hazard() is h or sig([tr.first_hazard()]) == sig([h])


def test_war_ordered_by_wait_event_is_not_reported():
    dev, tr = setup()
    buf, out = dev.alloc("buf", (8,)), dev.alloc("out", (8,))
    a, b = dev.stream("a"), dev.stream("b")
    a.launch("reader", lambda: out.copy_(buf))
    b.wait_event(a.record("read_done"))
    b.launch("writer", lambda: buf.fill_(1.0))
    dev.finish()
    assert tr.hazards == [] and tr.first_hazard() is None


def test_raw_and_waw():
    dev, tr = setup()
    buf, out = dev.alloc("buf", (8,)), dev.alloc("out", (8,))
    a, b, c = dev.stream("a"), dev.stream("b"), dev.stream("c")
    a.launch("w1", lambda: buf[:4].fill_(1.0))
    b.launch("r", lambda: out.copy_(buf))  # RAW with w1 on 0..3
    c.launch("w2", lambda: buf[2:6].fill_(2.0))  # WAW with w1 on 2..3, WAR with r on 2..5
    dev.finish()
    got = {(h.kind, h.first.op, h.second.op, h.elements) for h in tr.hazards}
    assert got == {("RAW", "w1", "r", "elements 0..3"), ("WAW", "w1", "w2", "elements 2..3"),
                   ("WAR", "r", "w2", "elements 2..5")}


def test_same_stream_is_program_ordered():
    dev, tr = setup()
    buf = dev.alloc("buf", (8,))
    a = dev.stream("a")
    a.launch("w", lambda: buf.fill_(1.0))
    a.launch("rw", lambda: buf.add_(buf))
    dev.finish()
    assert tr.hazards == []


def test_transitive_order_through_a_third_stream():
    dev, tr = setup()
    buf = dev.alloc("buf", (4,))
    a, b, c = dev.stream("a"), dev.stream("b"), dev.stream("c")
    a.launch("w1", lambda: buf.fill_(1.0))
    b.wait_event(a.record())
    b.launch("other", lambda: None)
    c.wait_stream(b)
    c.launch("w2", lambda: buf.fill_(2.0))
    dev.finish()
    assert tr.hazards == []


# -- the host ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sync", [False, True])
def test_host_read_of_pinned_buffer(sync):
    dev, tr = setup()
    d = dev.alloc("out.tokens", (4,), torch.int64)
    h = dev.pinned("host.tokens", (4,), torch.int64)
    s, c = dev.stream("forward"), dev.stream("copy")
    s.launch("sample", lambda: d.fill_(7))
    c.wait_stream(s)
    done = c.copy_to_host("tokens.d2h", d, h)
    if sync:
        done.synchronize()
    dev.host_access("host.tokens", h[:3])
    dev.finish()
    hs = tr.hazards
    if sync:
        assert hs == []
    else:
        assert len(hs) == 1
        assert (hs[0].kind, hs[0].buffer, hs[0].elements) == ("RAW", "host.tokens", "elements 0..2")
        assert (hs[0].first.stream, hs[0].first.op) == ("copy", "tokens.d2h")
        assert (hs[0].second.stream, hs[0].second.access, hs[0].second.op_id) == ("host", "read", None)


def test_host_write_then_device_read_is_ordered_by_issue():
    dev, tr = setup()
    h = dev.pinned("inputs", (4,))
    d = dev.alloc("dev.inputs", (4,))
    dev.host_access("inputs", h, write=True)
    dev.stream("a").launch("h2d", lambda: d.copy_(h))
    dev.finish()
    assert tr.hazards == []


# -- views and memory reuse ------------------------------------------------------------------------
@pytest.mark.parametrize("prefilter", [True, False])
def test_overlapping_views(prefilter):
    dev, tr = setup(prefilter=prefilter)
    buf, out = dev.alloc("buf", (8,)), dev.alloc("out", (4,))
    a, b = dev.stream("a"), dev.stream("b")
    a.launch("w", lambda: buf[2:6].fill_(1.0))
    b.launch("r", lambda: out.copy_(buf[4:8]))
    dev.finish()
    hs = tr.hazards
    assert [(h.kind, h.elements, h.n_elements) for h in hs] == [("RAW", "elements 4..5", 2)]


def test_disjoint_views_are_not_a_hazard():
    dev, tr = setup()
    buf, m, out = dev.alloc("buf", (8,)), dev.alloc("m", (4, 4)), dev.alloc("out", (4, 2))
    a, b = dev.stream("a"), dev.stream("b")
    a.launch("w", lambda: (buf[0:4].fill_(1.0), m[:, 0:2].fill_(1.0)))
    b.launch("r", lambda: (buf[4:8].sum(), out.copy_(m[:, 2:4])))
    dev.finish()
    assert tr.hazards == []


def test_strided_column_views_overlap():
    dev, tr = setup()
    m, out = dev.alloc("m", (4, 4)), dev.alloc("out", (4, 2))
    a, b = dev.stream("a"), dev.stream("b")
    a.launch("w", lambda: m[:, 0:2].fill_(1.0))
    b.launch("r", lambda: out.copy_(m[:, 1:3]))
    dev.finish()
    assert [(h.kind, h.elements, h.rows) for h in tr.hazards] == [("RAW", "rows 0..3 cols 1", [0, 1, 2, 3])]


def test_freed_and_reused_row():
    """Row 3 read for request A on the forward stream; the CPU frees it and the schedule
    stream rewrites it for request B with nothing ordering the write after the read."""
    dev, tr = setup()
    table = dev.alloc("req_to_token", (4, 16), torch.int64)
    kvidx = dev.alloc("fwd.kv_indices", (2, 16), torch.int64)
    fwd, sched = dev.stream("forward"), dev.stream("schedule")
    sched.launch("req_to_token.write", lambda: table[3, :6].copy_(torch.arange(6)))
    fwd.wait_stream(sched)
    fwd.launch("attn_metadata", lambda: kvidx[0, :6].copy_(table[3, :6]), meta={"rows": {3: "A"}})
    # A finishes, row 3 goes to B: no fence
    sched.launch("req_to_token.write", lambda: table[3, :6].copy_(torch.arange(100, 106)),
                 meta={"rows": {3: "B"}})
    dev.finish()
    hs = tr.hazards
    assert len(hs) == 1
    h = hs[0]
    assert (h.kind, h.buffer, h.elements, h.rows) == ("WAR", "req_to_token", "rows 3 positions 0..5", [3])
    assert h.first.requests == {3: "A"} and h.second.requests == {3: "B"}
    text = format_hazard(h)
    assert "WAR" in text and "rows 3 positions 0..5" in text and "row 3: A" in text and "row 3: B" in text


def test_freed_and_reused_row_behind_a_fence():
    dev, tr = setup()
    table = dev.alloc("req_to_token", (4, 16), torch.int64)
    kvidx = dev.alloc("fwd.kv_indices", (2, 16), torch.int64)
    fwd, sched = dev.stream("forward"), dev.stream("schedule")
    fwd.launch("attn_metadata", lambda: kvidx[0, :6].copy_(table[3, :6]), meta={"rows": {3: "A"}})
    sched.wait_event(fwd.record("shared_read_done"))
    sched.launch("req_to_token.write", lambda: table[3, :6].copy_(torch.arange(100, 106)))
    dev.finish()
    assert tr.hazards == []


# -- indexing ops ---------------------------------------------------------------------------------
@pytest.mark.parametrize("overlap", [False, True])
def test_index_copy_and_gather_on_kv_slots(overlap):
    dev, tr = setup()
    kv = dev.alloc("kv[0].k", (16, 2, 4))
    src = torch.ones(3, 2, 4)
    a, b = dev.stream("forward"), dev.stream("other")
    w_idx = torch.tensor([1, 5, 9])
    r_idx = torch.tensor([[9, 10], [11, 12]]) if overlap else torch.tensor([[2, 3], [4, 6]])
    a.launch("kv.write", lambda: kv.index_copy_(0, w_idx, src))
    b.launch("kv.read", lambda: kv[r_idx].sum())
    dev.finish()
    hs = tr.hazards
    if overlap:
        assert [(h.kind, h.elements, h.rows) for h in hs] == [("RAW", "slots 9", [9])]
    else:
        assert hs == []


def test_index_select_and_index_copy_on_entries():
    dev, tr = setup()
    relay = dev.alloc("relay.tokens", (8,), torch.int64)
    out = dev.alloc("ids", (2,), torch.int64)
    a, b = dev.stream("forward"), dev.stream("other")
    a.launch("publish", lambda: relay.index_copy_(0, torch.tensor([1, 2]), torch.tensor([5, 6])))
    b.launch("read", lambda: torch.index_select(relay, 0, torch.tensor([3, 2]), out=out))
    dev.finish()
    assert [(h.kind, h.elements) for h in tr.hazards] == [("RAW", "entries 2")]


def test_index_put_rows_of_a_2d_table():
    dev, tr = setup()
    t = dev.alloc("req_to_token", (4, 8), torch.int64)
    a, b = dev.stream("a"), dev.stream("b")
    a.launch("put", lambda: t.index_put_((torch.tensor([1, 2]),), torch.tensor(7)))
    b.launch("read", lambda: t[2:4, 0:3].sum())
    dev.finish()
    assert [(h.kind, h.elements) for h in tr.hazards] == [("RAW", "rows 2 positions 0..2")]


def test_ignored_prefix():
    dev, tr = setup(ignore=("fwd.",))
    buf, out = dev.alloc("fwd.scratch", (8,)), dev.alloc("out", (8,))
    a, b = dev.stream("a"), dev.stream("b")
    a.launch("reader", lambda: out.copy_(buf))
    b.launch("writer", lambda: buf.fill_(1.0))
    dev.finish()
    assert tr.hazards == []


def test_buffers_allocated_after_attaching_are_tracked_and_reset_forgets():
    dev, tr = setup()
    a, b = dev.stream("a"), dev.stream("b")
    buf = dev.alloc("late", (4,))
    a.launch("w", lambda: buf.fill_(1.0))
    b.launch("w", lambda: buf.fill_(2.0))
    dev.finish()
    assert [h.kind for h in tr.hazards] == ["WAW"]
    tr.reset()
    assert tr.hazards == []
    b.launch("w", lambda: buf.fill_(3.0))  # b's new write vs a's old one: a's state was forgotten
    dev.finish()
    assert tr.hazards == []


# -- host stalls --------------------------------------------------------------------------------
@pytest.mark.parametrize("host_knows", [False, True])
def test_host_stall_on_a_stream_chained_behind_the_forward(host_knows):
    dev, tr = setup()
    fwd, sched = dev.stream("forward"), dev.stream("schedule")
    fwd.launch("forward", lambda: None, cost=3.0)
    fence = fwd.record("shared_read_done")
    sched.wait_event(fence)
    if host_knows:
        fence.synchronize()
    sched.launch("write", lambda: None)
    sched.synchronize()
    dev.finish()
    hs = tr.hazards
    assert len(tr.blocking_calls) == 1
    if host_knows:
        assert hs == []
    else:
        assert [(h.kind, h.buffer, h.first.stream, h.first.op, h.second.op) for h in hs] == [
            ("host-stall", "schedule", "forward", "shared_read_done", "schedule.synchronize")]
        assert "host-stall" in format_hazard(hs[0])


# -- program order, not timing ----------------------------------------------------------------------
def _program(policy):
    """Three streams, partial ordering, views, index ops and a host read; some races, some not."""
    dev, tr = setup(policy)
    tr.ran = []
    executing = tr.executing
    tr.executing = lambda rec: (tr.ran.append(rec.id), executing(rec))[1]
    table = dev.alloc("req_to_token", (4, 8), torch.int64)
    kv = dev.alloc("kv[0].k", (16, 2, 2))
    h = dev.pinned("host.tokens", (4,), torch.int64)
    out = dev.alloc("out.tokens", (4,), torch.int64)
    scratch = dev.alloc("fwd.kv_indices", (2, 8), torch.int64)
    s, f, c = dev.stream("schedule"), dev.stream("forward"), dev.stream("copy")
    for step in range(3):
        dev.set_step(step)
        s.launch("req_to_token.write", lambda st=step: table[st % 4, :4].copy_(torch.arange(4) + st))
        f.wait_stream(s)
        f.launch("attn_metadata", lambda st=step: scratch[0, :4].copy_(table[(st + 1) % 4, :4]),
                 meta={"rows": {(step + 1) % 4: f"r{step}"}})
        f.launch("forward", lambda st=step: kv.index_copy_(0, torch.tensor([st, st + 4]), torch.ones(2, 2, 2)),
                 cost=2.0)
        f.launch("sample", lambda st=step: out.fill_(st))
        if step != 1:
            c.wait_stream(f)
        done = c.copy_to_host("tokens.d2h", out, h)
        if step == 0:
            s.wait_stream(f)
        c.launch("kv.peek", lambda: kv[torch.tensor([0, 5])].sum())
        if step != 2:
            done.synchronize()
        dev.host_access("host.tokens", h)
    dev.finish()
    return tr


def test_detection_is_identical_under_every_policy():
    serial = _program("serial")
    ref = sig(serial.hazards)
    kinds = {k for k, *_ in ref}
    assert {"WAR", "RAW"} <= kinds, ref
    orders = {tuple(serial.ran)}
    for pol in POLICIES[1:]:
        tr = _program(pol)
        orders.add(tuple(tr.ran))
        assert sig(tr.hazards) == ref, pol
    assert len(orders) > 2, "the policies should have run the ops in different orders"


def test_report_round_trips_to_json():
    tr = _program("serial")
    hs = tr.hazards
    assert hs
    for h in hs:
        assert isinstance(h, Hazard)
        d = json.loads(json.dumps(h.to_dict()))
        assert d["kind"] == h.kind and d["first"]["op"] == h.first.op
        assert len(format_hazard(h).splitlines()) >= 3
    assert "hazard" in tr.report()


# -- the engine ------------------------------------------------------------------------------------
def run_engine(faults=(), policy="serial", workload="row_reuse", prefilter=True, log=(), **kw):
    cfg = EngineConfig(overlap=True, max_running=3, policy=policy, faults=frozenset(faults), **kw)
    eng, tok = build_engine(cfg)
    tr = AccessTracker(eng.dev, prefilter=prefilter, log=log)
    eng.dev.tracker = tr
    reqs = workloads.row_reuse(tok, 16) if workload == "row_reuse" else workloads.mixed(tok, 10)
    eng.run(reqs)
    return eng, tr


@pytest.mark.parametrize("policy,workload,kw", [
    ("serial", "row_reuse", {}),
    ("pct:1:3", "row_reuse", {}),
    ("serial", "mixed", {"pool_slots": 200, "page_size": 2}),
])
def test_correct_engine_has_no_hazards(policy, workload, kw):
    eng, tr = run_engine(policy=policy, workload=workload, **kw)
    assert eng.steps > 10
    tracked = {b.name for b in tr._by_storage.values()}
    assert {"req_to_token", "relay.tokens", "kv[0].k", "batch[0].rows"} <= tracked
    assert tr.hazards == [], tr.report()


def _reused_rows(eng, h):
    """Rows of a hazard whose next reader (after the write) belongs to another request."""
    out = []
    for r, rid in h.first.requests.items():
        later = [o for o in eng.dev.ops if o.id > h.second.op_id and o.name == "attn_metadata"
                 and r in o.meta.get("rows", {})]
        if later and later[0].meta["rows"][r] != rid:
            out.append(r)
    return out


def test_missing_fence_is_a_war_on_the_slot_table_under_serial():
    eng, tr = run_engine(faults={"no_fence"})
    hs = tr.hazards
    assert hs, "no_fence must be reported even though the serial policy corrupts nothing"
    h = tr.first_hazard()
    assert (h.kind, h.buffer) == ("WAR", "req_to_token")
    assert (h.first.stream, h.first.op, h.second.stream, h.second.op) == (
        "forward", "attn_metadata", "schedule", "req_to_token.write")
    assert h.first.requests and h.first.step <= 2
    assert {(x.kind, x.buffer) for x in hs} == {("WAR", "req_to_token")}
    # a freed row handed to another request and rewritten is among them
    reuse = [x for x in hs if _reused_rows(eng, x)]
    assert reuse, tr.report()


def test_missing_fence_first_hazard_is_the_same_under_other_policies():
    ref = sig([run_engine(faults={"no_fence"})[1].first_hazard()])
    for pol in ["random:1", "pct:2:3", "delay:forward:5"]:
        assert sig([run_engine(faults={"no_fence"}, policy=pol)[1].first_hazard()]) == ref, pol


def _accesses(tr):
    return [(x.op_id, x.thread, x.buffer, x.write, x.units,
             [p.tolist() if isinstance(p, torch.Tensor) else (p.start, p.stop) for p in x.parts]) for x in tr.log]


@pytest.mark.parametrize("workload,kw", [("row_reuse", {}), ("mixed", {"pool_slots": 200, "page_size": 2})])
def test_prefilter_does_not_change_what_is_found(workload, kw):
    """The pre-filter and its fast paths (which record the commonest calls without the dispatch
    mode) see every access the dispatch mode alone sees, unit for unit and call for call."""
    a = run_engine(faults={"no_fence"}, workload=workload, log=("",), **kw)[1]
    b = run_engine(faults={"no_fence"}, workload=workload, log=("",), prefilter=False, **kw)[1]
    assert sig(a.hazards) == sig(b.hazards) and a.hazards
    assert _accesses(a) == _accesses(b) and a.log


def test_blocking_copy_is_a_host_stall():
    eng, tr = run_engine(faults={"blocking_copy"})
    kinds = {(h.kind, h.buffer) for h in tr.hazards}
    assert kinds == {("host-stall", "schedule")}
