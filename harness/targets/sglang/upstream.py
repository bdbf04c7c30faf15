"""Divergences of unmodified SGLang (overlap on vs off) that the project found, as
harness.targets.vllm.upstream keeps vLLM's: each with the row that shows it, the upstream report
(or the search that found none), its reproducer in fixtures/sglang_upstream/, and the mechanism the
agent counts per request, without which it claims no finding (a divergence that only looks like it
is new). The gate reports a claimed finding as KNOWN UPSTREAM, never as a pass.
"""
from __future__ import annotations

from harness.agents.vllm.steps import request_key
from harness.targets.vllm.upstream import KnownUpstream, Trigger, matches
from harness.verdict import Finding

# the agent's count (agents.sglang: point penalty_cumulate), per request and only for a request with a
# penalty that reads token ids: the orchestrator takes in a token for every request of a penalised
# batch, and a divergence of a plain request batched with a penalised one is not this bug (issue 44)
PENALTY_STALE = "penalty_stale_tokens"

KNOWN: list[KnownUpstream] = [
    # read in 0.5.23's source: ScheduleBatch.prepare_for_decode calls cumulate_penalty_output_tokens,
    # which takes req.output_ids[-1] (origin_input_ids[-1] before any output) as the newest token; the
    # overlap loop prepares step N+1 before it processes step N's result, so that token is step N-1's
    KnownUpstream(
        "sglang-penalty-one-step-old", "penalties",
        "SGLang's overlap loop: before each decode step the penalties that read token ids (repetition, "
        "frequency, presence; min_new_tokens counts tokens only) take in each request's newest token as req.output_ids[-1], but the previous "
        "step's result is not processed yet, so they take the token of the step before it (at the first "
        "decode step: the last prompt token); penalised greedy requests diverge, overlap on vs off",
        "the mechanism is upstream for custom logit processors (sgl-project/sglang#8056, open: they read "
        "req.output_ids one step old in the overlap loop; sgl-project/sglang#20026 works around it in "
        "one processor); none found for the built-in penalties (searched sgl-project/sglang's issues and "
        "pull requests; sgl-project/sglang#22049 feeds the spec-v2 path's penalties the same way)",
        "fixtures/sglang_upstream/penalty_one_step_old.json",
        codes=("divergence",), request_evidence=PENALTY_STALE,
        cause=Trigger(fields=(("repetition_penalty", 1.0), ("frequency_penalty", None), ("presence_penalty", None)))),
    # read in 0.5.23's source: ngram_worker._prepare_draft_tokens splices the relay's accepted tokens
    # whenever the overlap is on and the batch needs no grammar sync; the relay row of a request keeps
    # its last step's tokens until its next step writes it, so when that result was processed before
    # the draft (another batch ran between the request's two steps) they are in output_ids already
    KnownUpstream(
        "sglang-ngram-context-twice", "spec_draft_context",
        "SGLang's NGRAM drafter, overlap on: before each decode step it appends the previous step's accepted "
        "tokens, read from the relay (FutureMap), to the request's tokens, assuming that step's result is "
        "not processed yet; when another batch (a prefill of newer requests) ran between the request's two "
        "steps, the result was processed and the tokens are already there: the drafter looks up and inserts "
        "into its trie a context with that run twice (drafts worse; the verified tokens stay right)",
        "none found (searched sgl-project/sglang's issues and pull requests: the splice came with "
        "sgl-project/sglang#17260, NGRAM on spec v2; #32353 and #35207 keep the per-batch splice condition; "
        "sgl-project/sglang#22332, open, reworks NGRAM's drafts); the report, ready to file: "
        "docs/results/2026-12-07-sglang-ngram-context-twice.md",
        "fixtures/sglang_upstream/ngram_context_twice.json",
        codes=("spec_context_twice",), evidence="spec_context_twice",
        cause=Trigger(config="default")),  # no drafter, no drafts to look up: SGLang without one
]


def stale_by_request(facts: list[dict], before: list[dict] | None = None) -> dict[str, int]:
    """request key -> how often its penalties took a token one step old (schedulers summed, a run's delta)."""
    def total(fs):
        out: dict[str, int] = {}
        for f in fs or ():
            for k, n in (f.get("penalty_stale_by_req") or {}).items():
                out[k] = out.get(k, 0) + int(n)
        return out
    now, was = total(facts), total(before)
    return {k: n - was.get(k, 0) for k, n in now.items() if n - was.get(k, 0) > 0}


def evidence_for(reqs, stale: dict[str, int]):
    """fn(finding) -> {mechanism: count} for the request the finding names (classify's `evidence`)."""
    by_rid = {r.rid: stale.get(request_key(r.prompt_ids, r.max_new_tokens), 0) for r in reqs}

    def evidence(finding: str) -> dict:  # a Finding names its request; a bare sentence none
        rid = finding.rid.split("#")[0] if isinstance(finding, Finding) else ""
        return {PENALTY_STALE: by_rid.get(rid, 0)}
    return evidence


def claim(reqs, on_run, found) -> tuple[list, list[tuple[str, Finding]]]:
    """`divergences`' result (overlap on vs off first) split into what is left and (known id,
    finding) for each divergence a KNOWN entry claims: only the overlap-on comparison's, and only for a request whose
    mechanism the agent counted in that run."""
    s = on_run.summary or {}
    ev = evidence_for(reqs, stale_by_request(s.get("facts") or [], s.get("facts_before") or []))
    left, lines = [], []
    for ref, under, divs in found:
        keep = []
        for d in divs:
            line = Finding(f"request {d.rid} diverges at token {d.position} ({d.verdict})", "divergence", d.rid)
            k = next((k for k in KNOWN if matches(k, line) and ev(line).get(k.request_evidence, 0) > 0), None)
            if k is not None and under == "overlap on":
                lines.append((k.id, Finding(f"{line}; its penalties took a token one step old "
                                            f"{ev(line)[k.request_evidence]} time(s), overlap on", line.code, line.rid)))
            else:
                keep.append(d)
        if keep:
            left.append((ref, under, keep))
    return left, lines
