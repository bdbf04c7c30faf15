"""`overlap-harness setup vllm`: install what the vLLM target needs (harness/targets/vllm_setup.py)."""
from __future__ import annotations

from pathlib import Path

from harness.targets.vllm_setup import SetupError, setup_vllm, vllm_home


def cmd_setup(a) -> int:
    from harness.flags import UsageError
    home = Path(a.cache).expanduser() / "vllm" if a.cache else vllm_home()
    try:
        stamp = setup_vllm(home, force=a.force)
    except SetupError as e:
        raise UsageError(f"setup vllm: {e}") from None
    print(f"vllm ready: venv {home / 'venv'} ({stamp['package']}), model {stamp['model_dir']}")
    return 0


def add_commands(sub) -> None:
    s = sub.add_parser("setup", help="install what a real-engine target needs (idempotent)")
    s.add_argument("what", choices=("vllm",), help="the target to set up")
    s.add_argument("--cache", metavar="DIR", help="cache folder (default: $OVERLAP_HARNESS_CACHE or "
                   "~/.cache/overlap-harness)")
    s.add_argument("--force", action="store_true", help="reinstall from scratch")
    s.set_defaults(fn=cmd_setup)
