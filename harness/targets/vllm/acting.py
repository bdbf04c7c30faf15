"""Inputs that act on the model served: each parameter row's requests fitted to the model's own
output before the workload runs (issue 45; the rule they serve is issue 36's, item 3).

A row that sets a parameter is judged `not exercised` when the parameter changed no output
(harness.oracles.effects). The path workload's bad words and no-repeat prompts were chosen for
SmolLM2-135M ("two three" after "one two three ..."); another model (the split model TP and PP
need, a user's own) says other things, and the same inputs then change nothing: the row cannot
pass, though nothing is wrong with the engine. So before the workload, each such row's requests
go once to both servers without their parameter (a probe: the same request the effects rule
sends afterwards) and, where none of them would act on what the model says:

- bad words (`bad_words`: vLLM bans a word's last token where the output so far ends with the
  rest): one two-token word is added to the row's last request: the first pair of consecutive
  tokens of that request's own output that vLLM's tokenization of the pair's text gives back
  (both of its prefix-space forms: vllm SamplingParams.update_from_tokenizer), so the word reads
  the previous output token, as the row's words do;
- the no-repeat processors (they ban a request's newest output token at the next position):
  they act only where the model would repeat a token at once, so the row's last request takes
  the first candidate prompt (the workload's own repeating prompts) whose output does (each
  candidate is probed once, without a processor).

Whether a parameter acts is read from the output, as vLLM applies it, so the choice is exact for
the probe's output; the effects run afterwards still judges it (a probe and the later run can
differ at a float32 near-tie: then the row is `not exercised`, never a pass). A row whose inputs
already act keeps them unchanged (SmolLM2's workload is the same as before). Where no candidate
acts the row is left as it is and the line says so: the effects rule fails it.

Both servers get the probe (it goes before each arm's counts are read, so no path counter sees
it), so neither arm starts the workload with a prefix cache the other lacks.
"""
from __future__ import annotations

from harness.agents.vllm.logitsprocs import BATCH_NO_REPEAT, BATCH_NO_REPEAT_CLI, NO_REPEAT, NO_REPEAT_CLI
from harness.oracles import effects

BAD_WORDS, NO_REPEATS = "bad_words", "vllm_xargs"
# the rows fitted, by the parameter their requests set (a bare row's twin is fitted alike)
ROWS = {"bad_words": BAD_WORDS, "bad_words_bare": BAD_WORDS,
        **{r: NO_REPEATS for r in ("logits_processor_cli_value", "logits_processor_entry_point",
                                    "logits_processor_batch_cli", "logits_processor_batch_entry_point",
                                    "logits_processor_entry_point_bare", "logits_processor_batch_entry_point_bare")}}
NO_REPEAT_KEYS = (NO_REPEAT, NO_REPEAT_CLI, BATCH_NO_REPEAT, BATCH_NO_REPEAT_CLI)


def bad_word_ids(tok, word: str) -> list[list[int]]:
    """The token-id sequences vLLM bans for one bad word: the word with its leading spaces taken
    off, then with one space before it where that gives as many tokens from another first token
    (vllm SamplingParams.update_from_tokenizer, 0.26.0 to 0.32.0)."""
    out: list[list[int]] = []
    for prefix in ("", " "):
        ids = list(tok.encode(prefix + word.lstrip()))
        if not ids:
            continue
        if not prefix or (out and ids[0] != out[-1][0] and len(ids) == len(out[-1])):
            out.append(ids)
    return out


def bans_at(words_ids: list[list[int]], out: list[int]) -> int | None:
    """The first position of `out` where one of the bad words bans the token the model said
    there (the rest of the word is the output just before it: vLLM reads the output ids only),
    else None: the words change nothing of this output."""
    for j, t in enumerate(out):
        for w in words_ids:
            if w[-1] == t and len(w) - 1 <= j and out[j - len(w) + 1:j] == w[:-1]:
                return j
    return None


def repeats_at(out: list[int]) -> int | None:
    """The first position where the output repeats its previous token (a no-repeat processor
    bans it there), else None."""
    return next((j for j in range(1, len(out)) if out[j] == out[j - 1]), None)


def word_from(tok, out: list[int]) -> str | None:
    """A two-token bad word the output says: the first pair of consecutive tokens whose text
    vLLM's tokenization gives back as that pair (a word of spaces alone is refused by vLLM)."""
    for i in range(len(out) - 1):
        pair = list(out[i:i + 2])
        text = tok.decode(pair)
        if text.strip() and pair in bad_word_ids(tok, text):
            return text
    return None


def _acts(tok, r, param: str, out: list[int]) -> bool:
    if param == BAD_WORDS:
        return bans_at([w for b in r.extra[BAD_WORDS] for w in bad_word_ids(tok, b)], out) is not None
    return repeats_at(out) is not None


def _setters(row: str, reqs) -> list:
    param = ROWS[row]
    mine = [r for r in reqs if row in getattr(r, "paths", ()) and getattr(r, "abort_after", None) is None
            and effects.sets(r, param)]
    if param == NO_REPEATS:
        mine = [r for r in mine if set(r.extra[NO_REPEATS]) & set(NO_REPEAT_KEYS)]
    return mine


def probes(reqs, candidates) -> list:
    """The probe run's requests: each fitted row's requests without their parameter, and each
    candidate prompt once (`fit~<i>`, without a processor, on the fields of the longest request a
    candidate may go to)."""
    out, seen, model = [], set(), None
    for row in ROWS:
        mine = _setters(row, reqs)
        for r in mine:
            if r.rid not in seen:
                seen.add(r.rid)
                out.append(effects.without(r, ROWS[row]))
        if mine and ROWS[row] == NO_REPEATS and (model is None or mine[-1].max_new_tokens > model.max_new_tokens):
            model = mine[-1]  # the longest of the requests a candidate may go to (choose cuts it to each)
    for i, prompt in enumerate(candidates if model is not None else ()):
        c = effects.without(model, NO_REPEATS)
        c.rid, c.prompt_ids = f"fit~{i}", list(prompt)
        out.append(c)
    return out


def choose(tok, reqs, outputs: dict, candidates) -> dict[str, str]:
    """Fit each row's requests in place from the probe's outputs (rid -> ids, async off); row ->
    one line saying what acts, on which request, and why."""
    lines = {}
    for row in ROWS:
        mine = _setters(row, reqs)
        if not mine:
            continue
        param = ROWS[row]
        acting = [r.rid for r in mine if _acts(tok, r, param, outputs.get(f"{r.rid}~no-{param}", []))]
        if acting:
            lines[row] = f"fitted {row}: acts on {', '.join(acting)} as built"
            continue
        last = mine[-1]
        said = outputs.get(f"{last.rid}~no-{param}", [])
        if param == BAD_WORDS:
            word = word_from(tok, said)
            if word is not None:
                last.extra[BAD_WORDS] = list(last.extra[BAD_WORDS]) + [word]
                lines[row] = (f"fitted {row}: none of its bad words is in the model's output; {last.rid} also "
                              f"bans {word!r}, which its output says at position {bans_at(bad_word_ids(tok, word), said)}")
                continue
            why = "its output has no pair of tokens that tokenizes back as a word"
        else:
            said_on = [outputs.get(f"fit~{i}", [])[:last.max_new_tokens] for i in range(len(candidates))]
            hit = next((i for i, o in enumerate(said_on) if repeats_at(o) is not None), None)
            if hit is not None:
                last.prompt_ids = list(candidates[hit])
                lines[row] = (f"fitted {row}: the model repeats no token on its prompts; {last.rid} takes candidate "
                              f"prompt {hit}, whose output repeats at position {repeats_at(said_on[hit])}")
                continue
            why = f"the model repeats no token at once on any of {len(candidates)} candidate prompts"
        lines[row] = f"fitted {row}: nothing found that the parameter acts on ({why}): left as built"
    return lines


def fit(target, tok, reqs, candidates) -> dict[str, str]:
    """Probe both servers of `target` (off first: its output decides), then fit `reqs` in place."""
    ps = probes(reqs, candidates)
    if not ps:
        return {}
    off = target.run(ps, overlap=False)
    target.run(ps, overlap=True)  # the same requests: neither arm starts with a warmer prefix cache
    return choose(tok, reqs, {rid: list(ids) for rid, ids, *_ in off.outputs}, candidates)
