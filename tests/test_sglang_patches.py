"""The SGLang source patches (harness/agents/sglang/patches.py) against SGLang 0.5.23's real
source: each applies exactly once, compiles, and changes its file; a text SGLang no longer has
is one clear error. SGLang is not imported (tests/test_sglang_pair.py runs them)."""
import pytest

from harness.agents.sglang.patches import PATCHES, SglangPatch
from harness.agents.source_patch import PatchError, apply


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_each_patch_applies_once_and_compiles(sglang_src, name):
    p = PATCHES[name]
    f = sglang_src / "sglang" / p.file
    text = f.read_text()
    out = apply(p, text)
    assert out != text
    compile(out, str(f), "exec")
    assert p.upstream and p.suite.startswith("test_")


def test_a_patch_whose_text_is_gone_is_one_line(sglang_src):
    p = PATCHES["sglang_decode_reads_before_copy"]
    gone = SglangPatch(p.name, p.description, p.suite, p.file, p.search + "# not in SGLang\n", p.replace)
    with pytest.raises(PatchError, match=r"the text .* is not found in sglang/.* \(written against SGLang 0\.5\.23\)") as e:
        apply(gone, (sglang_src / "sglang" / p.file).read_text())
    assert "\n" not in str(e.value)
