"""For one row of the gate (or one reproducer), the releases where it changes: the last release
where it passes and the first where it fails (introduced), and the reverse (fixed).

A probe is fn(version) -> "pass" | "fail" | "n/a"; a row's statuses map onto these (KNOWN
UPSTREAM, CRASH, HANG and "not exercised" fail: the release does not pass the row; n/a drops the
release, as `git bisect skip`). The search runs over the installed releases in order, probing
the ends and halving each bracket whose ends differ, so a range of N releases with one change
costs about log2(N) gates; a release probed once is never probed again. A bracket is only as
tight as the releases installed: when releases the index carries lie between its ends, the
result says how many, and which.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.gate import json_report

PASSES, FAILS, NA = "pass", "fail", "n/a"


def outcome(status: str | None) -> str:
    """A row's status -> pass / fail / n/a (a release without the row: n/a)."""
    if status is None or status in (json_report.NA, json_report.SKIPPED):
        return NA
    return PASSES if status == json_report.PASS else FAILS


@dataclass
class Change:
    kind: str  # "introduced" (pass -> fail) or "fixed" (fail -> pass)
    last: str  # the last release probed before the change (passes for introduced)
    first: str  # the first release probed after it
    between: list = field(default_factory=list)  # releases on the index between them, not installed

    def line(self) -> str:
        before, after = ("passes", "fails") if self.kind == "introduced" else ("fails", "passes")
        s = f"{self.kind}: last {before} in {self.last}, first {after} in {self.first}"
        if self.between:
            s += (f" (bracket wider than one release: {len(self.between)} release(s) between them are not "
                  f"installed: {', '.join(self.between)})")
        return s


@dataclass
class BisectResult:
    subject: str
    probed: dict  # version -> pass / fail / n/a, in release order
    changes: list  # [Change]

    def lines(self) -> list[str]:
        out = [f"bisect {self.subject}: probed " + ", ".join(f"{v} {o}" for v, o in self.probed.items())]
        out += [c.line() for c in self.changes]
        usable = [o for o in self.probed.values() if o != NA]
        if not self.changes:
            if not usable:
                out.append("no release has this row (n/a in every release probed)")
            else:
                word = "passes" if usable[0] == PASSES else "fails"
                out.append(f"no change: it {word} in the first and the last release probed (a change and its "
                           "reversal between them is not seen by a bisect; `sweep` every release to be sure)")
        return out


def bisect(versions: list[str], probe, known=None, cache: dict | None = None) -> BisectResult:
    """The changes of probe over `versions` (oldest first). `known`: every release the index
    has, to say what lies uninstalled inside a bracket. `cache`: outcomes already known (a sweep's)."""
    seen: dict[str, str] = dict(cache or {})

    def at(v: str) -> str:
        if v not in seen:
            seen[v] = probe(v)
        return seen[v]
    usable = [v for v in versions]
    while usable and at(usable[0]) == NA:  # the ends first: an n/a end is dropped
        usable.pop(0)
    while len(usable) >= 2 and at(usable[-1]) == NA:
        usable.pop()
    changes: list[Change] = []
    stack = [(usable[0], usable[-1])] if len(usable) >= 2 else []
    while stack:
        lo, hi = stack.pop()
        if at(lo) == at(hi):
            continue  # the same at both ends: a bisect assumes no change in between
        inner = [v for v in usable if _key(lo) < _key(v) < _key(hi) and seen.get(v) != NA]
        mid = next((v for v in _middle_out(inner) if at(v) != NA), None)  # n/a: skipped, as git bisect skip
        if mid is None:
            kind = "introduced" if at(lo) == PASSES else "fixed"
            changes.append(Change(kind, lo, hi, _between(lo, hi, known, versions)))
            continue
        stack += [(mid, hi), (lo, mid)]
    changes.sort(key=lambda c: _key(c.last))
    probed = {v: seen[v] for v in sorted(seen, key=_key) if v in versions}
    return BisectResult("", probed, changes)


def _middle_out(xs: list) -> list:
    """The middle first, then outwards: the next probe when the middle release lacks the row."""
    if not xs:
        return []
    m = len(xs) // 2
    order = [m]
    for d in range(1, len(xs)):
        order += [i for i in (m - d, m + d) if 0 <= i < len(xs)]
    return [xs[i] for i in order]


def _key(v: str):
    from harness.targets.vllm.releases import release_key
    return release_key(v)


def _between(lo: str, hi: str, known, installed) -> list[str]:
    if not known:
        return []
    a, b = _key(lo), _key(hi)
    return [v for v in known if a < _key(v) < b and v not in installed]


def row_probe(gate, row: str, out_dir):
    """A probe from the gate: run it on the release, read the row's status."""
    def probe(version: str) -> str:
        r = gate(version, out_dir)
        if r.verdict == "UNAVAILABLE":
            raise RuntimeError(f"vLLM {version}: the gate could not run: {r.error}")
        return outcome((r.rows.get(row) or {}).get("status"))
    return probe


def outcomes_from(results, row: str) -> dict[str, str]:
    """A sweep's results as a bisect cache for one row."""
    return {r.version: outcome((r.rows.get(row) or {}).get("status")) for r in results if r.verdict != "UNAVAILABLE"}


def reproducer_outcome(results: list[dict]) -> str:
    """A reproducer's run (fixtures/vllm_upstream/reproduce.py's JSON) -> pass / fail: it fails
    where a server died, the two arms' outputs differ, or a counter it names in `fails_when`
    counted (a bug the agent works around), for a reproducer of steps, a request sampled or
    waited in more steps async on than off, (`seed_alone`) a seeded request's text in the batch
    differs from its text sent alone, or a request went unanswered (a hang)."""
    for r in results:
        arms = [r.get("off") or {}, r.get("on") or {}]
        if any(not arm.get("server_alive", True) or arm.get("hang") for arm in arms):
            return FAILS
        texts = [[q.get("text") for q in arm.get("requests", ())] for arm in arms]
        if texts[0] != texts[1]:
            return FAILS
        if any((arm.get("counts") or {}).get(k, 0) > 0 for arm in arms for k in r.get("fails_when", ())):
            return FAILS
        if r.get("seed_alone"):  # a seeded request's tokens in the batch are not its tokens alone
            for arm in arms:
                got = [q.get("text") for q in arm.get("requests", ())]
                if any(a is not None and a != g for a, g in zip(arm.get("alone") or (), got)):
                    return FAILS
        if r.get("check_steps"):  # [copies, scheduled, sampled, waited, preempted] per request key
            off, on = (arm.get("steps") or {} for arm in arms)
            if any(k in off and (v[2] > off[k][2] or v[3] > off[k][3]) for k, v in on.items()):
                return FAILS
    return PASSES
