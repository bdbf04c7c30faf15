"""The trained MTP draft head of the tiny model (fixtures/mtp, retrained by fixtures/mtp/train_mtp.py):
it loads through the engine, drafts tokens the target accepts, and never changes the output."""
import hashlib
import statistics

import pytest
import torch

from harness.workloads import presets as workloads
from harness.engine.build import build_engine
from harness.engine.config import TINY, EngineConfig
from harness.engine.spec import FIXTURES, init_draft_head, load_draft_head


def _run(spec, k=3, overlap=True, seed=0):
    eng, tok = build_engine(EngineConfig(model="tiny", spec=spec, spec_k=k, overlap=overlap))
    reqs = workloads.mixed(tok, 10, seed=seed)
    for r in reqs:
        r.abort_after = None  # an abort lands at a different step under speculation
    eng.run(reqs)
    return eng, [list(r.output_ids) for r in reqs]


def test_fixture_matches_checksum_and_shapes():
    path = FIXTURES / "tiny_mtp.pt"
    line = (FIXTURES / "SHA256SUMS").read_text().split()
    assert line[1] == path.name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == line[0]
    w = load_draft_head("tiny")
    ref = init_draft_head(TINY, seed=0)
    assert set(w) == set(ref)
    for k, v in ref.items():
        assert w[k].shape == v.shape and w[k].dtype == torch.float32, k
    assert any(not torch.equal(w[k], ref[k]) for k in ref)  # trained, not the random init


@pytest.mark.parametrize("seed", [0, 1])
def test_mtp_accepts_drafts_and_keeps_tokens(seed):
    _, plain = _run(None, seed=seed)
    for overlap in (True, False):
        eng, out = _run("mtp", 3, overlap, seed)
        assert out == plain, f"spec mtp changed the tokens (overlap={overlap})"
        mean = statistics.mean(eng.spec.accept_lens)
        assert mean > 1.2, f"mean accept length {mean:.3f} (overlap={overlap})"


def test_mtp_k2_keeps_tokens():
    _, plain = _run(None)
    eng, out = _run("mtp", 2)
    assert out == plain
    assert statistics.mean(eng.spec.accept_lens) > 1.2
