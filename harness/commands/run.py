"""`overlap-harness run`: generate for prompts and print a step summary.

Its flags are defined in harness/cli.py's parser."""
from __future__ import annotations

import json

from harness.flags import UsageError, build, engine_config


def _read_prompts(a) -> list[dict]:
    for name, texts in (("--prompt", a.prompt), ("--stop", a.stop)):
        for t in texts:
            try:
                t.encode("utf-8")
            except UnicodeEncodeError as e:  # argv bytes that are not UTF-8 arrive as lone surrogates
                raise UsageError(f"{name} is not UTF-8 text (byte 0x{ord(t[e.start]) & 0xff:02x} at offset "
                                 f"{e.start})") from None
    items = [{"prompt": p} for p in a.prompt]
    if a.prompts:
        from harness.workloads.prompt_file import read_prompt_file
        items += read_prompt_file(a.prompts, UsageError)  # every field checked (types, ranges, encoding)
    if not items:
        raise UsageError("no prompts: give --prompt TEXT (repeatable) or --prompts FILE.jsonl")
    return items


def _requests(items, a, tok):
    from harness.engine.request import Request
    reqs = []
    for i, it in enumerate(items):
        if "messages" in it:
            text = tok.apply_chat_template(it["messages"])
        elif a.chat:
            text = tok.apply_chat_template([{"role": "user", "content": it["prompt"]}])
        else:
            text = it["prompt"]
        ids = tok.encode(text)
        if getattr(tok, "add_bos", False) and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id] + ids
        def get(k, default):  # the line's value (checked by read_prompt_file), else the flag's
            return default if it.get(k) is None else it[k]
        stop = get("stop", a.stop)
        stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
        reqs.append(Request(rid=str(get("id", f"req{i}")), prompt_ids=ids, max_new_tokens=get("max_tokens", a.max_tokens),
                            stop=stop, temperature=float(get("temperature", a.temperature)),
                            top_p=float(get("top_p", a.top_p)), seed=it.get("seed"),
                            repetition_penalty=float(get("repetition_penalty", a.repetition_penalty)),
                            arrival=get("arrival", 0), abort_after=it.get("abort_after"),
                            ignore_eos=get("ignore_eos", False)))
    return reqs


def cmd_run(a) -> int:
    from harness.device.timeline import step_summary
    cfg = engine_config(a)
    from harness.validate import ParamError, check_sampling, flag
    try:  # the ranges the server applies to a request's body
        check_sampling({"max_tokens": a.max_tokens, "temperature": a.temperature, "top_p": a.top_p,
                        "repetition_penalty": a.repetition_penalty}, flag)
    except ParamError as e:
        raise UsageError(str(e)) from None
    if any(not s for s in a.stop):  # "" would end every request at its first token
        raise UsageError("--stop must be a non-empty string")
    if a.timeline:
        from harness.search.reproducer import check_writable
        try:
            check_writable(a.timeline)  # now, not after the run
        except OSError as e:
            raise UsageError(f"cannot write --timeline {a.timeline}: {e.strerror or e}") from None
    items = _read_prompts(a)
    eng, tok = build(cfg)
    reqs = _requests(items, a, tok)
    for r in reqs:
        why = eng.check_fits(r)
        if why:
            raise UsageError(why)
    from harness.workloads.presets import clone
    fresh = clone(reqs)  # the same workload again, overlap off, for the overlap verdict
    eng.run(reqs)
    summary = step_summary(eng.dev)
    summary.update(overlap=cfg.overlap, device=cfg.device, policy=eng.dev.policy.spec() if hasattr(eng.dev, "policy")
                   else cfg.policy, seed=cfg.seed, retracted=eng.sched.n_retracted,
                   discarded_rows=eng.sched.n_discarded, clock="virtual" if cfg.device == "sim" else "wall",
                   spec=cfg.spec, spec_k=cfg.spec_k if cfg.spec else None,
                   mean_accept_len=(sum(eng.spec.accept_lens) / len(eng.spec.accept_lens)
                                    if eng.spec is not None and eng.spec.accept_lens else None),
                   batch_invariance=eng.invariance.line)
    from harness.oracles.overlap import judge, off_summary
    ngram = cfg.spec == "ngram"
    verdict = judge(eng, off_summary(cfg, fresh, build) if cfg.overlap and not ngram else None, ngram)
    summary.update(overlap_verdict=verdict.to_dict(), overlap_line=verdict.line)
    out = [{"id": r.rid, "text": _visible(r, tok), "token_ids": r.output_ids, "finish_reason": r.finish_reason,
            "prompt_tokens": len(r.prompt_ids)} for r in reqs]
    if a.timeline:
        from harness.device.trace import write_timeline
        paths = write_timeline(eng.dev, a.timeline)
        summary["timeline"] = paths
    if a.json:
        print(json.dumps({"outputs": out, "summary": summary}))
        return 0
    for o in out:
        print(f"[{o['id']}] ({o['finish_reason']}, {len(o['token_ids'])} tokens) {o['text']!r}")
    print(_format_summary(summary))
    return 0


def _visible(r, tok) -> str:
    text = tok.decode(r.output_ids)
    for s in r.stop:
        i = text.find(s)
        if i >= 0:
            text = text[:i]
    return text


def _format_summary(s: dict) -> str:
    unit = "virtual ms" if s["clock"] == "virtual" else "ms"
    return (f"steps {s['steps']} | overlap {'on' if s['overlap'] else 'off'} | device {s['device']} | "
            f"policy {s['policy']} | seed {s['seed']}\n"
            f"medians per step ({unit}): period {s['period_ms']:.3f}  GPU busy {s['step_ms']:.3f}  "
            f"GPU idle gap {s['gpu_idle_gap_ms']:.3f}  host stall {s['host_stall_ms']:.3f}\n"
            f"CPU per step ({unit}): prepare {s['cpu_prepare_ms']:.3f}  launch {s['cpu_launch_ms']:.3f}  "
            f"process {s['cpu_process_ms']:.3f} | retracted {s['retracted']} | "
            f"discarded rows {s['discarded_rows']}"
            + (f"\nspeculative {s['spec']} k={s['spec_k']}: mean accept length {s['mean_accept_len']:.2f}"
               if s.get("mean_accept_len") is not None else "")
            + (f"\n{s['overlap_line']}" if s.get("overlap_line") else "")
            + (f"\n{s['batch_invariance']}" if s.get("batch_invariance") else ""))
