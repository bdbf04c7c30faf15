"""SGLang as a target: `python -m sglang.launch_server` twice on 127.0.0.1, overlap on (SGLang's
default: `event_loop_overlap`) and off (`--disable-overlap-schedule`), the same model and seed.

Where: on a CUDA GPU as SGLang ships, or on the CPU (no GPU visible): SGLang's CPU backend
(`--device cpu`, SGLANG_USE_CPU_ENGINE=1, the `torch_native` attention backend, float32), in the
venv `overlap-harness setup sglang` makes (harness/targets/sglang/setup.py), with
harness/targets/sglang/cpu_path first on the servers' PYTHONPATH (the CPU kernel operations
SGLang imports, in plain PyTorch: see its README). The agent (harness.agents.sglang.install) is
loaded by SGLang itself in each scheduler subprocess through the `sglang.srt.plugins` entry
point; it holds back the forward and the result copy by a seeded policy (the GPU spun on its
stream; on the CPU the step's own thread, and the result copy moved to a copy thread of the
agent so that it completes after the host moved on, as a GPU's does), injects the SGLang faults,
and reports the effective overlap, which is checked before and after every run:
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
from pathlib import Path

from harness.agents.sglang.points import BARRIER_BLOCK_MS, MAX_STOP_COUNT
from harness.targets.sglang.spec import TARGET_MODEL
from harness.targets.base import TargetError, TargetUnavailable
from harness.targets.served.engine_pair import EnginePair
from harness.targets.served.pair import TOP_LOGPROBS

# provoke by default: half the steps get their forward held back before it reads req_to_token,
# and half the result copies are held back behind the forward (seeded per point)
DEFAULT_DELAYS = {"forward": {"p": 0.5, "ms": 3.0}, "result_copy": {"p": 0.5, "ms": 2.0}}
INSTALL_HINT = "run `overlap-harness setup sglang` (SGLang 0.5.23 in its own venv, on the CPU or a CUDA GPU)"
# the CPU's memory is shared with the other server (and, here, other engineers' servers): a KV pool
# of 4096 tokens, 64 requests at once and 2048 positions a request keep one scheduler near 1 GB
# (SGLang's CPU defaults, 2048 requests of 8192 positions, took 1.5 GB, and the OOM killer). The
# default model's pair runs the path attack's setting instead (harness.targets.sglang.paths: a
# smaller pool, so retraction; chunked prefill), so the gate's pair serves the path table too
CPU_LIMITS = {"--max-total-tokens": "4096", "--max-running-requests": "64", "--context-length": "2048"}
# why a sampled request's tokens cannot be compared across the arms (checked against 0.5.23's source:
# SamplingBatchInfo builds the per-request seeds only when deterministic inference is on, else the
# sampler draws from the process's generator; and --enable-deterministic-inference accepts only the
# attention backends of DETERMINISTIC_ATTENTION_BACKEND_CHOICES, which has no torch_native, the
# CPU's): the suites judge greedy requests and report sampled ones "not exercised" with this line
UNSEEDED = ("SGLang {v} honours sampling_seed only under --enable-deterministic-inference{where}: each arm "
            "samples a sampled request afresh, so its tokens cannot be compared across the arms")
ARITH_ARGS = {"--max-total-tokens": "16384", "--max-running-requests": "64", "--context-length": "512"}
# entry 0 on the CPU: SGLang pads a decode batch only on a captured graph, and its CPU graph runner
# (torch.compile, --enable-torch-compile) captures the sizes given here; one size keeps the compile
# at one graph (63 s cold here, measured), every decode batch of 1-3 rows is padded to 4 (rows on
# entry 0), and larger ones run eagerly as before. Both arms run it (the same kernels on both).
# harness/targets/sglang/cpu_path gives torch_native attention the runner's three hooks.
CPU_GRAPH_BS = (4,)


def sglang_unavailable_reason(python: str, device: str = "cuda") -> str | None:
    """None when `python` has SGLang (and a CUDA device, for device "cuda"), else a one-line reason."""
    code = ("import importlib.util, sys\n"
            "if importlib.util.find_spec('sglang') is None: sys.exit(3)\n"
            "import torch\n"
            f"if {device == 'cuda'} and not torch.cuda.is_available(): sys.exit(4)\n"
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


class SglangTarget(EnginePair):
    name = "sglang"
    health_path = "/health"
    start_timeout = 900.0  # weights, CUDA graph capture and warm-up, twice on one GPU

    def __init__(self, model: str | None = None, faults=frozenset(), python: str | None = None,
                 extra_args=(), delays: dict | None = None, mem_fraction: float = 0.35,
                 deterministic: bool = False, check_env: bool = True, device: str | None = None,
                 home=None, pair: str = "main", cpu_graphs: bool | None = None, config: str | None = None,
                 **kw):
        from harness.targets.sglang import setup as sglang_setup
        from harness.targets.vllm.setup import has_cuda, venv_python
        check_fault_names(faults, ValueError)
        if device not in (None, "cpu", "cuda"):
            raise ValueError(f"unknown SGLang device {device!r}: expected cpu or cuda")
        self.device = device or ("cuda" if has_cuda() else "cpu")
        self.home = home or sglang_setup.sglang_home()
        if python is None and check_env:  # the venv `setup sglang` made, when there is one
            why = sglang_setup.ready(self.home)
            if why and self.device == "cpu":
                raise TargetUnavailable(why)
            python = None if why else str(venv_python(self.home))
        # the default model's pair runs the path attack's setting (harness.targets.sglang.paths)
        self.paths = not model or model == "smollm2"
        self.arith = model == "arith"
        # a drafter's configuration (harness/targets/sglang/spec.py): its flags, its rows, its verdict line
        self.spec = None
        self.multi = None  # a configuration of several ranks (issue 45: tp2), no drafter
        if config not in (None, "default"):
            from harness.targets.sglang import spec as sglang_spec
            if config not in sglang_spec.CONFIGS:
                raise ValueError(f"unknown SGLang server configuration {config!r}; known: {', '.join(sglang_spec.CONFIGS)}")
            c = sglang_spec.CONFIGS[config]
            if c.cpu_refused and self.device == "cpu":
                raise TargetUnavailable(f"SGLang configuration {config} cannot run on a CPU: {c.cpu_refused}")
            extra_args = [*c.args, *extra_args]
            if c.drafter:
                self.spec = c
            else:
                self.multi = c
                if c.model and not model:
                    model, self.paths = c.model, True  # SmolLM2's tokenizer: the path workload runs on it
            if cpu_graphs is None:
                cpu_graphs = False  # see sglang_spec.CONFIGS: the CPU graph runner and a verify pass
        self.config = self.spec  # what stress and its reproducers name (harness.search.served: .config.name)
        # the CPU graph runner (padding, entry 0): the path pair's by default (its relay_entry_0 row)
        self.cpu_graphs = (self.paths and self.device == "cpu") if cpu_graphs is None else cpu_graphs
        if self.paths or self.arith:
            model = str(sglang_setup.model_dir(self.home, "arith" if self.arith else model if model == "split" else None))
            if check_env and not Path(model, "config.json").is_file():
                raise TargetUnavailable(f"no model directory in {model}: run `overlap-harness setup sglang`")
        super().__init__(**kw)
        self.pair = pair
        self.model, self.faults = model, frozenset(faults)
        self.python = python or sys.executable
        self.extra_args = list(extra_args)
        self.delays = DEFAULT_DELAYS if delays is None else delays
        self.mem_fraction, self.deterministic = mem_fraction, deterministic
        self.batch_invariant = deterministic  # SGLang's deterministic mode uses batch-invariant kernels
        if check_env:
            why = sglang_unavailable_reason(self.python, self.device)
            if why:
                raise TargetUnavailable(why)

    @property
    def unseeded_sampling(self) -> str:
        """Why sampled requests cannot be compared across the arms here ("" where they can)."""
        if self.deterministic:
            return ""
        from harness.agents.sglang.points import WRITTEN_AGAINST
        where = (", which has no attention backend for the CPU (torch_native is not among "
                 "DETERMINISTIC_ATTENTION_BACKEND_CHOICES)") if self.device == "cpu" else ", which this pair runs without"
        return UNSEEDED.format(v=WRITTEN_AGAINST, where=where)

    def provoke_plans(self) -> list[dict]:
        """test_provoked_delays' plans in SGLang's own points (agents.sglang.points.DELAY_POINTS): the forward
        held back before it reads req_to_token, the result copy held back past the host's next launch."""
        return [{"result_copy": {"p": 1.0, "ms": 150.0}},
                {"forward": {"p": 0.5, "ms": 20.0}, "result_copy": {"p": 0.5, "ms": 60.0}},
                {"forward": {"p": 1.0, "ms": 5.0}, "result_copy": {"p": 0.3, "ms": 300.0}}]

    # -- what ServedTarget asks of a subclass ------------------------------------------------
    def model_name(self) -> str:
        return self.model

    def patch_catalogue(self) -> dict:
        from harness.agents.sglang.patches import PATCHES
        return PATCHES

    def server_started(self, overlap: bool) -> None:
        self.warm_up(overlap)

    def warm_up(self, overlap: bool) -> None:
        """One request with a repetition penalty before any run: SGLang compiles its penalty kernel
        (torch.compile, a C++ build on the CPU) on first use, which took over 27 s here on a busy
        machine: that first use would otherwise be judged a HANG of whichever run met it first."""
        import httpx
        s = self.servers.get(overlap)
        if s is None:
            return
        body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 2, "temperature": 0.0,
                                                               "repetition_penalty": 1.1}}
        try:
            r = httpx.post(f"http://127.0.0.1:{s.port}/generate", json=body, timeout=600.0)
        except httpx.HTTPError as e:
            raise TargetError(f"sglang (overlap {'on' if overlap else 'off'}): the warm-up request failed: {e}") from None
        if r.status_code != 200:
            raise TargetError(f"sglang (overlap {'on' if overlap else 'off'}): the warm-up request was refused "
                              f"({r.status_code}): {r.text[:200]}")

    def plan_extra(self) -> dict:
        return {"engine": "sglang", "device": self.device}

    def set_plan(self, overlap, delays=None, faults=(), seed=None):
        # the target's faults and default delays stay in force on the overlap-on server
        if overlap and not delays:
            delays = self.delays
        from harness.agents.sglang.points import CATALOGUE, GPU_ONLY
        agent_faults = {f for f in set(faults) | (self.faults if overlap else set()) if f in CATALOGUE}
        if agent_faults and self.device == "cpu":
            raise TargetUnavailable(f"sglang fault {', '.join(sorted(agent_faults))} {GPU_ONLY}")
        super().set_plan(overlap, delays, agent_faults, seed)

    def server_command(self, overlap: bool, port: int) -> list[str]:
        cmd = [self.python, "-m", "sglang.launch_server", "--model-path", self.model,
               "--host", "127.0.0.1", "--port", str(port), "--random-seed", str(self.seed)]
        if self.device == "cpu":
            # the CPU backend without AMX: SGLang's plain PyTorch attention, float32 (as the vLLM
            # target), and a KV pool sized in tokens (a RAM fraction would take half the machine)
            cmd += ["--device", "cpu", "--attention-backend", "torch_native", "--dtype", "float32"]
            for flag, value in self.limits().items():
                if not any(a.startswith(flag) for a in self.extra_args):
                    cmd += [flag, value]
            # the two servers share the cores with each other and the tests: a fully idle scheduler
            # sleeps on its sockets (SGLang's own switch; a request wakes it at once) instead of
            # looping at 100% of a core between requests and while the other server starts
            if "--sleep-on-idle" not in self.extra_args:
                cmd.append("--sleep-on-idle")
            if self.cpu_graphs and "--enable-torch-compile" not in self.extra_args:
                cmd += ["--enable-torch-compile", "--cuda-graph-bs-decode", *map(str, CPU_GRAPH_BS)]
        else:
            if not any(a.startswith("--mem-fraction-static") for a in self.extra_args):
                cmd += ["--mem-fraction-static", str(self.mem_fraction)]  # two servers share one GPU
            if self.paths:  # the path attack's pool and chunk, on a GPU as on the CPU
                for flag, value in self.limits().items():
                    if not any(a.startswith(flag) for a in self.extra_args):
                        cmd += [flag, value]
        if self.deterministic:
            cmd.append("--enable-deterministic-inference")
        if not overlap:
            cmd.append("--disable-overlap-schedule")
        # a drafter that is the served model itself (spec.TARGET_MODEL): the path is known only now
        return cmd + [self.model if a == TARGET_MODEL else a for a in self.extra_args]

    def limits(self) -> dict:
        """The pool and batch flags: the path setting for the default model, room for 64 arith
        questions at once for the GSM8K pair, CPU_LIMITS for a model of the user's."""
        from harness.targets.sglang import paths as sglang_paths
        return sglang_paths.SERVER_ARGS if self.paths else ARITH_ARGS if self.arith else CPU_LIMITS

    def server_env(self, overlap: bool) -> dict:
        from harness.targets.sglang import setup as sglang_setup
        from harness.targets.vllm import setup as setup_cmd
        env = dict(os.environ)
        allowed = env.get("SGLANG_PLUGINS")
        if allowed and "overlap_harness" not in allowed.split(","):
            env["SGLANG_PLUGINS"] = f"{allowed},overlap_harness"  # a user allow-list must not drop the agent
        env.setdefault("HF_HUB_OFFLINE", "1")
        # the agent's code is this checkout's, whichever checkout installed the entry point
        env["PYTHONPATH"] = setup_cmd.agent_pythonpath(env)
        shim = setup_cmd.entry_point_shim(self.workdir / "entry-points")
        env["PYTHONPATH"] = str(shim) + os.pathsep + env["PYTHONPATH"]
        if self.multi is not None:  # its ranks' core binding (issue 45)
            env.update(dict(e.split("=", 1) for e in self.multi.env))
        if self.device == "cpu":
            env = sglang_setup.cpu_env(env)
            # two servers share the machine's cores: no binding; one OpenMP thread each
            env.setdefault("OMP_NUM_THREADS", "1")
            # SGLang runs its write-after-read barrier only on CUDA (streams are no-ops elsewhere); on
            # by this switch of SGLang's own, the CPU runs the GPU's barrier code, whose order the
            # agent's fence model records and judges (harness.agents.sglang.fence)
            env.setdefault("SGLANG_ENABLE_WAR_BARRIER", "1")
        patches = self.patches() if overlap else []
        if patches:  # the overlap-on server runs the patched copy of SGLang; the off server stays stock
            from harness.agents.source_patch import PatchError
            from harness.targets.sglang.patched_copy import ensure_copy
            try:
                env["PYTHONPATH"] = str(ensure_copy(patches, self.home)) + os.pathsep + env["PYTHONPATH"]
            except PatchError as e:
                raise TargetUnavailable(str(e)) from None
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

    def overlap_summary(self) -> str:
        """The overlap line, and with a drafter: which, and what was adapted on the CPU to run it."""
        line = super().overlap_summary()
        if self.spec is None:
            return line
        from harness.targets.sglang import spec as sglang_spec
        line += f"\ndrafter: {self.spec.drafter}"
        if self.device == "cpu":
            line += "\nCPU adaptations: " + "; ".join(sglang_spec.CPU_ADAPTATIONS)
        return line + "".join("\n" + sglang_spec.accept_lengths_line(self._facts_of(ov), "on" if ov else "off")
                               for ov in (True, False))

    def _facts_of(self, overlap: bool) -> list:
        from harness.agents import plan as planmod
        try:
            return planmod.read_facts(str(self.facts_dir(overlap)))
        except OSError:
            return []

    def overlap_verdict(self, facts, before=None):
        """Judged by the host's order of events (harness.agents.host_order), as on vLLM: each
        scheduler's launches (run_batch) and waits on a step's result (process_batch_result) over
        the run; the worst scheduler decides (one LOST is LOST)."""
        from harness.agents import host_order
        scheds = [f for f in facts if f.get("role") == "sglang-scheduler" and "host_order" in f]
        if not scheds:
            return None, ("overlap: not judged (no scheduler reported a host order of events: none ran a step "
                          "in SGLang's overlap loop)")
        from harness.targets.served import ranks
        by = ranks.by_rank(scheds, "sglang-scheduler")
        # every rank's scheduler judged; the worst decides (one LOST is LOST), named (issue 45)
        lab, (effective, why) = ranks.worst([(ranks.label(f), host_order.judge_process(f, before))
                                             for f in by.values()])
        f = next(x for x in by.values() if ranks.label(x) == lab)
        if len(by) > 1:
            why = f"{lab}: {why}"
        b = next((x for x in before or () if x.get("pid") == f.get("pid") and x.get("role") == f.get("role")), {})
        calls, blocked = (f.get(k, 0) - b.get(k, 0) for k in ("war_barrier_calls", "barrier_blocked"))
        evidence = ("evidence: the scheduler's launch/wait order (Scheduler.run_batch, process_batch_result)"
                    + (f", {len(by)} ranks' schedulers judged" if len(by) > 1 else "")
                    + f"; the host blocked in the WAR barrier on {blocked} of {calls} steps (>{BARRIER_BLOCK_MS} ms)"
                    + "; the device's own step times are not recorded, so its idle gap is not judged")
        return effective, host_order.line(effective, why, evidence)

    # -- books at idle: SGLang's own pool checks -------------------------------------------------
    def idle_books(self, overlap: bool, wait_s: float = 20.0) -> dict:
        """One server's books once every scheduler is fully idle again: SGLang checks its KV pool and
        its req_to_token rows itself whenever it is (on_idle); the agent keeps what that check saw
        (rows free of total, every leak it reported). With TP/PP each rank's scheduler has its own
        pool and rows, checked apart (issue 45): "ranks" {rank label: counts} then, and "engine"
        their sums. {"engine": counts} or {"engine": None, "engine_error": why}; kept in self.books."""
        import time
        from harness.agents import plan as planmod
        from harness.targets.served import ranks

        def scheds():
            return ranks.by_rank(planmod.read_facts(str(self.facts_dir(overlap))), "sglang-scheduler")
        start = {r: f.get("books_idle_checks", 0) for r, f in scheds().items()}
        deadline = time.monotonic() + wait_s
        now_ = scheds()
        while (not now_ or any(f.get("books_idle_checks", 0) <= start.get(r, 0) for r, f in now_.items())) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
            now_ = scheds()
        per, late = {}, []
        for r, f in now_.items():
            b = f.get("books")
            if f.get("books_idle_checks", 0) <= start.get(r, 0) or not b:
                late.append(ranks.label(f))
                continue
            per[ranks.label(f)] = {"req_rows_held": b["req_rows_total"] - b["req_rows_free"],
                                   "req_rows_total": b["req_rows_total"], "pool_leaks": f.get("pool_leaks", 0),
                                   "first_leak": f.get("first_leak", "")}
        if late or not per:
            who = f" ({', '.join(late)})" if len(now_) > 1 and late else ""
            now = {"engine": None, "engine_error": f"the scheduler{who} did not go fully idle within {wait_s:.0f} s"}
        else:
            keys = ("req_rows_held", "req_rows_total", "pool_leaks")
            first = next((f"{lab}: {p['first_leak']}" if len(per) > 1 else p["first_leak"]
                          for lab, p in per.items() if p["first_leak"]), "")
            now = {"engine": {k: sum(p[k] for p in per.values()) for k in keys}, "first_leak": first}
            if len(per) > 1:
                now["ranks"] = per
        if not hasattr(self, "books"):
            self.books = {}
        self.books[overlap] = now
        return now

    def books_line(self, books: dict, arm: str) -> str:
        e = books.get("engine")
        if e is None:
            return f"books at idle (overlap {arm}): not read ({books.get('engine_error')})"
        parts = books.get("ranks") or {"": e}
        held = [lab for lab, p in parts.items() if p["req_rows_held"] or p["pool_leaks"]]
        each = "; ".join(f"{lab + ': ' if lab else ''}req_to_token rows {p['req_rows_total'] - p['req_rows_held']} free "
                         f"of {p['req_rows_total']}, {p['pool_leaks']} pool leak(s) reported" for lab, p in parts.items())
        leak = books.get("first_leak") or ""
        tail = ("everything back" if not held else f"NOT BACK ({', '.join(held)}): {leak}" if len(parts) > 1
                else f"NOT BACK: {leak}".strip())
        return f"books at idle (overlap {arm}, SGLang's own idle check): {each}; {tail}"

    # -- requests through /generate ------------------------------------------------------------
    def payload(self, r, overlap: bool) -> dict:
        sp = {"max_new_tokens": r.max_new_tokens, "temperature": r.temperature, "top_p": r.top_p,
              "skip_special_tokens": False}
        if r.seed is not None:
            sp["sampling_seed"] = int(r.seed)
        if r.stop:  # SGLang refuses more than MAX_STOP_COUNT; both arms get the same first ones
            sp["stop"] = list(r.stop)[:MAX_STOP_COUNT]
        if r.repetition_penalty != 1.0:
            sp["repetition_penalty"] = r.repetition_penalty
        extra = dict(getattr(r, "extra", None) or {})  # SGLang's own sampling parameters (regex, penalties...)
        if extra.pop("ignore_eos", False) or getattr(r, "ignore_eos", False):
            sp["ignore_eos"] = True
        sp.update(extra)
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
    from harness.targets.served import ranks
    many = ranks.several(facts, "sglang-scheduler")
    for f in scheds:
        who = f"{ranks.label(f)}'s scheduler (pid {f.get('pid')})" if many else f"scheduler pid {f.get('pid')}"
        if "enable_overlap" in f and f["enable_overlap"] != overlap:
            return "error", (f"sglang: overlap requested {mode} but {who} runs with "
                             f"enable_overlap={f['enable_overlap']}: overlap is not what was asked")
        steps, barriers = f.get("run_batch", 0), f.get("war_barrier_calls", 0)
        if not after_run or steps <= 4:
            continue
        if overlap and barriers == 0:
            return "error", (f"sglang: overlap on, but in {steps} steps {who} never went "
                             "through the overlap loop's WAR barrier: overlap LOST")
        if not overlap and barriers:
            return "error", f"sglang: overlap off, but {who} ran the overlap loop"
        blocked = f.get("barrier_blocked", 0)
        if overlap and barriers and blocked * 2 > barriers:
            return "error", (f"sglang: {who}'s thread blocked in the WAR barrier on {blocked} of {barriers} "
                             f"steps (>{BARRIER_BLOCK_MS} ms): the CPU waits for the GPU, overlap LOST")
    return None


def check_fault_names(names, exc=ValueError) -> None:
    """The agent's faults (agents.sglang.points.CATALOGUE) and the source patches (agents.sglang.patches.PATCHES)."""
    from harness.agents.sglang.patches import PATCHES
    from harness.agents.sglang.points import CATALOGUE
    unknown = sorted(set(names) - set(CATALOGUE) - set(PATCHES))
    if unknown:
        raise exc(f"unknown SGLang fault {', '.join(unknown)}; known: {', '.join([*CATALOGUE, *PATCHES])}")


def make(faults=frozenset(), **kw) -> SglangTarget:
    return SglangTarget(faults=faults, **kw)
