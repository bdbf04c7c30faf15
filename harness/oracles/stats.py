"""Did accuracy drop with overlap on, beyond chance? Paired tests and intervals (standard library only).

Paired tests and intervals for accuracy gates (standard library only).

- `mcnemar_exact`: the exact McNemar test: on the discordant questions (right with one
  setting, wrong with the other), the count of losses is Binomial(b + c, 1/2) under H0.
- `wilson`: the Wilson score interval of a proportion.
- `clopper_pearson`: the exact binomial interval (used for bounds on the discordant rates).
- `paired_drop_upper`: an upper confidence bound on the accuracy drop from paired records.
- `mde_paired` / `mde_unpaired`: the smallest accuracy drop a test detects with a given
  power, for the benchmark's comparison of the paired and the unpaired designs.
- `judge`: the gate's verdict: pass, silent accuracy loss, arms differ, or inconclusive.
- `moved_arms`: which arm moved, judged against an absolute reference (the truth).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist

_N = NormalDist()


# -- the binomial distribution ----------------------------------------------------------------
def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def binom_pmf(k: int, n: int, p: float) -> float:
    if not 0 <= k <= n:
        return 0.0
    return math.exp(_log_pmf(k, n, p))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, math.fsum(binom_pmf(i, n, p) for i in range(k + 1)))


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return min(1.0, math.fsum(binom_pmf(i, n, p) for i in range(k, n + 1)))


def binom_test(k: int, n: int, p: float = 0.5, alternative: str = "two-sided") -> float:
    """Exact binomial test p-value (two-sided: the sum over outcomes no more likely than k,
    as scipy.stats.binomtest computes it)."""
    if n == 0:
        return 1.0
    if alternative == "greater":
        return binom_sf(k, n, p)
    if alternative == "less":
        return binom_cdf(k, n, p)
    if alternative != "two-sided":
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    d = binom_pmf(k, n, p)
    rel = 1 + 1e-7
    return min(1.0, math.fsum(q for q in (binom_pmf(i, n, p) for i in range(n + 1)) if q <= d * rel))


# -- McNemar ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class McNemar:
    b: int  # right with the reference (overlap off), wrong with the candidate (overlap on): losses
    c: int  # wrong with the reference, right with the candidate: gains
    p_two_sided: float
    p_loss: float  # one-sided: the candidate loses more often than it gains


def mcnemar_exact(losses: int, gains: int) -> McNemar:
    """Exact McNemar test on the discordant pairs: losses ~ Binomial(losses + gains, 1/2) under H0."""
    if losses < 0 or gains < 0:
        raise ValueError("counts must be non-negative")
    n = losses + gains
    return McNemar(losses, gains, binom_test(losses, n, 0.5), binom_test(losses, n, 0.5, "greater"))


# -- intervals ----------------------------------------------------------------------------------
def wilson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (two-sided, level conf)."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= k <= n:
        raise ValueError(f"k={k} is outside 0..{n}")
    z = _N.inv_cdf(0.5 + conf / 2)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z / den * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, mid - half), min(1.0, mid + half))


def _bisect(f, lo: float, hi: float, iters: int = 100) -> float:
    """Root of a function increasing on [lo, hi]."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided exact upper bound on p: the p where P(X <= k) = alpha."""
    if n <= 0 or k >= n:
        return 1.0
    return _bisect(lambda p: alpha - binom_cdf(k, n, p), 0.0, 1.0)


def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    if n <= 0 or k <= 0:
        return 0.0
    return _bisect(lambda p: binom_sf(k, n, p) - alpha, 0.0, 1.0)


def clopper_pearson(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    a = (1 - conf) / 2
    return clopper_pearson_lower(k, n, a), clopper_pearson_upper(k, n, a)


def paired_drop_upper(losses: int, gains: int, n: int, alpha: float = 0.05) -> float:
    """Upper confidence bound (level about 1 - alpha) on the accuracy drop (losses - gains) / n.

    The drop is d * (2q - 1), with d the rate of discordant questions and q the share of
    losses among them. Bound each exactly at alpha / 2 (Clopper-Pearson) and combine; with
    no discordant question this is the rule-of-three bound on d."""
    if n <= 0:
        return 1.0
    D = losses + gains
    d_up = clopper_pearson_upper(D, n, alpha / 2)
    q_up = clopper_pearson_upper(losses, D, alpha / 2) if D else 1.0
    return max(0.0, d_up * (2 * q_up - 1), (losses - gains) / n)


# -- power and minimum detectable effect -----------------------------------------------------------
def mde_unpaired(n: int, sigma: float = 0.5, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest difference of two independent means (n each, standard deviation sigma) a
    one-sided z-test detects: (z_{1-alpha} + z_power) * sigma * sqrt(2 / n)."""
    return (_N.inv_cdf(1 - alpha) + _N.inv_cdf(power)) * sigma * math.sqrt(2.0 / n)


def mde_paired_normal(n: int, discordant: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest drop the one-sided McNemar test detects, normal approximation (Connor 1987):
    n * delta^2 = (z_a * sqrt(d) + z_b * sqrt(d - delta^2))^2, solved for delta."""
    za, zb = _N.inv_cdf(1 - alpha), _N.inv_cdf(power)
    d = discordant

    def f(delta):
        return math.sqrt(n) * delta - (za * math.sqrt(d) + zb * math.sqrt(max(0.0, d - delta * delta)))
    return _bisect(f, 0.0, d)


def mcnemar_power(n: int, discordant: float, drop: float, alpha: float = 0.05) -> float:
    """Exact power of the one-sided exact McNemar test at level alpha: the number of discordant
    questions D ~ Binomial(n, discordant); given D, losses ~ Binomial(D, (1 + drop / d) / 2)."""
    d = discordant
    if drop > d or d <= 0:
        return float("nan")
    q = (1 + drop / d) / 2
    lo = max(0, int(n * d - 8 * math.sqrt(n * d * (1 - d)) - 2))
    hi = min(n, int(n * d + 8 * math.sqrt(n * d * (1 - d)) + 2))
    total = 0.0
    for D in range(lo, hi + 1):
        w = binom_pmf(D, n, d)
        if w < 1e-12 or D == 0:
            continue
        k = critical_losses(D, alpha)
        if k is not None:
            total += w * binom_sf(k, D, q)
    return total


_CRIT: dict[tuple[int, float], int | None] = {}


def critical_losses(D: int, alpha: float) -> int | None:
    """Smallest loss count k with P(X >= k | D, 1/2) <= alpha, or None."""
    key = (D, alpha)
    if key not in _CRIT:
        k = None
        lo, hi = D // 2, D
        if binom_sf(D, D, 0.5) <= alpha:
            while lo < hi:  # binom_sf(k) decreases in k
                mid = (lo + hi) // 2
                if binom_sf(mid, D, 0.5) <= alpha:
                    hi = mid
                else:
                    lo = mid + 1
            k = lo
        _CRIT[key] = k
    return _CRIT[key]


def mde_paired_exact(n: int, discordant: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest drop with exact power >= `power` (bisection on `mcnemar_power`; NaN if none)."""
    if mcnemar_power(n, discordant, discordant, alpha) < power:
        return float("nan")
    return _bisect(lambda x: mcnemar_power(n, discordant, x, alpha) - power, 0.0, discordant, iters=40)


# -- the verdict ---------------------------------------------------------------------------------
PASS, LOSS, INCONCLUSIVE = "pass", "silent accuracy loss", "inconclusive"
# the arms run the same model and weights: a significant gap in either direction means they do
# not compute the same thing (a gain with overlap on means something was skipped with it off,
# or the other way round); the one-sided loss stays the headline
DIFFER = "arms differ"
FINDINGS = (LOSS, DIFFER)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    n: int
    correct_ref: int  # overlap off
    correct_cand: int  # overlap on
    losses: int
    gains: int
    p_loss: float
    p_two_sided: float
    drop: float  # (losses - gains) / n, a fraction
    drop_upper: float
    acc_ref: float
    acc_cand: float
    ci_ref: tuple[float, float]
    ci_cand: tuple[float, float]
    alpha: float
    min_effect: float
    reason: str
    # against an absolute reference (the truth: e.g. the ref engine on the same weights), when given
    moved: str = ""  # "on", "off", "both", "neither"; "": no truth to tell
    acc_truth: float | None = None
    p_truth: tuple | None = None  # two-sided exact McNemar p of (off, on) against the truth
    truth: str = ""  # what the truth is

    @property
    def arms_agree(self) -> bool:
        return self.verdict not in FINDINGS

    def strength(self) -> tuple[float | None, str]:
        """The accuracy the fixture's strength is judged by, and where it comes from: the truth
        when there is one, else the arms only when they agree (never the arm that may be the
        broken one); (None, why) when neither."""
        if self.acc_truth is not None:
            return self.acc_truth, self.truth
        if self.arms_agree:
            return min(self.acc_ref, self.acc_cand), "the two arms, which agree"
        return None, "not known: the arms differ and there is no absolute reference"

    def to_dict(self) -> dict:
        return asdict(self)


def moved_arms(ref: list[bool], cand: list[bool], truth: list[bool], alpha: float = 0.05) -> tuple[str, tuple]:
    """Which arm moved away from the truth (per question, the same questions): each arm against
    the truth by the two-sided exact McNemar test. Returns ("on" | "off" | "both" | "neither",
    (p off, p on))."""
    if not len(truth) == len(ref) == len(cand):
        raise ValueError(f"truth, off and on differ in length: {len(truth)}, {len(ref)}, {len(cand)}")

    def p(arm):
        lost = sum(1 for t, a in zip(truth, arm) if t and not a)
        gained = sum(1 for t, a in zip(truth, arm) if a and not t)
        return mcnemar_exact(lost, gained).p_two_sided
    p_off, p_on = p(ref), p(cand)
    moved = {(True, True): "both", (True, False): "off", (False, True): "on", (False, False): "neither"}
    return moved[(p_off < alpha, p_on < alpha)], (p_off, p_on)


def judge(ref: list[bool], cand: list[bool], alpha: float = 0.05, min_effect: float = 0.03,
          truth: list[bool] | None = None, truth_label: str = "the truth") -> Verdict:
    """Compare per-question correctness, reference (overlap off) vs candidate (overlap on).

    - silent accuracy loss (the headline): the one-sided exact McNemar test rejects at alpha
      and the drop is at least min_effect;
    - arms differ: the two-sided test rejects and the gap, either way, is at least min_effect
      (a gain with overlap on is as much a finding as a loss);
    - pass: no such gap, and the upper bound on the drop is below min_effect;
    - inconclusive: neither (too few questions to rule out a drop of min_effect, or a
      significant drop smaller than min_effect).
    With `truth` (per question, from an absolute reference on the same weights) the verdict
    also says which arm moved away from it."""
    if len(ref) != len(cand):
        raise ValueError(f"paired records differ in length: {len(ref)} vs {len(cand)}")
    n = len(ref)
    if n == 0:
        raise ValueError("no questions to judge")
    losses = sum(1 for a, b in zip(ref, cand) if a and not b)
    gains = sum(1 for a, b in zip(ref, cand) if b and not a)
    m = mcnemar_exact(losses, gains)
    kr, kc = sum(map(bool, ref)), sum(map(bool, cand))
    drop = (losses - gains) / n
    up = paired_drop_upper(losses, gains, n, alpha)
    if m.p_loss < alpha and drop >= min_effect:
        v, why = LOSS, (f"overlap on loses {losses} questions and gains {gains}: drop {100 * drop:.1f} points, "
                        f"exact McNemar p = {m.p_loss:.2g} < {alpha}")
    elif m.p_two_sided < alpha and abs(drop) >= min_effect:
        v, why = DIFFER, (f"the arms do not compute the same thing: overlap on gains {gains} questions and "
                          f"loses {losses}: accuracy {100 * -drop:+.1f} points with overlap on, two-sided exact "
                          f"McNemar p = {m.p_two_sided:.2g} < {alpha}")
    elif up < min_effect:
        v, why = PASS, (f"drop at most {100 * up:.2f} points ({100 * (1 - alpha):.0f}% bound) < minimum effect "
                        f"{100 * min_effect:.1f}; {losses} losses, {gains} gains")
    elif m.p_loss < alpha:
        v, why = INCONCLUSIVE, (f"significant drop (p = {m.p_loss:.2g}) of {100 * drop:.1f} points, below the "
                                f"minimum effect {100 * min_effect:.1f}")
    else:
        v, why = INCONCLUSIVE, (f"no significant drop (p = {m.p_loss:.2g}), but a drop up to {100 * up:.1f} points "
                                f"is not ruled out (minimum effect {100 * min_effect:.1f}): more questions needed")
    extra = {}
    if truth is not None:
        moved, ps = moved_arms(ref, cand, truth, alpha)
        kt = sum(map(bool, truth))
        extra = dict(moved=moved, acc_truth=kt / n, p_truth=ps, truth=truth_label)
        if v in FINDINGS:
            def by(k):
                return f"{100 * (k - kt) / n:+.1f} points, to {100 * k / n:.1f}%"
            arms = {"off": f"the async-off arm moved ({by(kr)})", "on": f"the async-on arm moved ({by(kc)})",
                    "both": f"both arms moved (off {by(kr)}; on {by(kc)})",
                    "neither": "neither arm is significantly off"}[moved]
            why += (f"; {arms} against {truth_label} at {100 * kt / n:.1f}% "
                    f"(two-sided p off {ps[0]:.2g}, on {ps[1]:.2g})")
    elif v == DIFFER:
        why += "; which arm moved needs an absolute reference (the truth)"
    return Verdict(v, n, kr, kc, losses, gains, m.p_loss, m.p_two_sided, drop, up, kr / n, kc / n,
                   wilson(kr, n), wilson(kc, n), alpha, min_effect, why, **extra)
