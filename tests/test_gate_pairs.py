"""The gate's served pairs are an object it owns (issue 42, item 2): a Pairs made per run from the
flags' options (frozen, built once), handed to the suites through the plugin, closed at the end;
no module global holds a pair or an option."""
import argparse

import pytest

from harness import targets
from harness.flags import UsageError, served_options, vllm_choice
from harness.gate import _GivePairs

SUITE = '''
def test_sees_the_gates_pairs(oh_pairs, oh_options):
    assert oh_options.pairs is oh_pairs
    assert oh_pairs.options["vllm"].model == "given-by-the-gate"
    assert oh_pairs.options["vllm"].vllm.version == "0.13.0"
'''


def test_the_suites_get_the_gates_pairs_through_the_plugin(tmp_path):
    f = tmp_path / "test_given.py"
    f.write_text(SUITE)
    opts = targets.ServedOptions(model="given-by-the-gate", vllm=targets.VllmChoice(version="0.13.0"))
    pairs = targets.Pairs({"vllm": opts})
    code = pytest.main([str(f), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        "--import-mode=importlib"], plugins=[_GivePairs(pairs)])
    assert code == 0


def test_no_module_global_holds_a_pair_or_an_option():
    for name in ("_SERVED", "_DEFAULTS", "configure", "close_served"):
        assert not hasattr(targets, name), name
    with pytest.raises(ValueError, match="ask the run's Pairs"):
        targets.make_target("vllm")


def _flags(**kw):
    base = dict(target="vllm", vllm_version=None, vllm_python=None, vllm_runner="auto", served_model=None,
                server_arg=[], logits_processor=[], out="check-out")
    return argparse.Namespace(**{**base, **kw})


def test_the_vllm_flags_are_checked_once_into_a_frozen_choice_the_target_options_carry():
    choice = vllm_choice(_flags(vllm_version="0.13.0", vllm_runner="v1"), UsageError)
    assert choice == targets.VllmChoice("0.13.0", None, "v1")
    opts = served_options(_flags(served_model="m", server_arg=["--x=1"]), UsageError, choice, config="priority")
    assert opts.kw("vllm") == {"extra_args": ["--x=1"], "model": "m", "out_dir": "check-out", "config": "priority",
                               "version": "0.13.0", "runner": "v1"}
    assert "version" not in opts.kw("sglang")
    with pytest.raises(Exception):  # frozen: what the flags said cannot change under the run
        opts.model = "other"
    for bad, says in ((dict(target="sglang", vllm_version="0.13.0"), "applies to --target vllm only"),
                      (dict(vllm_version="0.13.0", vllm_python="/x"), "two ways to name the vLLM"),
                      (dict(vllm_version="9.9.9"), "--vllm-version")):
        with pytest.raises(UsageError, match=says):
            vllm_choice(_flags(**bad), UsageError)
    assert vllm_choice(_flags(target="ref"), UsageError) == targets.VllmChoice()
