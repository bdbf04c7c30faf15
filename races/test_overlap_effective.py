"""Overlap is real (issue 10, item 1): with overlap on under the serial policy, every host wait
on step N's copy-done comes after step N+1's forward work was issued, and the GPU idle gap and
the period per step are those of an overlapped loop, judged against the overlap-off run of the
same workload in this process (harness.oracles.overlap). Tokens cannot show this: a loop that waits
before issuing gives the right tokens and only loses the overlap. NGRAM waits for every step
by design, so it is not judged here."""
import pytest

from harness.oracles.overlap import judge
from races.scenarios import SCENARIOS, seeds

JUDGED = sorted(s for s in SCENARIOS if s != "spec_ngram")


@pytest.mark.parametrize("scenario", JUDGED)
def test_overlap_effective(target, tok, oh_options, scenario, record_property):
    for seed in seeds(oh_options, default=1):
        reqs, kw, _ = SCENARIOS[scenario](tok, seed)
        off = target.run(reqs, overlap=False, policy="serial", **kw)
        on = target.run(reqs, overlap=True, policy="serial", **kw)
        v = judge(on.engine, off.summary)
        assert v.effective is not None, f"seed {seed}: {v.line}: the workload is too short to judge"
        if not v.effective:
            record_property("overlap", v.to_dict())
            pytest.fail(f"{v.line} (workload {scenario}, seed {seed})", pytrace=False)


# ---- served targets: the host's order of events ----------------------------------------------
# A real engine hides its device and streams, but its agent records when the engine core starts
# scheduling step N+1 and when it waits on step N (harness.agents.host_order). The same question
# as above, asked of those events: a loop that waits before it schedules is LOST, whatever its
# batch queue looks like.
@pytest.fixture(scope="module")
def served(oh_options):
    if oh_options.target == "ref":
        pytest.skip("the ref engine is judged by its device's records (test_overlap_effective above)")
    return oh_options.make()


def test_served_overlap_effective(served, oh_options, record_property):
    from harness.workloads import presets as workloads
    from harness.targets.base import TargetError
    tok = served.tokenizer()
    for seed in seeds(oh_options, default=1):
        reqs = workloads.mixed(tok, 10, seed=seed)
        for r in reqs:
            r.max_new_tokens = max(r.max_new_tokens, 16)  # decode steps with a second batch to judge
        try:
            on = served.run(reqs, overlap=True)
        except TargetError as e:  # the target's own check after the run (LOST, HANG): the finding
            pytest.fail(str(e).removeprefix(f"{served.name}: "), pytrace=False)
        effective, line = served.overlap_verdict(on.summary["facts"], on.summary["facts_before"])
        if effective is None:
            pytest.skip(f"seed {seed}: {line}")
        if not effective:
            record_property("overlap", line)
            pytest.fail(f"{line} (seed {seed})", pytrace=False)
