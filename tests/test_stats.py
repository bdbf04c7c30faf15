"""harness.oracles.stats against known values (hand-computed, or scipy's where it is installed)."""
import math

import pytest

from harness.oracles import stats as S


def test_binom_test_matches_hand_values():
    # 2 losses, 0 gains: P(X >= 2 | n=2, 1/2) = 1/4; two-sided doubles it
    assert S.binom_test(2, 2, 0.5, "greater") == pytest.approx(0.25)
    assert S.binom_test(2, 2) == pytest.approx(0.5)
    # 9 of 10: one-sided 11/1024, two-sided 22/1024
    assert S.binom_test(9, 10, 0.5, "greater") == pytest.approx(11 / 1024)
    assert S.binom_test(9, 10) == pytest.approx(22 / 1024)
    assert S.binom_test(0, 0) == 1.0


@pytest.mark.parametrize("k,n", [(3, 10), (7, 20), (0, 5), (12, 15), (50, 100), (31, 40)])
def test_binom_test_matches_scipy(k, n):
    st = pytest.importorskip("scipy.stats")
    for alt in ("two-sided", "greater", "less"):
        assert S.binom_test(k, n, 0.5, alt) == pytest.approx(st.binomtest(k, n, 0.5, alternative=alt).pvalue,
                                                             rel=1e-9, abs=1e-12)


def test_mcnemar_uses_only_discordant_pairs():
    m = S.mcnemar_exact(8, 1)  # 8 losses, 1 gain: P(X >= 8 | 9) = (9 + 1) / 512
    assert m.p_loss == pytest.approx(10 / 512)
    assert m.p_two_sided == pytest.approx(20 / 512)
    assert S.mcnemar_exact(0, 0).p_loss == 1.0
    assert S.mcnemar_exact(1, 8).p_loss > 0.99  # gains are not losses


def test_wilson_known_values():
    lo, hi = S.wilson(8, 10)  # the textbook example: 0.490 .. 0.943
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert S.wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12) and S.wilson(10, 10)[1] == pytest.approx(1.0)
    lo, hi = S.wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)


def test_clopper_pearson_against_closed_forms():
    n = 150  # zero successes: upper bound 1 - alpha^(1/n) (rule of three's exact form)
    assert S.clopper_pearson_upper(0, n, 0.05) == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-9)
    assert S.clopper_pearson_lower(n, n, 0.05) == pytest.approx(0.05 ** (1 / n), rel=1e-9)
    st = pytest.importorskip("scipy.stats")
    lo, hi = S.clopper_pearson(8, 10)
    assert lo == pytest.approx(st.beta.ppf(0.025, 8, 3), rel=1e-7)
    assert hi == pytest.approx(st.beta.ppf(0.975, 9, 2), rel=1e-7)


def test_unpaired_threshold_is_the_one_used_elsewhere():
    # 4.84 points at n = 1319, sigma = 50 points, one-sided alpha 0.05, power 0.8
    assert 100 * S.mde_unpaired(1319, 0.5) == pytest.approx(4.84, abs=0.005)


def test_paired_mde_normal_and_exact_agree_and_beat_unpaired():
    n = 1319
    for d in (0.02, 0.05, 0.1):
        approx = S.mde_paired_normal(n, d)
        exact = S.mde_paired_exact(n, d)
        assert abs(approx - exact) < 0.15 * approx  # the exact test is a little more conservative
        assert exact < S.mde_unpaired(n)
        assert S.mcnemar_power(n, d, exact) == pytest.approx(0.8, abs=0.01)
    # the normal formula at d = 0.05: solve sqrt(n) x = 1.645 sqrt(d) + 0.842 sqrt(d - x^2)
    x = S.mde_paired_normal(n, 0.05)
    za, zb = 1.6448536269514722, 0.8416212335729143
    assert math.sqrt(n) * x == pytest.approx(za * math.sqrt(0.05) + zb * math.sqrt(0.05 - x * x), rel=1e-6)


def test_power_is_alpha_at_no_effect_and_grows():
    p0 = S.mcnemar_power(500, 0.1, 0.0)
    assert 0 < p0 <= 0.05
    assert S.mcnemar_power(500, 0.1, 0.02) < S.mcnemar_power(500, 0.1, 0.04)


def test_judge_verdicts():
    n = 200
    same = [True] * 180 + [False] * 20
    v = S.judge(same, same, min_effect=0.03)
    assert v.verdict == S.PASS and v.losses == v.gains == 0 and v.drop_upper < 0.03
    cand = [False] * 30 + same[30:]  # 30 questions lost
    v = S.judge(same, cand, min_effect=0.03)
    assert v.verdict == S.LOSS and v.losses == 30 and v.p_loss < 1e-8 and v.drop == pytest.approx(0.15)
    v = S.judge(same[:20], same[:20], min_effect=0.03)  # too few questions to rule out 3 points
    assert v.verdict == S.INCONCLUSIVE
    small = [False] * 3 + same[3:]  # 3 losses out of 200: significant? no; drop 1.5 points
    assert S.judge(same, small, min_effect=0.03).verdict != S.LOSS
    with pytest.raises(ValueError):
        S.judge([True], [True, False])


def test_a_gain_with_overlap_on_is_a_finding_not_a_weak_fixture():
    """vllm#52461 as the GSM8K pair saw it: a processor that bans repeated digits works with async
    off (every answer wrong) and does nothing with async on. The one-sided loss test says p = 1;
    the two-sided one says the arms differ, and the truth says the async-off arm moved."""
    n = 80
    truth = [True] * 75 + [False] * 5  # the ref engine on the same weights
    off = [False] * n
    on = [True] * 74 + [False] * 6
    v = S.judge(off, on, min_effect=0.05)
    assert v.verdict == S.DIFFER and v.gains == 74 and v.losses == 0 and v.p_loss == 1.0
    assert v.p_two_sided < 1e-20 and "+92.5 points" in v.reason
    assert v.strength()[0] is None  # never judged from the arm that may be the broken one
    assert "absolute reference" in v.reason
    v = S.judge(off, on, min_effect=0.05, truth=truth, truth_label="the ref engine")
    assert v.verdict == S.DIFFER and v.moved == "off"
    assert v.strength() == (75 / 80, "the ref engine") and "async-off arm moved (-93.8 points, to 0.0%)" in v.reason


def test_a_loss_says_the_async_on_arm_moved():
    truth = [True] * 180 + [False] * 20
    off = list(truth)
    on = [False] * 30 + truth[30:]
    v = S.judge(off, on, truth=truth, truth_label="the ref engine")
    assert v.verdict == S.LOSS and v.moved == "on" and "async-on arm moved" in v.reason


def test_arms_that_agree_stay_quiet_and_judge_the_fixture():
    same = [True] * 180 + [False] * 20
    v = S.judge(same, same, min_effect=0.03)
    assert v.verdict == S.PASS and v.arms_agree and v.strength() == (0.9, "the two arms, which agree")
    v = S.judge(same, same, truth=same)
    assert v.verdict == S.PASS and v.moved == "neither"
    # a gain within chance, or significant but below the minimum effect, is no finding
    few = [True] * 3 + same[3:]
    assert S.judge([False] * 3 + same[3:], few, min_effect=0.03).verdict != S.DIFFER
    tiny = [False] * 12 + [True] * 188
    assert S.judge([False] * 20 + [True] * 180, tiny, min_effect=0.05).verdict != S.DIFFER
    with pytest.raises(ValueError):
        S.moved_arms([True], [True], [True, False])
