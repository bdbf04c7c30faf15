"""A target that is a pair of real OpenAI-compatible servers we start ourselves: one with
overlap (async scheduling) on, one with it off, the same model and seed.

What every such target shares lives here: the agent's plan file, logs kept for the report, a
workload sent as concurrent requests whose token ids and top-k logprobs come back for the
equivalence oracles, and the progress watchdog that ends a run making no progress as a HANG and
names a dead server as a CRASH. The processes themselves (ports, the health wait, stopping them
on every exit path) are harness.targets.served.process; reading their logs is
harness.targets.served.log. A subclass says how to start its engine and how to prove the
effective overlap setting.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import stopping
from harness.agents import plan as planmod
from harness.targets.base import Run, Target, TargetCrash, TargetError, TargetHang
from harness.targets.served import openai_wire
from harness.targets.served.openai_wire import TOP_LOGPROBS
from harness.targets.served.openai_wire import error_message as _error_message
from harness.targets.served.openai_wire import ids_and_logprobs as _ids_and_logprobs
from harness.targets.served.openai_wire import stream_error
from harness.targets.served.log import engine_traceback, exception_line, process_raised
from harness.targets.served.process import ServerProcess, free_port, install_sigterm_handler, stop_each

ARRIVAL_MS = 30  # a Request's `arrival` (in engine steps) becomes a send delay of this many ms
MAX_STOP = 4  # OpenAI's limit, which vLLM enforces; both runs of a pair send the same ones


# The progress watchdog (issue 17, item 2). The agent's progress counter (tokens the engine
# delivered) is polled rather than streaming every request: it costs one read of a few small
# files per poll instead of parsing an event per token in 32 client threads that share the CPU
# with the servers, and the request path (and its logprob records) stays as it is.
HANG_STEPS = 50  # no token within this many median token periods ...
HANG_FLOOR_S = 10.0  # ... but never less (a long prefill, a loaded machine) ...
HANG_CAP_S = 60.0  # ... nor more; and this when no period was measured yet
WATCH_POLL_S = 0.5
# After a CRASH or HANG the next run starts the pair again (issue 36: one death must not blind
# the rest of the gate). The same death (its exception line, or HANG) this many times on a pair
# and it is not started again: a release that dies on every case would otherwise spend a
# restart (most of a minute for vLLM) per case; later runs then fail at once, saying so.
SAME_DEATH_RESTARTS = 3
SETTLE_S = 1.0  # after a run, how long its last counts may take to reach the facts folder


def _log_size(server) -> int:
    """How many bytes a server's log holds now (0 without a server or a log)."""
    try:
        return server.log_path.stat().st_size if server is not None else 0
    except OSError:
        return 0


def hang_bound(period_s: float | None) -> float:
    """How long a run may go without a new token before it is a HANG."""
    if not period_s:
        return HANG_CAP_S
    return min(HANG_CAP_S, max(HANG_FLOOR_S, HANG_STEPS * period_s))


def progress_of(facts: list[dict]) -> tuple[int | None, float | None, int]:
    """(tokens delivered, median token period in s, engine steps) from an agent's facts; tokens
    None when no process reports a counter (no watchdog then: nothing to judge progress by)."""
    counts = [int(f["tokens_out"]) for f in facts if isinstance(f.get("tokens_out"), int)]
    periods = [float(f["token_period_ms"]) / 1000 for f in facts if f.get("token_period_ms")]
    steps = sum(int(f.get("steps", 0)) for f in facts if "tokens_out" in f)
    return (sum(counts) if counts else None), (max(periods) if periods else None), steps


def _events(resp):
    """The data events of a server-sent-events response, parsed, up to `[DONE]`."""
    import json
    for line in resp.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


class ServedTarget(Target):
    """A pair of servers, started lazily on first use and kept for the process's life (every
    suite of a `check` reuses them); `close()` or exit stops them."""

    white_box = False
    batch_invariant = False
    agent_env = planmod.ENV
    health_path = "/health"
    start_timeout = 300.0
    # False: the agent does not keep overlap on where the engine would turn it off by itself
    # (what a user's engine without our agent does): the overlap check must then fail
    keep_overlap = True

    def __init__(self, workdir: str | None = None, concurrency: int = 32, seed: int = 0,
                 out_dir: str | None = None):
        # a work folder of our own (plans, facts, server logs) is temporary: removed when the target
        # closes or the process exits (the keeper removes it when we are killed); what a report
        # points to is kept in `out_dir` first (keep()). A folder the caller gave stays.
        self.owns_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"oh-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.out_dir = Path(out_dir) if out_dir else None
        if self.owns_workdir:
            atexit.register(self.cleanup)
        self.concurrency = concurrency
        self.seed = seed
        self.servers: dict[bool, ServerProcess] = {}
        self.plans: dict[bool, dict] = {}
        self._tok = None
        self.hung: dict[bool, str] = {}  # a server the watchdog stopped: later runs on it fail at once
        self.hangs: list[dict] = []  # every HANG of this target: {"line", "report"} for the gate
        self._watched_from = 0  # the server log's size when the watchdog began: a HANG names a traceback past it
        self.crashed: dict[bool, str] = {}  # a server that died under a run: later runs say so at once
        self.crashes: list[dict] = []  # every CRASH: {"line", "traceback", "log"} for the gate
        self.deaths: dict[str, int] = {}  # each death's cause -> how often (the restart limit)
        self.given_up = ""  # the death after which the pair is not started again
        self.restarts = 0  # pair restarts after a death
        self._sent = 0
        self.facts_before: list[dict] = []  # the agent's facts as the last run began
        self.surface: dict = {}  # rid -> the response's other fields (text, usage, ...), until its run returns
        self.left_out: dict = {}  # rid -> (known id, fields left out of it, the case its death was seen in)

    # A live known bug that killed the async-on engine (known_crash) and has a request trigger
    # (KnownUpstream.trigger): its id -> (the case it died in, the trigger). Every pair of the
    # process (the bare one too) then sends requests without those fields, both arms, so the rows
    # go on being judged (issue 36, item 6); the rows that set them say KNOWN UPSTREAM.
    proven_crashes: dict = {}

    # -- what a subclass says ----------------------------------------------------------
    def server_command(self, overlap: bool, port: int) -> list[str]:
        raise NotImplementedError

    def server_env(self, overlap: bool) -> dict:
        return dict(os.environ)

    def plan_extra(self) -> dict:
        """More for the agent's plan (vLLM: the release it runs in)."""
        return {}

    def model_name(self) -> str:
        raise NotImplementedError

    def check_overlap(self, overlap: bool, facts: list[dict], after_run: bool) -> None:
        """Raise TargetError when the effective overlap setting is not `overlap`."""

    def overlap_verdict(self, facts: list[dict], before: list[dict] | None = None) -> tuple[bool | None, str]:
        """(effective, "overlap: ..." line) of the overlap-on server over the run between the
        facts `before` and `facts` (before None: since the server started). None: not judged."""
        return None, "overlap: not judged (this target's agent reports no host order of events)"

    def overlap_summary(self) -> str:
        """The overlap line of the gate's report: the overlap-on server since it started."""
        if True in self.hung:
            return f"overlap: not judged (the async server hung: {self.hung[True]})"
        return self.overlap_verdict(planmod.read_facts(str(self.facts_dir(True))))[1]

    # -- the servers ----------------------------------------------------------------------
    def facts_dir(self, overlap: bool) -> Path:
        return self.workdir / ("facts-on" if overlap else "facts-off")

    def plan_path(self, overlap: bool) -> Path:
        return self.workdir / ("plan-on.json" if overlap else "plan-off.json")

    def set_plan(self, overlap: bool, delays: dict | None = None, faults=(), seed: int | None = None) -> None:
        """Hand the agent of one server a new plan; it picks it up within 50 ms."""
        data = {"overlap": overlap and self.keep_overlap, "seed": self.seed if seed is None else seed,
                "delays": delays or {}, "faults": sorted(faults), "facts_dir": str(self.facts_dir(overlap)),
                **self.plan_extra()}
        self.plans[overlap] = data
        planmod.write_plan(str(self.plan_path(overlap)), data)

    def start(self, which=(False, True)) -> None:
        """Start both servers (at once: each takes most of a minute here) and check each one's
        effective overlap setting."""
        install_sigterm_handler()
        pending = [o for o in which if o not in self.servers]
        if pending:  # after SIGTERM or Ctrl-C nothing starts again: the run ends instead
            stopping.refuse_start(f"the {self.name} server pair")
        for overlap in pending:
            self.facts_dir(overlap).mkdir(parents=True, exist_ok=True)
            for old in self.facts_dir(overlap).iterdir():  # a restarted server's facts replace the last one's
                if old.suffix in (".json", ".txt"):
                    old.unlink(missing_ok=True)
            if overlap not in self.plans:
                self.set_plan(overlap)
            port = free_port()
            env = self.server_env(overlap)
            if self.agent_env:  # None: no agent in this server (a benchmark's baseline)
                env[self.agent_env] = str(self.plan_path(overlap))
            log = self.workdir / f"server-{'on' if overlap else 'off'}.log"
            s = ServerProcess(f"{self.name} server (overlap {'on' if overlap else 'off'})",
                              self.server_command(overlap, port), env, log,
                              cwd=self.workdir,  # not the checkout: a stale egg-info there hides entry points
                              orphan_dir=self.workdir if self.owns_workdir else None)
            s.port = port
            self.servers[overlap] = s
        try:
            for overlap in pending:
                s = self.servers[overlap]
                s.wait_healthy(f"http://127.0.0.1:{s.port}{self.health_path}", self.start_timeout)
                self.check_overlap(overlap, planmod.read_facts(str(self.facts_dir(overlap))), after_run=False)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        stop_each(self.servers.values())
        self.servers.clear()

    def keep(self, path: Path) -> Path:
        """Where a file a report points to (a HANG's report, a CRASH's log) outlives the run: a copy
        in out_dir/<work folder's name>/; without an out_dir the work folder itself is kept."""
        import shutil
        if self.out_dir is None:
            self.owns_workdir = False  # nowhere else to keep it: the work folder stays, said by the path
            return Path(path)
        dest = self.out_dir / self.workdir.name
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(path, dest / Path(path).name))

    def cleanup(self) -> None:
        """Stop the servers and remove the work folder if it is our own temporary one (at exit:
        every live server of the process is asked at once, so the pairs' shutdowns overlap)."""
        import shutil

        from harness.targets.served import process as server_process
        server_process.stop_all(grace=10.0)
        self.close()
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def url(self, overlap: bool) -> str:
        if overlap not in self.servers:
            self.start()
        return f"http://127.0.0.1:{self.servers[overlap].port}"

    def logs(self) -> dict[str, str]:
        return {("on" if o else "off"): str(s.log_path) for o, s in self.servers.items()}

    # -- a workload ---------------------------------------------------------------------
    def payload(self, r, overlap: bool) -> dict:
        body = {"model": self.model_name(), "prompt": list(r.prompt_ids), "max_tokens": r.max_new_tokens,
                "temperature": r.temperature, "top_p": r.top_p, "logprobs": TOP_LOGPROBS,
                "return_tokens_as_token_ids": True, "skip_special_tokens": False}
        if r.seed is not None:
            body["seed"] = int(r.seed)
        elif r.temperature > 0:  # a real server samples an unseeded request afresh on every run;
            # the ref engine derives its seed from the engine's, so do the same here
            body["seed"] = (zlib.crc32(r.rid.encode()) ^ self.seed) & 0x7FFFFFFF
        if r.stop:
            body["stop"] = list(r.stop)[:MAX_STOP]
        if r.repetition_penalty != 1.0:
            body["repetition_penalty"] = r.repetition_penalty
        if getattr(r, "ignore_eos", False):
            body["ignore_eos"] = True
        n = getattr(r, "n", 1)
        if n and n > 1:
            body["n"] = n
        body.update(getattr(r, "extra", None) or {})  # engine fields a workload asks for (vllm_paths)
        return body

    # the ref engine's switches a served target takes per run, and those fixed when its servers start
    RUN_SWITCHES = ()
    FIXED_SWITCHES = ("max_running", "pool_slots", "page_size", "prefix_cache")
    _said: set = set()

    def served_switches(self, kw: dict) -> int:
        """The client concurrency for a run given the ref engine's switches. Those fixed when the
        servers start (running requests: --max-num-seqs; the KV pool, its page size, prefix
        caching) are not changed per run (a restart costs most of a minute): said once on stderr,
        with what the servers use. Any other switch is refused. (Capping the client at
        max_running instead serializes the generated workloads: `check` took far longer.)"""
        unknown = sorted(set(kw) - set(self.RUN_SWITCHES) - set(self.FIXED_SWITCHES))
        if unknown:
            raise TargetError(f"{self.name}: engine switch(es) {', '.join(unknown)} have no meaning on a served "
                              f"target (it takes {', '.join(self.RUN_SWITCHES + self.FIXED_SWITCHES)})")
        fixed = tuple(sorted(k for k in kw if k in self.FIXED_SWITCHES))
        if fixed and fixed not in ServedTarget._said:
            ServedTarget._said.add(fixed)
            print(f"{self.name}: {', '.join(f'{k}={kw[k]}' for k in fixed)} not applied per run: the servers keep "
                  f"{self.fixed_setting()}", file=sys.stderr)
        return self.concurrency

    def fixed_setting(self) -> str:
        """What the servers use for the switches fixed at start (a subclass says)."""
        return "the setting they were started with"

    def _send(self, client, base: str, r, overlap: bool, t0: float):
        wait = t0 + r.arrival * ARRIVAL_MS / 1000.0 - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        from harness.targets.served import chat_turns
        body = self.leave_out(r.rid, self.payload(r, overlap))
        kw = {"headers": h} if (h := chat_turns.client_headers(body)) else {}  # X-Request-Id (vLLM only)
        self._sent += 1  # a new request is progress for the watchdog: it may take a step to answer
        if body.get("chat"):  # a conversation: its turns one after another (harness.targets.served.chat_turns)
            return chat_turns.send_conversation(self, client, base, r, body, h)
        if r.abort_after is not None:
            return self._send_aborted(client, base, r, body, **kw)
        if body.get("stream"):
            return self._send_streamed(client, base, r, body, **kw)
        return self.request(client, base, r, body, **kw)

    def request(self, client, base: str, r, body: dict, headers: dict | None = None) -> list[tuple]:
        """One request on the engine's own API: [(rid, token ids, finish reason, logprob records)],
        one tuple per returned choice. This: OpenAI completions with ids as "token_id:N"."""
        resp = client.post(f"{base}/v1/completions", json=body, headers=headers)
        if resp.status_code >= 500:  # the engine failed this request: an outcome to compare, not ours
            return [(r.rid, [], f"server error {resp.status_code}: {_error_message(resp)}", [])]
        if resp.status_code != 200:
            raise TargetError(f"{self.name}: request {r.rid} refused with {resp.status_code}: {_error_message(resp)}")
        out = []
        data = resp.json()
        if (err := stream_error(data)) is not None or "choices" not in data:
            # older releases answer a dead engine's requests 200 with an error object: the same
            # outcome as a 5xx, so the run's health check names the crash (not a KeyError)
            return [(r.rid, [], err or f"server error 200 without choices: {resp.text[:200]}", [])]
        for c in sorted(data["choices"], key=lambda c: c["index"]):
            ids, lps = _ids_and_logprobs(c.get("logprobs") or {})
            rid = r.rid if len(data["choices"]) == 1 else f"{r.rid}#{c['index']}"
            out.append((rid, ids, c.get("finish_reason"), lps))
            # what else comes back, for the request-surface oracle (harness.oracles.surface)
            self.surface[rid] = {"text": c.get("text"), "stop_reason": c.get("stop_reason"),
                                 "prompt_logprobs": c.get("prompt_logprobs"), "usage": data.get("usage"),
                                 "request": r.rid, "choices": len(data["choices"]), "id": data.get("id"),
                                 "skip_special_tokens": body.get("skip_special_tokens", True)}
        return out

    stream_path = "/v1/completions"

    def stream_update(self, event: dict, ids: list, lps: list) -> tuple[list, list]:
        """The ids and records received so far, after one streamed event of `stream_path`."""
        for c in event.get("choices", []):
            i, lp = _ids_and_logprobs(c.get("logprobs") or {})
            ids, lps = ids + i, lps + lp
        return ids, lps

    def _send_aborted(self, client, base, r, body, headers: dict | None = None):
        """A client that disconnects after `abort_after` tokens: what the server does on a drop.
        Its documented result is its first `abort_after` tokens."""
        body = {**body, "stream": True}
        ids, lps = [], []
        with client.stream("POST", f"{base}{self.stream_path}", json=body, headers=headers) as resp:
            if resp.status_code != 200:  # the server's reason, for the summary's refusals
                resp.read()
                raise TargetError(f"{self.name}: request {r.rid} refused with {resp.status_code}: "
                                  f"{_error_message(resp)}")
            for event in _events(resp):
                failed = stream_error(event)
                if failed:
                    return [(r.rid, ids, failed, lps)]
                ids, lps = self.stream_update(event, ids, lps)
                if len(ids) >= r.abort_after:
                    break  # leaving the block closes the connection: the server aborts the request
        k = r.abort_after
        return [(r.rid, ids[:k], "abort" if len(ids) >= k else "stop", lps[:k])]

    def _send_streamed(self, client, base, r, body, headers: dict | None = None):
        """A client that reads the whole stream, usage included (`stream_options.include_usage`:
        a last chunk with no choice): its ids, finish and stop reason and text summed over the
        chunks, for the token oracles and the request-surface oracle as a plain response's."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        ids, lps, text, finish, stop_reason, usage, sid = [], [], "", None, None, None, None
        with client.stream("POST", f"{base}{self.stream_path}", json=body, headers=headers) as resp:
            if resp.status_code != 200:
                resp.read()
                what = f"{resp.status_code}: {_error_message(resp)}"
                if resp.status_code >= 500:
                    return [(r.rid, [], f"server error {what}", [])]
                raise TargetError(f"{self.name}: request {r.rid} refused with {what}")
            for event in _events(resp):
                failed = stream_error(event)
                if failed:  # a failure after the first chunks: said as a 5xx answer's is, with what came
                    return [(r.rid, ids, failed, lps)]
                ids, lps = self.stream_update(event, ids, lps)
                for c in event.get("choices") or []:
                    text += c.get("text") or ""
                    if c.get("finish_reason"):
                        finish, stop_reason = c["finish_reason"], c.get("stop_reason")
                usage, sid = event.get("usage") or usage, sid or event.get("id")
        self.surface[r.rid] = {"text": text, "stop_reason": stop_reason, "prompt_logprobs": None,
                               "usage": usage, "request": r.rid, "choices": 1, "streamed": True, "id": sid,
                               "skip_special_tokens": body.get("skip_special_tokens", True)}
        return [(r.rid, ids, finish, lps)]

    # -- the progress watchdog ------------------------------------------------------------
    def watch(self, futs, overlap: bool) -> None:
        """Return when every request is answered; raise TargetHang (after dumping the server's
        stacks and stopping it, which ends the requests) when no request is sent or answered and
        the engine delivers no token for hang_bound(its median token period). Without a progress
        counter from the agent there is nothing to judge by: the requests' own timeout stands."""
        from concurrent.futures import wait
        tokens, period, steps = progress_of(planmod.read_facts(str(self.facts_dir(overlap))))
        last = (tokens, self._sent, 0)
        since, steps_then = time.monotonic(), steps
        self._watched_from = _log_size(self.servers.get(overlap))  # a HANG names a traceback past here
        while True:
            done, pending = wait(futs, timeout=WATCH_POLL_S)
            if not pending:
                return
            self._check_alive(overlap)
            tokens, p, steps = progress_of(planmod.read_facts(str(self.facts_dir(overlap))))
            period = p or period
            now_state = (tokens, self._sent, len(done))
            if now_state != last or tokens is None:
                last, since, steps_then = now_state, time.monotonic(), steps
                continue
            stalled, bound = time.monotonic() - since, hang_bound(period)
            if stalled > bound:
                self._hang(overlap, stalled, bound, period, len(pending), steps - steps_then)

    def hang_notes(self, overlap: bool, facts: list[dict]) -> list[str]:
        """Lines a HANG report opens with besides its line (a subclass: what the engine still holds)."""
        return []

    def stacks(self, overlap: bool, wait_s: float = 3.0) -> dict[int, str]:
        """Every thread's stack of each process of one server whose agent registered for it
        (faulthandler on SIGUSR1, facts_dir/stacks-<pid>.txt): {pid: text}."""
        s = self.servers.get(overlap)
        d = self.facts_dir(overlap)
        pids = []
        for f in d.glob("stacks-*.txt"):
            try:
                pid = int(f.stem.split("-", 1)[1])
                if s is not None and os.getpgid(pid) == s.proc.pid:  # one of this server's, alive
                    os.kill(pid, signal.SIGUSR1)
                    pids.append(pid)
            except (ValueError, ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + wait_s
        out, done = {}, set()
        while pids and time.monotonic() < deadline:
            for pid in pids:
                text = (d / f"stacks-{pid}.txt").read_text(errors="replace")
                # a dump is whole once its current thread (written last) is there and the file
                # stopped growing: on a busy machine the handler can be read mid-write (a stack
                # cut after "line 1555 in ", seen in CI)
                if "Current thread" in text and out.get(pid) == text:
                    done.add(pid)
                if text.strip():
                    out[pid] = text
            if len(done) == len(pids):
                break
            time.sleep(0.2)
        return out

    def _hang(self, overlap: bool, stalled: float, bound: float, period, pending: int, steps: int):
        import json
        if stopping.requested():  # the stall is our own stop: no HANG finding
            raise KeyboardInterrupt(f"{self.name}: the server was stopped ({stopping.stopped_word()})")
        mode = "on" if overlap else "off"
        how = (f"{HANG_STEPS} x median token period {period:.3f} s, at least {HANG_FLOOR_S:.0f} s, at most "
               f"{HANG_CAP_S:.0f} s" if period else f"no token period measured yet: the cap, {HANG_CAP_S:.0f} s")
        kind = (f"the engine kept stepping ({steps} steps, no token: a livelock)" if steps else
                "the engine made no step (blocked)")
        line = (f"HANG: {self.name} (overlap {mode}): no new token for {stalled:.1f} s with {pending} request(s) "
                f"outstanding (bound {bound:.1f} s: {how}); {kind}")
        s = self.servers.get(overlap)
        raised = process_raised(s.log_path, self._watched_from) if s is not None else ""
        if raised:  # a rank whose reply nobody reads (vLLM's executor waits on the output rank's only)
            line += f"; a process of the server raised while it stalled: {raised}"
        stacks = self.stacks(overlap)
        facts = planmod.read_facts(str(self.facts_dir(overlap)))
        report = self.workdir / f"hang-{mode}-{len(self.hangs) + 1}.txt"
        notes = self.hang_notes(overlap, facts)
        parts = [line, "", *notes, "", "the agent's last facts:", json.dumps(facts, indent=1), ""]
        for pid, text in sorted(stacks.items()):
            parts += [f"stacks of process {pid}:", text, ""]
        if not stacks:
            parts.append("no stacks: no process of the server answered SIGUSR1")
        report.write_text("\n".join(parts))
        self.servers.pop(overlap, None)
        if s is not None:
            s.stop(grace=3.0)  # ends the abandoned requests: their connections close
            self.keep(s.log_path)  # the server's log beside the report
        report = self.keep(report)
        self.hung[overlap] = line
        self._died(f"HANG ({'livelock' if steps else 'blocked'})")
        self.hangs.append({"line": line, "report": str(report), "stacks": len(stacks), "notes": notes,
                           "case": _current_case()})
        raise TargetHang(f"{line}; stacks of {len(stacks)} process(es) and the agent's facts in {report}")

    def _check_alive(self, overlap: bool, wait_s: float = 0.0) -> None:
        """Raise TargetCrash when the server of this arm has exited under a run (waiting up to
        `wait_s` for it to finish exiting: a cut connection comes before the exit code), or, with
        a `wait_s`, when it still runs but its health check fails: an engine that died behind a
        live API server (vLLM's answers 500 to every request then)."""
        s = self.servers.get(overlap)
        if s is None:
            return
        deadline = time.monotonic() + wait_s
        while s.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        how = None
        if s.proc.poll() is not None:
            how = f"exited with code {s.proc.returncode}"
        elif wait_s:
            code = self._health(s)
            if not isinstance(code, int):  # no answer at all: it is going down; its exit code says more
                end = time.monotonic() + 10.0
                while s.proc.poll() is None and time.monotonic() < end:
                    time.sleep(0.1)
            if s.proc.poll() is not None:
                how = f"exited with code {s.proc.returncode}"
            elif code != 200:
                how = f"has a dead engine (its API server answers {self.health_path} with {code})"
        if how is None:
            return
        if stopping.requested():  # we stopped it (SIGTERM, Ctrl-C): no finding, the run ends
            raise KeyboardInterrupt(f"{self.name}: the server was stopped ({stopping.stopped_word()})")
        mode = "on" if overlap else "off"
        case = _current_case()
        tb = engine_traceback(s.log_path)
        last = exception_line(tb)
        known = self.known_crash(overlap, last)
        if known and any(self.crash_remedy(known)):
            ServedTarget.proven_crashes.setdefault(known, (case, self.crash_remedy(known)[0]))
        tag = f" (KNOWN UPSTREAM {known})" if known else ""
        line = f"CRASH{tag}: {self.name} (overlap {mode}) {how} while {case} ran: {last[:200]}"
        self.servers.pop(overlap, None)
        s.stop(grace=1.0)
        self.crashed[overlap] = line
        self._died(last or how)
        log = self.keep(s.log_path)  # the report points to it: it outlives the temporary work folder
        self.crashes.append({"line": line, "traceback": tb, "log": str(log), "case": case, "known": known,
                             "exit_code": s.proc.returncode})
        raise TargetCrash(f"{line} (log {log})")

    def _died(self, cause: str) -> None:
        self.deaths[cause] = self.deaths.get(cause, 0) + 1
        if self.deaths[cause] >= SAME_DEATH_RESTARTS and not self.given_up:
            self.given_up = (f"the same death {self.deaths[cause]} times ({cause[:160]}): the pair is not "
                             f"started again")

    def restart_after_death(self) -> None:
        """After a CRASH or HANG (each already one finding, with its case): both servers start
        again, the surviving arm too, so the pair stays comparable (the same fresh engines, the
        same warm-up), and the run goes on with the next case. Not after SAME_DEATH_RESTARTS of
        the same death, nor once a restart failed: then the run fails at once, saying why."""
        lost = {**self.crashed, **self.hung}
        if not lost:
            return
        why = next(iter(lost.values()))
        if self.given_up:
            raise (TargetHang if self.hung else TargetCrash)(f"the server is gone: {why} ({self.given_up})")
        print(f"{self.name}: restarting both servers after: {why[:200]}", file=sys.stderr, flush=True)
        self.close()
        self.hung.clear()
        self.crashed.clear()
        try:
            self.start()
        except TargetUnavailable as e:
            self.given_up = f"it could not start again: {str(e)[:200]}"
            self.crashed.update({o: why for o in lost})
            raise TargetCrash(f"the server is gone: {why} ({self.given_up})") from None
        self.restarts += 1

    upstream = None  # the engine's known-upstream catalogue (known_crash, crash_remedy by release), if any

    def crash_remedy(self, known: str) -> tuple[tuple, tuple]:
        """For the known crash `known`: ((request field, neutral value), ...) that set it off, and
        the server configurations that never reach it (harness.targets.vllm.upstream.crash_remedy)."""
        return self.upstream.crash_remedy(known, getattr(self, "version", None)) if self.upstream else ((), ())

    def leave_out(self, rid: str, body: dict) -> dict:
        """`body` without the trigger of each known crash this process already saw (proven_crashes)."""
        for kid, (case, _) in ServedTarget.proven_crashes.items():
            trig = self.crash_remedy(kid)[0]  # (): not live in this pair's release
            gone = tuple(f for f, neutral in trig if f in body and body[f] != neutral)
            if gone:
                for f in gone:
                    body.pop(f)
                self.left_out[rid] = (kid, gone, case)
        return body

    def known_crash(self, overlap: bool, exception: str) -> str:
        """The id of a known upstream bug, live in the target's release, whose engine death this
        is (its exception line), or "": the CRASH stays a CRASH and says which bug it is."""
        return self.upstream.known_crash(exception, overlap, getattr(self, "version", None)) if self.upstream else ""

    def _health(self, s: "ServerProcess"):
        import httpx
        try:
            return httpx.get(f"http://127.0.0.1:{s.port}{self.health_path}", timeout=5.0).status_code
        except httpx.HTTPError as e:
            return type(e).__name__

    def settled_facts(self, overlap: bool, received: int) -> list[dict]:
        """The agent's facts once its token counter accounts for the `received` tokens of the run
        (the engine delivers at least as many as the client got): the last reply can reach us
        before the agent's flusher wrote the step that made it (within 0.1 s). At most SETTLE_S;
        at once when the agent keeps no counter."""
        start, _, _ = progress_of(self.facts_before)
        deadline = time.monotonic() + SETTLE_S
        while True:
            facts = planmod.read_facts(str(self.facts_dir(overlap)))
            now, _, _ = progress_of(facts)
            if now is None or now - (start or 0) >= received or time.monotonic() > deadline:
                return facts
            time.sleep(0.02)

    def revive(self) -> None:
        """Forget hung servers (a new fault set: the next run starts them again)."""
        self.hung.clear()

    def run(self, reqs, *, overlap: bool = True, policy: str = "serial", seed: int = 0, track: bool = False,
            on_step=None, delays: dict | None = None, faults=None, **engine_kw) -> Run:
        """Send the workload to one server as concurrent requests. `delays` / `faults` (agent
        plan) apply to this run. The ref engine's switches (`engine_kw`) go through
        `served_switches`: fixed at start (said once) or refused with one line."""
        import httpx
        if self.hung or self.crashed:  # a death in an earlier run: the pair starts again (or says why not)
            self.restart_after_death()
        limit = self.served_switches(engine_kw)
        base = self.url(overlap)
        if delays is not None or faults is not None:
            self.set_plan(overlap, delays=delays, faults=faults or (), seed=seed)
            time.sleep(0.1)  # the agent re-reads its plan at most every 50 ms
        self.facts_before = planmod.read_facts(str(self.facts_dir(overlap)))
        # this run's responses only: a run that raised (a refused request) left its requests' fields
        # here, and a later request of the same rid answered without them (a server error) took
        # them (the first 20-minute stress: "usage.prompt_tokens 72, the prompt has 5 tokens")
        self.surface = {}
        t0 = time.monotonic()
        try:
            with openai_wire.client(httpx.Timeout(600.0, connect=10.0), self.concurrency) as client:
                pool = ThreadPoolExecutor(max_workers=min(limit, max(1, len(reqs))))
                try:
                    futs = [pool.submit(self._send, client, base, r, overlap, t0) for r in reqs]
                    self.watch(futs, overlap)
                    try:
                        results = [x for f in futs for x in f.result()]
                    except httpx.HTTPError:  # a refused or cut connection: did the server die?
                        self._check_alive(overlap, wait_s=5.0)
                        raise
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if delays is not None or faults is not None:
                # back to the plain plan for whatever runs next; after a HANG too: the server
                # started again for the next case reads this plan, and a per-run fault left in it
                # (spin_no_progress) would hang that case as well
                self.set_plan(overlap)
        # an engine that died answers 500 until its API server exits: that is a CRASH of this run
        self._check_alive(overlap, wait_s=5.0 if any(str(fin).startswith("server error")
                                                     for _, _, fin, _ in results) else 0.0)
        facts = self.settled_facts(overlap, sum(len(ids) for _, ids, _, _ in results))
        self.check_overlap(overlap, facts, after_run=True)
        run = Run([(rid, ids, fin) for rid, ids, fin, _ in results],
                  summary={"target": self.name, "overlap": overlap, "seconds": time.monotonic() - t0,
                           "facts": facts, "facts_before": self.facts_before, "logs": self.logs()})
        run.logprobs = {rid: lps for rid, _, _, lps in results}
        run.surface = {rid: self.surface.pop(rid) for rid, _, _, _ in results if rid in self.surface}
        return run


def _current_case() -> str:
    """The suite case running now (pytest's own note), for a death's finding."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0] or "outside the suites"
