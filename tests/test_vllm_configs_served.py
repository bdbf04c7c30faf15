"""The server configuration matrix against real vLLM (issue 36, item 1), scheduled tier: one pair
start (35-70 s here) and the path suite (2-3 min) per configuration. Its fast representative in
.ci/run is tests/test_vllm_configs.py (the catalogue, the flags each configuration gives the
servers, stress's segments and reproducers, without a server).

- stock 0.32.0 passes the path suite in every configuration of the matrix (the quiet half);
- `priority_victim_keeps_placeholders` (a bug in the priority policy's own preemption branch) passes
  the default configuration's gate and fails the `priority` configuration's, on the preemption row.

Needs `overlap-harness setup vllm`."""
import pytest

from harness.targets.vllm import configs as vc
from tests import check_cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.scheduled]
PATCH = "priority_victim_keeps_placeholders"


def _matrix(capsys, tmp_path, *argv):
    return check_cli.check(tmp_path, *argv, timeout=2400)  # a process of its own (tests/check_cli.py)


def test_stock_is_quiet_in_every_configuration(capsys, tmp_path):
    code, rows, out = _matrix(capsys, tmp_path, "--configs", "all")
    assert set(rows) == set(vc.MATRIX), out[-3000:]
    assert all(v.startswith("PASS") for v in rows.values()) and code == 0, rows


def test_only_the_priority_configuration_catches_a_bug_of_its_branch(capsys, tmp_path):
    code, rows, out = _matrix(capsys, tmp_path, "--configs", "default,priority", "--fault", PATCH)
    assert rows["default"].startswith("PASS"), out[-3000:]  # the default gate misses it: fcfs never runs it
    assert rows["priority"].startswith("FAIL") and code == 1, out[-3000:]
