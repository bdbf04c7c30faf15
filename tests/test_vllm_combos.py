"""vLLM's path features two at a time, against real vLLM, through the gate (issue 44, item 2; the
suite is equivalence/test_path_pairs.py, the plan and the rule harness/targets/vllm/combos.py, the
ref engine's races/test_combos.py).

The quiet half: stock vLLM passes the suite, every planned pair met by some request (counted from
the agent's books and the answers), `abort x prefix_hit` among them. The caught half: the source
patch abort_shared_prefix_double_ref (an aborted request's shared cached prefix blocks taken once
more) leaks only where abort meets a prefix hit, and the suite fails naming that pair plainly (it
still fails alone). Its own pair and a few minutes: the scheduled tier; the fast representative is
tests/test_vllm_combos_plan.py (the plan covers every pair, a row's mix, what met read from the
agent's counts, the naming)."""
import pytest

from harness.gate import run_suites
from tests.served_pair import own_vllm_pairs  # noqa: F401 (the module's `pairs` fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.own_servers, pytest.mark.scheduled, pytest.mark.slow]
PATCH = "abort_shared_prefix_double_ref"
SUITE = "test_path_pairs"


def _names(first_failure: str) -> list[str]:
    """The pairs a failing case names: its message up to the first finding (`a x b, c x d (not alone): ...`)."""
    return first_failure.removeprefix("Failed: ").split(": ")[0].split(", ")


def test_pairs_meet_on_stock_and_a_leak_where_two_meet_is_named_by_its_pair(pairs):
    ok = run_suites("vllm", (), 1, suites=[SUITE], pairs=pairs)
    s = ok.suites[SUITE]
    print(f"stock: {s.passed} passed, {s.failed} failed in {s.seconds:.0f} s {s.first_failure[:300]}\n"
          f"pairs met (requests, async on/off): {', '.join(ok.pairs)}")
    assert s.failed == 0 and s.passed == 1, s
    met = dict(p.split("=") for p in ok.pairs)
    assert met["abort x prefix_hit"] not in ("not exercised", "n/a"), met  # else the patch below proves nothing
    bad = run_suites("vllm", (PATCH,), 1, suites=[SUITE], pairs=pairs)
    s = bad.suites[SUITE]
    print(f"patched {PATCH}: {s.passed} passed, {s.failed} failed in {s.seconds:.0f} s: {s.first_failure[:300]}")
    assert s.failed == 1 and "abort x prefix_hit" in _names(s.first_failure), s
