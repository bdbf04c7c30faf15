"""SGLang as a target: `python -m sglang.launch_server` twice on 127.0.0.1, overlap on (SGLang's
default: `event_loop_overlap`) and off (`--disable-overlap-schedule`), the same model and seed.

SGLang runs only on a CUDA GPU (its kernels are CUDA builds; its scheduler does not import on
a CPU torch), so this target is for GPU runners. The agent (harness.agents.sglang_agent) is
loaded by SGLang itself in each scheduler subprocess through the `sglang.srt.plugins` entry
point; it spins the GPU on the forward and copy streams by a seeded policy (on by default on
the overlap-on server, so the black-box suites provoke rather than wait for a race), injects the
SGLang faults, and reports the effective overlap, which is checked before and after every run:
a server that silently ran the normal loop, or whose scheduler thread blocked in the WAR
barrier, fails; it never passes. Overlap itself is judged by the host's order of events, as on
vLLM (harness.agents.host_order): a scheduler that waits on step N's result before it launches
step N+1 is `overlap: LOST`. The hang watchdog is ServedTarget's, fed by the agent's progress
counters.

Requests go to SGLang's native `/generate` with `input_ids`: it returns output token ids and
top-k logprobs keyed by token id, which the tie/race classifier needs (the OpenAI completions
endpoint keys top logprobs by text).
"""
from __future__ import annotations

import os
import subprocess
import sys

from harness.agents.sglang_points import BARRIER_BLOCK_MS
from harness.targets.base import TargetError, TargetUnavailable
from harness.targets.served import TOP_LOGPROBS, ServedTarget

# provoke by default: half the steps get their forward held back before it reads req_to_token,
# and half the result copies are held back behind the forward (seeded per point)
DEFAULT_DELAYS = {"forward": {"p": 0.5, "ms": 3.0}, "result_copy": {"p": 0.5, "ms": 2.0}}
INSTALL_HINT = ("install SGLang 0.5.23 and this harness into one python on a CUDA machine: "
                "`pip install sglang==0.5.23 && pip install -e .` (the agent is found through its entry point)")


def sglang_unavailable_reason(python: str) -> str | None:
    """None when `python` has SGLang and a CUDA device, else a one-line reason."""
    code = ("import importlib.util, sys\n"
            "if importlib.util.find_spec('sglang') is None: sys.exit(3)\n"
            "import torch\n"
            "if not torch.cuda.is_available(): sys.exit(4)\n"
            "from importlib.metadata import entry_points\n"
            "ok = any(e.name == 'overlap_harness' for e in entry_points(group='sglang.srt.plugins'))\n"
            "sys.exit(0 if ok else 5)\n")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run {python}: {e}"
    return {0: None, 3: f"sglang is not installed in {python}: {INSTALL_HINT}",
            4: f"sglang needs a CUDA GPU; {python} sees none",
            5: f"the overlap-harness agent is not registered in {python} (no sglang.srt.plugins entry point): "
               f"{INSTALL_HINT}"}.get(r.returncode, f"{python} cannot check for sglang (exit {r.returncode}): "
                                                  f"{(r.stderr.strip().splitlines() or [''])[-1]}")


class SglangTarget(ServedTarget):
    name = "sglang"
    health_path = "/health"
    start_timeout = 900.0  # weights, CUDA graph capture and warm-up, twice on one GPU

    def __init__(self, model: str | None = None, faults=frozenset(), python: str | None = None,
                 extra_args=(), delays: dict | None = None, mem_fraction: float = 0.35,
                 deterministic: bool = False, check_env: bool = True, **kw):
        super().__init__(**kw)
        from harness.agents.sglang_points import check_names
        check_names(faults, ValueError)
        if not model:
            raise TargetUnavailable("the sglang target needs a model (a local path or a Hugging Face id)")
        self.model, self.faults = model, frozenset(faults)
        self.python = python or sys.executable
        self.extra_args = list(extra_args)
        self.delays = DEFAULT_DELAYS if delays is None else delays
        self.mem_fraction, self.deterministic = mem_fraction, deterministic
        self.batch_invariant = deterministic  # SGLang's deterministic mode uses batch-invariant kernels
        if check_env:
            why = sglang_unavailable_reason(self.python)
            if why:
                raise TargetUnavailable(why)

    # -- what ServedTarget asks of a subclass ------------------------------------------------
    def model_name(self) -> str:
        return self.model

    def tokenizer(self):
        if self._tok is None:
            from harness.engine.smollm2 import HFTokenizer
            self._tok = HFTokenizer.from_dir(self.model)
        return self._tok

    def set_plan(self, overlap, delays=None, faults=(), seed=None):
        # the target's faults and default delays stay in force on the overlap-on server
        if overlap and not delays:
            delays = self.delays
        super().set_plan(overlap, delays, set(faults) | (self.faults if overlap else set()), seed)

    def server_command(self, overlap: bool, port: int) -> list[str]:
        cmd = [self.python, "-m", "sglang.launch_server", "--model-path", self.model,
               "--host", "127.0.0.1", "--port", str(port), "--random-seed", str(self.seed)]
        if not any(a.startswith("--mem-fraction-static") for a in self.extra_args):
            cmd += ["--mem-fraction-static", str(self.mem_fraction)]  # two servers share one GPU
        if self.deterministic:
            cmd.append("--enable-deterministic-inference")
        if not overlap:
            cmd.append("--disable-overlap-schedule")
        return cmd + self.extra_args

    def server_env(self, overlap: bool) -> dict:
        env = dict(os.environ)
        allowed = env.get("SGLANG_PLUGINS")
        if allowed and "overlap_harness" not in allowed.split(","):
            env["SGLANG_PLUGINS"] = f"{allowed},overlap_harness"  # a user allow-list must not drop the agent
        return env

    def check_overlap(self, overlap: bool, facts: list[dict], after_run: bool) -> None:
        verdict = setting_verdict(overlap, facts, after_run)
        if verdict:
            kind, msg = verdict
            raise (TargetUnavailable if kind == "unavailable" else TargetError)(msg)
        if overlap and after_run:
            effective, line = self.overlap_verdict(facts, self.facts_before)
            if effective is False:
                raise TargetError(f"sglang: {line}")

    def overlap_verdict(self, facts, before=None):
        """Judged by the host's order of events (harness.agents.host_order), as on vLLM: each
        scheduler's launches (run_batch) and waits on a step's result (process_batch_result) over
        the run; the worst scheduler decides (one LOST is LOST)."""
        from harness.agents import host_order
        scheds = [f for f in facts if f.get("role") == "sglang-scheduler" and "host_order" in f]
        if not scheds:
            return None, ("overlap: not judged (no scheduler reported a host order of events: none ran a step "
                          "in SGLang's overlap loop)")
        rank = {False: 0, None: 1, True: 2}
        (effective, why), f = min(((host_order.judge_process(f, before), f) for f in scheds),
                                  key=lambda v: rank[v[0][0]])
        b = next((x for x in before or () if x.get("pid") == f.get("pid") and x.get("role") == f.get("role")), {})
        calls, blocked = (f.get(k, 0) - b.get(k, 0) for k in ("war_barrier_calls", "barrier_blocked"))
        evidence = ("evidence: the scheduler's launch/wait order (Scheduler.run_batch, process_batch_result)"
                    + (f", scheduler pid {f.get('pid')} of {len(scheds)}" if len(scheds) > 1 else "")
                    + f"; the host blocked in the WAR barrier on {blocked} of {calls} steps (>{BARRIER_BLOCK_MS} ms)"
                    + "; the device's own step times are not recorded, so its idle gap is not judged")
        return effective, host_order.line(effective, why, evidence)

    # -- requests through /generate ------------------------------------------------------------
    def payload(self, r, overlap: bool) -> dict:
        sp = {"max_new_tokens": r.max_new_tokens, "temperature": r.temperature, "top_p": r.top_p,
              "skip_special_tokens": False}
        if r.seed is not None:
            sp["sampling_seed"] = int(r.seed)
        if r.stop:
            sp["stop"] = list(r.stop)
        if r.repetition_penalty != 1.0:
            sp["repetition_penalty"] = r.repetition_penalty
        if getattr(r, "ignore_eos", False):
            sp["ignore_eos"] = True
        n = max(1, int(getattr(r, "n", 1) or 1))
        ids = list(r.prompt_ids)
        return {"input_ids": ids if n == 1 else [ids] * n, "sampling_params": sp if n == 1 else [sp] * n,
                "return_logprob": True, "top_logprobs_num": TOP_LOGPROBS}

    def request(self, client, base: str, r, body: dict):
        resp = client.post(f"{base}/generate", json=body)
        if resp.status_code != 200:
            raise TargetError(f"sglang: request {r.rid} refused with {resp.status_code}: {resp.text[:300]}")
        outs = resp.json()
        outs = outs if isinstance(outs, list) else [outs]
        return [((r.rid if len(outs) == 1 else f"{r.rid}#{i}"),) + parse_generate(o) for i, o in enumerate(outs)]

    stream_path = "/generate"

    def stream_update(self, event: dict, ids: list, lps: list) -> tuple[list, list]:
        got, _, lp = parse_generate(event)
        # chunks carry either everything so far or only the new tokens
        if got[:len(ids)] == ids and len(got) >= len(ids):
            return got, (lp if len(lp) >= len(lps) else lps + lp)
        return ids + got, lps + lp

def parse_generate(out: dict) -> tuple[list[int], str | None, list]:
    """(output ids, finish reason, [(own logprob, [(token id, logprob)] top-k)]) from one
    `/generate` result: meta_info carries (logprob, token_id, text) triples."""
    meta = out.get("meta_info") or {}
    ids = out.get("output_ids")
    own = meta.get("output_token_logprobs") or []
    if ids is None:
        ids = [int(t[1]) for t in own]
    tops = meta.get("output_top_logprobs") or []
    lps = []
    for i, t in enumerate(own):
        top = tops[i] if i < len(tops) and tops[i] else []
        lps.append((float(t[0]) if t[0] is not None else float("nan"),
                    sorted(((int(x[1]), float(x[0])) for x in top if x[0] is not None), key=lambda x: -x[1])))
    fin = meta.get("finish_reason")
    if isinstance(fin, dict):
        fin = fin.get("type")
    return [int(x) for x in ids], fin, lps


def setting_verdict(overlap: bool, facts: list[dict], after_run: bool) -> tuple[str, str] | None:
    """What the agents' facts say about the effective overlap setting (the loop SGLang runs, the
    WAR barrier's host time); None when it is what was asked. The host order is judged apart
    (SglangTarget.overlap_verdict)."""
    err = [f["error"] for f in facts if f.get("error")]
    if err:
        return "unavailable", f"sglang agent refused to start: {err[0]}"
    scheds = [f for f in facts if f.get("role") == "sglang-scheduler"]
    mode = "on" if overlap else "off"
    if not scheds or not all(f.get("installed") for f in scheds):
        return "error", (f"sglang (overlap {mode}): the agent reported no scheduler; is it installed in the "
                         f"server's python? ({INSTALL_HINT})")
    for f in scheds:
        if "enable_overlap" in f and f["enable_overlap"] != overlap:
            return "error", (f"sglang: overlap requested {mode} but scheduler pid {f.get('pid')} runs with "
                             f"enable_overlap={f['enable_overlap']}: overlap is not what was asked")
        steps, barriers = f.get("run_batch", 0), f.get("war_barrier_calls", 0)
        if not after_run or steps <= 4:
            continue
        if overlap and barriers == 0:
            return "error", (f"sglang: overlap on, but in {steps} steps scheduler pid {f.get('pid')} never went "
                             "through the overlap loop's WAR barrier: overlap LOST")
        if not overlap and barriers:
            return "error", f"sglang: overlap off, but scheduler pid {f.get('pid')} ran the overlap loop"
        blocked = f.get("barrier_blocked", 0)
        if overlap and barriers and blocked * 2 > barriers:
            return "error", (f"sglang: the scheduler thread blocked in the WAR barrier on {blocked} of {barriers} "
                             f"steps (>{BARRIER_BLOCK_MS} ms): the CPU waits for the GPU, overlap LOST")
    return None


def make(faults=frozenset(), **kw) -> SglangTarget:
    return SglangTarget(faults=faults, **kw)
