"""The request surface beyond the token ids (issue 36, item 2): what else a completion returns,
each field with an oracle, judged on the path workload's responses (no request more):

- finish reason: consistent with the tokens ("length" exactly when max_tokens ids came back, none
  longer than max_tokens) and equal across the arms wherever the ids are equal, with vLLM's
  `stop_reason` (the stop string or id that ended it);
- usage: prompt_tokens the prompt's length, completion_tokens the ids returned (summed over the
  n samples of one request); a stream that asked for usage (stream_options.include_usage) gets
  it in its last chunk, and its fields are summed over the chunks (ServedTarget._send_streamed);
- text: equal across the arms wherever the ids are equal (the detokenizer fed the same ids), and
  the detokenized ids themselves (special tokens kept where the request kept them) for a request
  capped by length; one that stopped (a stop string
  or stop token: vLLM leaves it out of the text, not out of the ids) has a prefix of them;
- prompt logprobs (requests that ask, `prompt_logprobs`): as many entries as prompt tokens, the
  first None, and at each position the same top token in both arms unless the off arm's two best
  were a near tie (harness.oracles.divergence.DEFAULT_TIE_TOL), as output logprobs are judged.

Each turn of a conversation (`<rid>@<k>`, harness.targets.served.chat_turns) is judged as a request of its
own whose prompt is the chat template over the messages so far (the client's ids). Aborted clients
are left out (their response is cut by the client). Fields left out, with why:
docs/vllm-paths.md ("The request surface").
"""
from __future__ import annotations

from harness.oracles.divergence import DEFAULT_TIE_TOL
from harness.verdict import Finding


def detokenizer(tok):
    """ids (after `prompt`) -> the text a server returns for them, for a tokenizer of ours
    (harness.engine.smollm2.HFTokenizer, or a Hugging Face one), or None. As vLLM's server does:
    special tokens kept or skipped as the request asked (completions: kept), and incrementally, with tokenizers'
    DecodeStream primed with the prompt, which holds an incomplete UTF-8 character back until
    its last byte and drops it when the request ends first. (The first 20-minute stress read a
    plain decode, which skips special tokens: a sampled request under ignore_eos that drew one
    was a false finding.)"""
    if tok is None:
        return None
    hf = getattr(tok, "tok", tok)
    backend = getattr(hf, "backend_tokenizer", None)
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        DecodeStream = None
    if backend is None or DecodeStream is None:
        return lambda ids, prompt=(), skip_special_tokens=True: hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode(ids, prompt=(), skip_special_tokens=True):
        stream, out = DecodeStream(ids=list(prompt), skip_special_tokens=skip_special_tokens), []
        for t in ids:
            try:
                piece = stream.step(backend, int(t))
            except Exception as e:  # tokenizers' "Invalid prefix": the stream starts again at this token
                if not str(e).startswith("Invalid prefix"):
                    raise
                stream = DecodeStream(skip_special_tokens=skip_special_tokens)
                piece = stream.step(backend, int(t))
            out.append(piece or "")
        return "".join(out)
    return decode


def _prompt_top(entry) -> tuple[str, float, float] | None:
    """(best token, its logprob, the second best's) of one prompt-logprobs position."""
    if not entry:
        return None
    items = sorted(((k, v["logprob"] if isinstance(v, dict) else float(v)) for k, v in entry.items()),
                   key=lambda kv: -kv[1])
    second = items[1][1] if len(items) > 1 else float("-inf")
    return items[0][0], items[0][1], second


def findings(reqs, off, on, decode=None, left_out=None) -> dict[str, list[str]]:
    """rid (the request's, without '#k') -> what is wrong with its response fields. `left_out`: rid ->
    the body fields the pair did not send (ServedTarget.leave_out: a known crash's trigger, after that
    crash): a field never sent is not expected back (the 0.13.0 sweep failed its prompt-logprobs rows
    on answers to requests the pair had sent without prompt_logprobs)."""
    by_rid = {r.rid: r for r in reqs}
    gone = {rid.split("#")[0]: set(fields) for rid, fields in (left_out or {}).items()}
    out: dict[str, list[str]] = {}

    def add(rid, what, code):  # a Finding (harness.verdict) about the request `rid`
        base = rid.split("#")[0]
        out.setdefault(base, []).append(Finding(what, code if code.startswith("surface.") else f"surface.{code}", base))

    def request_of(rid):  # '#k': a sample of n; '@k': a turn of a conversation (harness.targets.served.chat_turns)
        return by_rid.get(rid.split("#")[0].split("@")[0])

    ids = {lab: {rid: list(i) for rid, i, _ in run.outputs} for lab, run in (("off", off), ("on", on))}
    fin = {lab: {rid: f for rid, _, f in run.outputs} for lab, run in (("off", off), ("on", on))}
    surf = {lab: getattr(run, "surface", {}) or {} for lab, run in (("off", off), ("on", on))}
    for lab in ("off", "on"):
        usage_seen: dict[str, int] = {}
        for rid, toks in ids[lab].items():
            r = request_of(rid)
            if r is None or getattr(r, "abort_after", None) is not None:
                continue
            f = fin[lab][rid]
            if len(toks) > r.max_new_tokens:
                add(rid, f"async {lab}: {len(toks)} ids returned, max_tokens {r.max_new_tokens}",
                    f"ids_past_cap.{lab}")
            if f == "length" and len(toks) != r.max_new_tokens:
                add(rid, f"async {lab}: finish_reason length with {len(toks)} of {r.max_new_tokens} ids",
                    f"length_short.{lab}")
            sf = surf[lab].get(rid)
            if sf is None:
                continue
            u = sf.get("usage") or {}
            if sf.get("streamed") and not u:  # asked with stream_options.include_usage
                add(rid, f"async {lab}: a stream asked for usage, and its last chunk had none",
                    f"usage_missing.{lab}")
            if u:
                # a turn's prompt is the chat template over its conversation so far (the client's ids)
                plen = len(sf["prompt_ids"]) if sf.get("prompt_ids") is not None else len(r.prompt_ids)
                if u.get("prompt_tokens") != plen:
                    add(rid, f"async {lab}: usage.prompt_tokens {u.get('prompt_tokens')}, the prompt has "
                             f"{plen} tokens", f"usage_prompt.{lab}")
                usage_seen[rid.split("#")[0]] = u.get("completion_tokens")
            text = sf.get("text")
            if decode is not None and text is not None and toks:
                full = decode(toks, prompt=sf.get("prompt_ids") or r.prompt_ids,
                              skip_special_tokens=sf.get("skip_special_tokens", True))
                if f != "length":  # a stop string's text, or a stop token's, is not in the text: its id is
                    if not full.startswith(text):
                        add(rid, f"async {lab}: text {text[:40]!r} is not a prefix of its detokenized ids {full[:40]!r}",
                            f"text.{lab}")
                elif text != full:
                    add(rid, f"async {lab}: text {text[:40]!r} is not its detokenized ids {full[:40]!r}", f"text.{lab}")
        for base, n in usage_seen.items():  # completion_tokens: every sample of the request
            got = sum(len(t) for rid, t in ids[lab].items() if rid.split("#")[0] == base)
            if n != got:
                add(base, f"async {lab}: usage.completion_tokens {n}, {got} ids returned", f"usage_completion.{lab}")
    for rid, toks in ids["off"].items():
        r = request_of(rid)
        if r is None or getattr(r, "abort_after", None) is not None or ids["on"].get(rid) != toks:
            continue  # different ids are the token oracles' to judge
        if fin["on"].get(rid) != fin["off"][rid]:
            add(rid, f"finish_reason {fin['on'].get(rid)} async on, {fin['off'][rid]} off, with the same ids",
                "finish_reason")
        a, b = surf["off"].get(rid) or {}, surf["on"].get(rid) or {}
        if a and b:
            if a.get("stop_reason") != b.get("stop_reason"):
                add(rid, f"stop_reason {b.get('stop_reason')!r} async on, {a.get('stop_reason')!r} off, with the same ids",
                    "stop_reason")
            if a.get("text") != b.get("text"):
                add(rid, f"text {b.get('text', '')[:40]!r} async on, {a.get('text', '')[:40]!r} off, with the same ids",
                    "text")
            pa, pb = a.get("prompt_logprobs"), b.get("prompt_logprobs")
            asked = (getattr(r, "extra", None) or {}).get("prompt_logprobs") and "prompt_logprobs" not in gone.get(
                rid.split("#")[0], ())
            if asked or pa is not None or pb is not None:
                add_all = _prompt_logprobs(r, pa, pb)
                for what in add_all:
                    add(rid, what, what.code)
    return out


def _prompt_logprobs(r, off, on) -> list[str]:
    out = []
    for lab, pl in (("off", off), ("on", on)):
        if pl is None:
            return [Finding(f"async {lab}: no prompt_logprobs although the request asked for them",
                            f"prompt_logprobs_missing.{lab}")]
        if len(pl) != len(r.prompt_ids) or pl[0] is not None:
            return [Finding(f"async {lab}: {len(pl)} prompt_logprobs entries for {len(r.prompt_ids)} prompt tokens "
                            f"(first {'None' if pl and pl[0] is None else 'not None'})", f"prompt_logprobs_count.{lab}")]
    for pos, (a, b) in enumerate(zip(off[1:], on[1:]), 1):
        ta, tb = _prompt_top(a), _prompt_top(b)
        if ta is None or tb is None:
            if (ta is None) != (tb is None):
                out.append(Finding(f"prompt_logprobs position {pos}: an entry in one arm only",
                                   "prompt_logprobs_entry"))
            continue
        if ta[0] != tb[0] and ta[1] - ta[2] > DEFAULT_TIE_TOL:
            out.append(Finding(f"prompt_logprobs position {pos}: best {tb[0]} async on, {ta[0]} off (not a tie: gap "
                       f"{ta[1] - ta[2]:.3f})", "prompt_logprobs_best"))
            break
    return out


def summary(reqs, off, on) -> str:
    """What the oracle had to judge (a surface nobody returned is no pass)."""
    surf = [getattr(run, "surface", {}) or {} for run in (off, on)]
    n = sum(len(x) for x in surf)
    usage = sum(1 for x in surf for v in x.values() if v.get("usage"))
    text = sum(1 for x in surf for v in x.values() if v.get("text") is not None)
    plp = sum(len(v.get("prompt_logprobs") or ()) for x in surf for v in x.values())
    return (f"surface: {n} responses (both arms): finish reasons and stop reasons, usage on {usage}, text on "
            f"{text}, {plp} prompt-logprob positions")
