"""GSM8K-format accuracy, overlap on vs off on the same questions, judged by the exact McNemar
test (harness.evals): the correct engine passes; an engine whose overlap silently costs
accuracy is flagged.

The questions are a held-out set of the arithmetic fixture's own GSM8K-format problems
(generated here, never stored), asked through lm-eval's gsm8k task (zero-shot prompt, its
stop sequences and answer filters). The workload is adversarial: the forward stream is held
back (delay:forward:5), eight rows, and short requests from other clients after each
question, so rows turn over while a finished request's extra step is in flight (the article's
Figure 9)."""
from pathlib import Path

import pytest

from harness.evals.gsm8k import lm_eval_available

N_QUESTIONS = 80  # about 25 s a side on two shared cores; enough to rule out a 5-point drop
MIN_EFFECT = 0.05
ENGINE = dict(model="arith", policy="delay:forward:5", max_running=8, background=1)


@pytest.fixture(scope="module")
def heldout(tmp_path_factory):
    from fixtures.arith import problems
    path = tmp_path_factory.mktemp("gsm8k") / "heldout.jsonl"
    problems.write_jsonl(path, problems.heldout(N_QUESTIONS))
    return path


def test_overlap_keeps_gsm8k_accuracy(oh_options, heldout):
    if oh_options.target != "ref":
        pytest.skip(f"the GSM8K gate against {oh_options.target} runs as `overlap-harness gsm8k --target openai`")
    why = lm_eval_available()
    if why:
        pytest.skip(why)
    from harness.engine.build import ModelUnavailable, load_model
    try:
        load_model("arith")
    except ModelUnavailable as e:
        pytest.skip(str(e))
    from harness.evals.run import GateOptions, run_gate
    r = run_gate(GateOptions(data=str(heldout), limit=N_QUESTIONS, min_effect=MIN_EFFECT,
                             engine={**ENGINE, **oh_options.target_kwargs(),
                                     "faults": ",".join(sorted(oh_options.faults))}))
    judge_result(r)
    assert r["verdict"] == "pass", f"{r['verdict']}: {r['stats']['reason']}"


def judge_result(r) -> None:
    """A finding either way fails (the arms run the same model); the fixture's strength is
    judged where the truth is known (the ref engine, or the arms when they agree), never from
    the arm that may be the broken one."""
    from harness.oracles.stats import FINDINGS, Verdict
    s = r["stats"]
    v = Verdict(**s)
    summary = (f"overlap off {100 * s['acc_ref']:.1f}%, on {100 * s['acc_cand']:.1f}% on {r['n']} questions; "
               f"{s['losses']} lost, {s['gains']} gained, McNemar p(loss) = {s['p_loss']:.2g}, "
               f"p(two-sided) = {s['p_two_sided']:.2g}")
    print(summary)
    assert r["verdict"] not in FINDINGS, f"{r['verdict']}: {s['reason']} ({summary})"
    acc, where = v.strength()
    assert acc is not None and acc >= 0.5, \
        f"the arith fixture is too weak to judge accuracy: {where} at {acc} ({summary})"


# -- a served target (a real engine): its two servers are the pair -----------------------------
GSM8K_TEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"
SERVED_GEN_TOKS = 160


def served_gate_target(name: str, faults=frozenset(), pairs=None):
    """The pair the GSM8K gate asks (of `pairs`, the run's harness.targets.Pairs): for vLLM and
    SGLang, a pair serving the arith fixture (our own model in HF form: it answers most
    GSM8K-format questions right, so a loss can show; SmolLM2-135M answers almost none, and on
    SGLang's CPU path 80 of its GSM8K answers did not finish in 25 minutes); for another served
    target, its own model on real GSM8K questions."""
    from harness.targets import make_target
    if name in ("vllm", "sglang"):
        return make_target(name, faults, pairs, model="arith"), "heldout"
    return make_target(name, faults, pairs), "gsm8k"


def run_served_gate(t, data: str, limit: int):
    from harness.evals.run import GateOptions, run_gate
    # the arith pair's truth: the ref engine on the same weights (vLLM's pair serves them exported)
    path = getattr(t, "model_path", None) or getattr(t, "model", "") or ""
    truth = "arith" if path.rstrip("/").endswith("arith") else None
    return run_gate(GateOptions(target="openai", url_on=t.url(True), url_off=t.url(False), model_name=t.model_name(),
                                data=data, limit=limit, max_gen_toks=SERVED_GEN_TOKS, min_effect=MIN_EFFECT,
                                truth_model=truth))


def test_served_pair_keeps_gsm8k_accuracy(oh_options, heldout):
    """The GSM8K gate through lm-eval against a served target's own server pair (async on / off)."""
    if oh_options.target == "ref":
        pytest.skip("the ref engine's gate is test_overlap_keeps_gsm8k_accuracy")
    why = lm_eval_available()
    if why:
        pytest.skip(why)
    from harness.evals.gsm8k import EvalError, RunFailure
    t, kind = served_gate_target(oh_options.target, oh_options.faults, oh_options.pairs)
    if kind == "gsm8k" and not GSM8K_TEST.is_file():
        pytest.skip(f"no GSM8K test set at {GSM8K_TEST}")
    try:
        r = run_served_gate(t, str(heldout if kind == "heldout" else GSM8K_TEST), N_QUESTIONS)
    except (RunFailure, EvalError) as e:
        pytest.fail(f"the {t.name} pair failed mid-run: {e}", pytrace=False)
    if kind == "heldout":
        judge_result(r)
    else:  # real GSM8K on the target's own model: no truth here, and it may answer few questions
        from harness.oracles.stats import FINDINGS
        assert r["verdict"] not in FINDINGS, f"{r['verdict']}: {r['stats']['reason']}"
