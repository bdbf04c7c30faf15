"""The gate's claims tested without their trigger (issue 44, item 1; the served search's are in
harness.search.served.claims).

A gate row runs its workload once, so a claim is tested where the gate holds the run without
the trigger already, or can make it cheaply:
- an entry whose trigger is a configuration (KnownUpstream.cause.config) is tested on its twin:
  vllm#52461's bare rows (no CLI processor, so vLLM's placeholder repair is off) have twins on the
  main pair (the same entry-point processors, the repair on). The twin must have run its path and
  its processors must have read no placeholder (the entry's evidence counter, 0 there), or the
  claim is refuted and the finding is new, with both runs' counts;
- an entry whose trigger is request fields is tested by the suite that holds the requests (the
  overlap suite on SGLang: the penalised requests sent again without their penalties);
- the rest (controls inside the one workload run, a release's own path) are counted as not
  tested here: stress tests those, case by case.

Each claim's outcome goes on its case's report as the property `claim_test` ("<case>: <id>: held",
"...: refuted", "...: not tested"), which the gate counts (`line`)."""
from __future__ import annotations

from harness.verdict import Finding, code_of

OUTCOMES = ("held", "refuted", "not tested")


def entry_of(kid: str, row: str, known=None):
    from harness.targets.vllm import upstream as vllm_upstream
    return next((k for k in (vllm_upstream.KNOWN_UPSTREAM if known is None else known)
                 if k.id == kid and k.row == row), None)


def on_twin(row: str, new: list, seen: list, twin, known=None, record_property=None) -> tuple[list, list]:
    """(new, seen) after testing each claimed finding of `row` whose entry's trigger is a
    configuration on `twin` (the PathRun of the main pair; None: not there). Counter notes
    (code known.counter) are not claims of a finding: left as they are."""
    from harness.targets.vllm import paths as vp
    kept = []
    for kid, f in seen:
        if code_of(f) == "known.counter":
            kept.append((kid, f))
            continue
        k = entry_of(kid, row, known)
        twin_row = vp.PATHS_BY_NAME.get(row.removesuffix("_bare")) if row.endswith("_bare") else None
        if k is None or k.cause.config != "main" or twin is None or twin_row is None or not k.evidence:
            record(record_property, row, kid, "not tested")
            kept.append((kid, f))
            continue
        ran, reads = vp.row_count(twin_row, twin.counts_on), twin.counts_on.get(k.evidence, 0)
        if ran <= 0:  # the twin did not run its path: nothing said either way
            record(record_property, row, kid, "not tested")
            kept.append((kid, f))
        elif reads > 0:
            record(record_property, row, kid, "refuted")
            new.append(Finding(f"{f} (claimed by known upstream {kid}, but it stays without the entry's trigger: "
                               f"on {twin_row.name}, the main pair with vLLM's repair on, async on: {k.evidence} "
                               f"{reads}; new)", code_of(f), getattr(f, "rid", "")))
        else:
            record(record_property, row, kid, "held")
            kept.append((kid, f))
    return new, kept


def record(record_property, where: str, kid: str, what: str) -> None:
    """One claim's outcome on the case's report (what the gate counts): `where` the case or row."""
    if record_property is not None:
        record_property("claim_test", f"{where}: {kid}: {what}")


def line(records: list[str]) -> str:
    """The gate's line: the claims tested without their trigger, what became of them."""
    if not records:
        return ""
    n = {o: sum(1 for r in records if r.endswith(f": {o}")) for o in OUTCOMES}
    return (f"claims tested without their trigger (issue 44): {n['held'] + n['refuted']} tested, {n['held']} held, "
            f"{n['refuted']} refuted (new); {n['not tested']} not tested here (stress tests those case by case): "
            + ", ".join(records))
