"""`stress --target vllm` against the real engine, on the module-scoped server pair of
tests/test_vllm.py (no pair of its own): a source patch of vLLM is found by the search alone, shrunk
to at most three requests, and its reproducer replays to the same verdict; stock vLLM stays quiet
(known-upstream findings only), and so does an OpenAI pair made of the same two servers.

Counts, not times: each search is a fixed number of seeded submissions (the draws are the seed's;
vLLM's timing is not, so the patch chosen is one every capped request shows). Speed is
benchmarks/bench_vllm_stress.py's."""
import pytest

from harness.search.served.explore import ServedStress, summary_lines

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
PATCH = "max_tokens_counts_placeholders"  # a length-capped request ends one token short async on


def test_stress_is_quiet_on_stock_vllm(vllm, tok, tmp_path):  # noqa: F811
    from harness.targets.openai_pair import OpenAIPair
    s = ServedStress(vllm, tok, seconds=600, seed=3, cases=4, shrink_seconds=0, out=str(tmp_path),
                     version=vllm.version, max_runs=2)
    res = s.run()
    print("\n".join(summary_lines(s)))
    assert res.runs == 2 and res.cases == 8 - 4 * res.refused, res
    assert not res.found, [f.finding.summary for f in res.found]
    assert sum(v[0] for v in res.rows.values()) > 0  # the agent counted paths
    pair = OpenAIPair(vllm.url(True), vllm.url(False), vllm.model_name())
    s = ServedStress(pair, tok, seconds=600, seed=3, cases=4, shrink_seconds=0, out=str(tmp_path), agent=False,
                     vllm=False, max_runs=1)
    res = s.run()
    assert res.runs == 1 and not res.found and not res.rows, [f.finding.summary for f in res.found]


@pytest.mark.on_server(PATCH)
def test_stress_finds_a_source_patch_and_its_reproducer_replays(vllm, tok, tmp_path, oh_pairs):  # noqa: F811
    from harness.search.served import repro as served_repro
    from harness.search.served.judge import judge
    try:
        assert oh_pairs.get("vllm", {PATCH}) is vllm  # the async-on server restarts on the patched copy
        s = ServedStress(vllm, tok, seconds=600, seed=2, cases=4, shrink_seconds=45, out=str(tmp_path),
                         version=vllm.version, max_findings=1, patches=[PATCH], max_runs=6)
        res = s.run()
        print("\n".join(summary_lines(s)))
        assert res.found, f"{PATCH}: {res.runs} runs found nothing"
        f = res.found[0]
        assert f.finding.kind == "divergence" and len(f.best.requests) <= 3, f.finding.summary
        assert f.replay_same, f.repro
        d, case = served_repro.load(f.repro)
        assert d["harness"]["patches"] == [PATCH]
        v = judge(vllm, case, vllm.version)  # what `replay FILE --target vllm` runs
        assert any(list(x.signature) == d["harness"]["verdict"]["signature"] for x in v.new), v.new
    finally:
        oh_pairs.get("vllm", ())  # stock vLLM for whatever runs next (restarted lazily)


def test_a_pressure_mix_preempts_a_decoding_request_in_flight(vllm, tok):  # noqa: F811
    """The search's KV-pressure mix (hypothesis's simplest one: greedy, 257-token prompts, 40 tokens)
    alone makes stock vLLM preempt with a step in flight, async on; async off preempts too."""
    from hypothesis import find
    from harness.search.served.case import ServedCase, requests
    from harness.search.served.judge import judge
    mix = [find(requests(tok, f"c0r{j}", huge=True), lambda r: True) for j in range(3)]
    v = judge(vllm, ServedCase(mix, {}, [], 1), vllm.version)
    assert not v.new, [f.summary for f in v.new]
    assert v.counts_on.get("preemptions_in_flight", 0) > 0, v.counts_on
    assert v.counts_off.get("preemptions_kv", 0) > 0, v.counts_off
