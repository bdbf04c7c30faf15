"""A known-upstream entry as data (harness.targets.vllm.upstream keeps the catalogue and the
classification; SGLang's catalogue, harness.targets.sglang.upstream, uses the same shape): what it
claims and by which evidence (KnownUpstream), what sets it off as parts a case can lose (Trigger,
issue 44), and its range of releases, read from the release table's facts (live_as).
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.targets.vllm import releases as vllm_releases
from harness.targets.vllm.releases import release_key

NEVER: tuple = ()  # `codes` of an entry that claims no finding (its counter says it reproduced)
# the server controls of a served case (harness.search.served.case.CONTROLS) that reach vLLM's
# reset_prefix_cache(reset_running_requests=True), which drops every running request's in-flight
# step: /reset_prefix_cache itself, and each /pause mode (EngineCore._finish_pause clears the caches)
RESET_CONTROLS = ("reset", "pause", "pause_wait", "pause_abort")


@dataclass(frozen=True)
class Trigger:
    """What sets a known bug off, as parts a case can lose (as the shrinker removes things): before
    a finding is filed under the entry, the case runs again without them, and the finding must go
    away; one that stays is new (issue 44: a claim must explain the whole finding). Empty: nothing
    a case can lose (a release's or the CPU build's own path): the claim is counted as not tested."""
    controls: tuple = ()  # server controls removed from the case
    # (request field, neutral value) set on every request: an attribute of the request, or a body
    # key (`Request.extra`), removed where the neutral value is None
    fields: tuple = ()
    # a server configuration (harness.targets.vllm.configs, or a pair: "main") where the bug cannot
    # happen: the same requests there are its run without the trigger (the gate's twin rows)
    config: str = ""

    def __bool__(self) -> bool:
        return bool(self.controls or self.fields or self.config)

    def strip(self, r) -> bool:
        """Set this trigger's fields of request `r` (a copy: this changes it) to their neutral values;
        True when that changed something. A field the request has as an attribute is set; any other
        is a body key of `r.extra`, removed (neutral None) or set."""
        changed = False
        extra = getattr(r, "extra", None)
        for k, neutral in self.fields:
            if k != "extra" and hasattr(r, k) and not (extra and k in extra):
                if getattr(r, k) != neutral:
                    setattr(r, k, neutral)
                    changed = True
            elif extra and k in extra:
                if neutral is None:
                    del extra[k]
                elif extra[k] == neutral:
                    continue
                else:
                    extra[k] = neutral
                changed = True
        return changed

    def describe(self) -> str:
        parts = ([f"controls {'/'.join(self.controls)} removed"] if self.controls else []) + [
            f"{k} {'removed' if v is None else f'= {v}'}" for k, v in self.fields] + (
            [f"run in configuration {self.config}"] if self.config else [])
        return ", ".join(parts) or "no removable trigger"
ANY = ("*",)  # `codes` of an entry that claims every finding of its row (its evidence says it is this bug)


@dataclass(frozen=True)
class KnownUpstream:
    """A divergence of unmodified vLLM (async on vs off) with its reproducer."""
    id: str
    row: str
    what: str
    upstream: str  # the upstream issue, or "" when none is filed
    reproducer: str  # fixtures/vllm_upstream/<file>
    # the finding codes it claims (harness.verdict.Finding.code: "divergence", "steps.past_cap", ...),
    # each only with its evidence below; NEVER: none, ANY: every finding of its row
    codes: tuple = ANY
    # a regex on the engine's own exception line, which a crash's or an error's finding quotes: its
    # traceback names the failing operation, which is the mechanism (engine_exception entries)
    exception: str = ""
    rid_prefix: str = ""  # only findings about requests whose id starts so (the workload's names for them)
    counter: str = ""  # a bug the agent works around: it reproduced when this counter is > 0
    introduced: str = ""  # the first vLLM release it is live in ("": from the first with async scheduling)
    fixed: str = ""  # the first release without it ("": still open)
    evidence: str = ""  # a counter that must be > 0 (both arms summed) for the entry to claim a finding
    # a mechanism the agent counts per request (agents/vllm/steps.py `evidence`) that must be > 0 for
    # the request a finding names, async on, for the entry to claim it (issue 36): a finding that
    # only looks like this bug is new
    request_evidence: str = ""
    # True: the entry claims only a crash's or an error's finding whose engine exception line matches
    # `exception`
    engine_exception: bool = False
    # False: no finding says nothing of vLLM (the row shows the bug only when a value-reading
    # processor is installed), so it is never reported as "no longer reproduces"
    report_gone: bool = True
    # a regex on the engine's exception line when the bug kills the async-on engine: such a CRASH
    # says "CRASH (KNOWN UPSTREAM <id>)" in the release range (known_crash); it stays a CRASH
    crash_on: str = ""
    # the model runner whose code holds the bug ("v1": V1's GPUModelRunner / InputBatch; "": code
    # both runners share, the scheduler's): on the other runner the entry neither claims a finding
    # nor is said to be gone (V2 has no generator to rewind and no placeholder to repair)
    runner: str = ""
    # a crash_on entry's trigger, ((request field, its neutral value), ...): once this bug killed
    # the async-on engine in a run, the pair sends the fields that set it off no more (issue 36,
    # item 6: one death proves it; sending it again would only kill the engine again)
    trigger: tuple = ()
    # a crash_on entry no request field sets off: the server configurations (vllm_configs names,
    # combined) whose servers never reach it; after its death the pair starts again in them
    avoid: tuple = ()
    # what sets it off, removable from a case: a claimed finding must go away without it (issue 44)
    cause: Trigger = Trigger()

    def live_in(self, version: str | None) -> bool:
        """Inside its range of releases the entry is KNOWN UPSTREAM; outside it the same failure is new.
        `None` (the release is not known) counts as inside."""
        if version is None:
            return True
        v = release_key(version)
        return (not self.introduced or v >= release_key(self.introduced)) and (not self.fixed or v < release_key(self.fixed))


def live_as(fact: str) -> dict:
    """An entry's range is the release fact it is read from (each wheel's source): one datum, not two."""
    f = vllm_releases.FACTS[fact]
    return {"introduced": f.since, "fixed": f.until}
