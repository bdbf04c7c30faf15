"""A source patch: an engine bug re-created as an exact search/replace of the installed engine's
own text (never a switch in our agent), applied in a private linked copy of the package that
only the overlap-on server of a pair imports. The type and its application are one for every
engine; each engine's patches stay beside its agent (harness.agents.vllm.patches,
harness.agents.sglang.patches), which build them through a constructor in their own argument
order. The copy itself is the target's (harness.targets.vllm.patched_copy).

A search text the installed engine no longer has is one clear error (PatchError, one line).
"""
from __future__ import annotations

from dataclasses import dataclass


class PatchError(RuntimeError):
    """A patch does not apply to the installed engine (one line)."""


@dataclass(frozen=True)
class SourcePatch:
    package: str  # the engine's Python package ("vllm", "sglang"): `file` is relative to it
    engine: str  # its name in messages ("vLLM", "SGLang")
    written_against: str  # the release whose text the search strings were copied from
    name: str
    description: str
    suite: str  # the suite that must catch it
    file: str  # relative to the package
    search: str  # exact source text, found exactly once in `file`
    replace: str
    upstream: tuple[str, ...] = ()
    also: tuple[tuple[str, str], ...] = ()  # more (search, replace) edits of the same file
    device_only: str = ""  # non-empty: why the CPU build cannot show the bug (mutants skip it there)
    path: str = ""  # the row of the engine's path table whose workload exercises the bug, if one
    config: str = ""  # non-empty: the server configuration it needs (a drafter's), where its path exists
    # non-empty: why no configuration reaches (or no pair can judge) it on the release written against,
    # read from that release's code; `mutants` lists it with the reason, `check --fault` prints it
    unreachable: str = ""

    @property
    def edits(self) -> tuple[tuple[str, str], ...]:
        return ((self.search, self.replace),) + self.also

    @property
    def point(self) -> str:  # `faults --target X` prints it where an agent fault has its point
        return self.file.rsplit("/", 1)[-1]


def apply(patch: SourcePatch, source: str) -> str:
    """`source` (the text of patch.file) with the patch's edits applied; PatchError when a search
    text is not there exactly once."""
    for search, replace in patch.edits:
        n = source.count(search)
        if n != 1:
            first = search.strip().splitlines()[0].strip()
            why = "not found" if n == 0 else f"found {n} times"
            raise PatchError(f"{patch.engine} patch {patch.name}: the text {first!r} is {why} in "
                             f"{patch.package}/{patch.file} (written against {patch.engine} "
                             f"{patch.written_against})")
        source = source.replace(search, replace)
    return source


def diff(patch: SourcePatch, source: str) -> str:
    """The patch as a unified diff of the installed file (for `faults -v` and reports)."""
    import difflib
    after = apply(patch, source)
    return "".join(difflib.unified_diff(source.splitlines(True), after.splitlines(True),
                                        f"a/{patch.package}/{patch.file}", f"b/{patch.package}/{patch.file}",
                                        n=2))
