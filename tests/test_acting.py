"""Each parameter row's inputs fitted to the model served (harness.targets.vllm.acting), without
vLLM: the choice is read from the probe's outputs, so these feed it outputs. A row whose inputs
act on what the model says keeps them (SmolLM2's workload unchanged: the quiet half); a row whose
bad words or no-repeat prompt change nothing (the split model's ", and , and": the fault) gets
inputs that act, and a fitted input acts on the very output it was read from. Against real vLLM
the path suite fits and then judges every row by the effects rule (equivalence/test_paths.py)."""
import copy
import re
from pathlib import Path

import pytest

from harness.targets.vllm import acting
from harness.targets.vllm import workload as vllm_workload


class _Tok:
    """Words with their leading space as tokens, as a BPE vocabulary gives them."""
    bos_id, add_bos = 1, False

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def encode(self, s):
        return [self.vocab.setdefault(w, len(self.vocab) + 2) for w in re.findall(r" ?[^\s]+", s)]

    def decode(self, ids):
        inv = {i: w for w, i in self.vocab.items()}
        return "".join(inv[i] for i in ids)


def _said(tok, text):
    return tok.encode(text)


def _probe_outputs(tok, reqs, said: dict, candidates=None, default=" one"):
    """rid -> output ids for every probe of the workload: `said` by rid (the model's answers),
    `default` for the rest."""
    return {p.rid: _said(tok, said.get(p.rid, default * 16)) for p in acting.probes(reqs, candidates or [])}


def test_bad_word_ids_follow_vllms_two_prefix_forms():
    tok = _Tok()
    ids = acting.bad_word_ids(tok, " two three")
    assert ids == [tok.encode("two three"), tok.encode(" two three")]
    assert acting.bad_word_ids(tok, "   ") == []  # vLLM refuses a word of spaces: never chosen


def test_a_two_token_word_bans_only_after_its_first_token_in_the_output():
    tok = _Tok()
    w = acting.bad_word_ids(tok, " two three")
    assert acting.bans_at(w, tok.encode(" one two three")) == 2
    assert acting.bans_at(w, tok.encode(" three three")) is None  # " three" not after " two"
    # the prompt is not the output: a word whose first token only the prompt says bans nothing
    assert acting.bans_at(w, tok.encode(" three one")) is None
    assert acting.repeats_at(tok.encode(" and , and")) is None and acting.repeats_at(tok.encode(", ha ha")) == 2


def test_inputs_that_act_are_kept_as_built():
    tok = _Tok()
    reqs = vllm_workload.build(tok, 0)
    before = copy.deepcopy([(r.rid, r.prompt_ids, r.extra) for r in reqs])
    cands = vllm_workload.repeating_prompts(tok)
    said = {"bw1~no-bad_words": " two three one two three", "bw2~no-bad_words": " two three one",
            **{f"{r}~no-vllm_xargs": " blue blue red" for r in ("lpc1", "lpe2", "lpb0", "lpbc0", "lpe3", "lpb1")}}
    lines = acting.choose(tok, reqs, _probe_outputs(tok, reqs, said, cands), cands)
    assert [(r.rid, r.prompt_ids, r.extra) for r in reqs] == before
    assert all(line.endswith(" as built") for line in lines.values()) and set(lines) == set(acting.ROWS), lines


def test_inputs_that_change_nothing_are_fitted_from_the_models_own_output():
    tok = _Tok()
    reqs = vllm_workload.build(tok, 0)
    cands = vllm_workload.repeating_prompts(tok)
    said = {"fit~0": " and , and , and", "fit~1": " , and , , and"}  # candidate 1 (ha ha ...) repeats " ,"
    outs = _probe_outputs(tok, reqs, said, cands, default=" , and")
    lines = acting.choose(tok, reqs, outs, cands)
    by = {r.rid: r for r in reqs}
    bw1 = by["bw1"]
    assert bw1.extra["bad_words"][:2] == [" two three", " three one"] and bw1.extra["bad_words"][2] == " , and"
    # the word chosen acts on the output it was read from (what the effects rule then sees)
    assert acting.bans_at(acting.bad_word_ids(tok, " , and"), outs["bw1~no-bad_words"]) == 1
    for rid in ("lpc1", "lpe2", "lpe3"):  # the rows' last requests move to the prompt that repeats
        assert by[rid].prompt_ids == cands[1], rid
    assert by["lpe0"].prompt_ids != cands[1]  # only the row's last request is moved
    assert "lpe2 takes candidate prompt 1, whose output repeats at position 3" in lines["logits_processor_entry_point"]


def test_a_row_nothing_acts_on_is_left_as_built_and_says_so():
    tok = _Tok()
    reqs = vllm_workload.build(tok, 0)
    cands = vllm_workload.repeating_prompts(tok)
    # one token said once: no pair to read a word from, no repeat (and not a bad word of the workload's)
    outs = {k: v[:1] for k, v in _probe_outputs(tok, reqs, {}, cands, default=" ,").items()}
    lines = acting.choose(tok, reqs, outs, cands)
    assert lines["bad_words"].startswith("fitted bad_words: nothing found"), lines
    assert lines["logits_processor_entry_point"].startswith("fitted logits_processor_entry_point: nothing found")
    assert vllm_workload.build(tok, 0)[0].prompt_ids == reqs[0].prompt_ids


def test_probes_cover_every_fitted_rows_requests_and_each_candidate_once():
    tok = _Tok()
    reqs = vllm_workload.build(tok, 0)
    got = [p.rid for p in acting.probes(reqs, vllm_workload.repeating_prompts(tok))]
    assert len(got) == len(set(got))
    for rid in ("bw0~no-bad_words", "bw1~no-bad_words", "bw2~no-bad_words", "lpc1~no-vllm_xargs",
                "lpe0~no-vllm_xargs", "lpe2~no-vllm_xargs", "lpb0~no-vllm_xargs", "fit~0", "fit~3"):
        assert rid in got, rid
    assert not [r for r in got if r.startswith(("p", "ab", "lpc0"))]  # no other row, no boost processor
    assert acting.probes([r for r in reqs if r.rid.startswith("t")], [[5]]) == []


def _smollm2_tok():
    from harness.engine.smollm2 import HFTokenizer, default_cache_dir
    d = default_cache_dir()
    if not (Path(d) / "tokenizer.json").is_file():
        pytest.skip("SmolLM2's tokenizer is not cached (overlap-harness setup)")
    return HFTokenizer.from_dir(str(d))


def test_a_word_read_from_smollm2_tokens_tokenizes_back_as_vllm_reads_it():
    tok = _smollm2_tok()
    said = tok.encode(", and, and, and")  # what the split model says on the count prompt
    word = acting.word_from(tok, said)
    assert word is not None and acting.bans_at(acting.bad_word_ids(tok, word), said) == 1
    # SmolLM2's own words act on what it says after "one two three ... one"
    assert acting.bans_at(acting.bad_word_ids(tok, " two three"), tok.encode(" two three one two three")) == 1


def test_the_verdict_lists_the_rows_whose_inputs_were_changed():
    from harness.gate import GateResult, path_lines
    res = GateResult()
    res.fitted = ["fitted bad_words: acts on bw0, bw1 as built",
                  "fitted logits_processor_entry_point: the model repeats no token on its prompts; lpe2 takes ..."]
    lines = path_lines(res)
    assert res.fitted[1] in lines and res.fitted[0] not in lines
