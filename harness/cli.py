"""The `overlap-harness` command line."""
from __future__ import annotations

import argparse
import json
import sys

EXIT_BAD_INPUT = 2


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        cmds = [c for x in self._actions if isinstance(x, argparse._SubParsersAction) for c in x.choices]
        if cmds and message.endswith("required: cmd"):  # `overlap-harness` or `overlap-harness --badflag`
            message = f"expected a command ({', '.join(cmds)}); see overlap-harness --help"
        raise UsageError(message)


def _bool_flag(p, name: str, default: bool, help: str) -> None:
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                   default=default, help=help)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """Every EngineConfig switch, shared by run / serve / gsm8k / check."""
    from harness.engine.build import MODELS
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="tiny", choices=MODELS, help="weights to serve (default: tiny)")
    _bool_flag(g, "overlap", True, "prepare step N+1 while step N runs (default: on)")
    g.add_argument("--device", default="sim", choices=("sim", "cuda"), help="simulated device or a real GPU")
    g.add_argument("--policy", default="serial",
                   help="schedule policy: serial | random[:SEED] | pct[:SEED[:DEPTH]] | delay[:STREAM[:MS]]")
    g.add_argument("--seed", type=int, default=0, help="drives every random choice (default 0)")
    g.add_argument("--max-running", type=int, default=16, help="rows of the slot table / relay entries")
    g.add_argument("--pool-slots", type=int, default=4096, help="KV slots in the pool")
    g.add_argument("--page-size", type=int, default=1, help="KV slots per page")
    g.add_argument("--max-context", type=int, default=None, help="positions per slot-table row")
    g.add_argument("--max-prefill-tokens", type=int, default=1024, help="tokens one prefill step may process")
    _bool_flag(g, "prefix-cache", True, "share cached prompt slots between requests")
    g.add_argument("--spec", choices=("oracle", "mtp", "ngram"), default=None,
                   help="speculative decoding with this drafter (default: plain decoding)")
    g.add_argument("--spec-k", type=int, default=3, help="draft tokens per window (default 3)")
    g.add_argument("--spec-wrong", type=float, default=0.3,
                   help="oracle drafter: chance a draft token is replaced by a wrong one (default 0.3)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 for small models)")
    g.add_argument("--fault", action="append", default=[], metavar="NAME",
                   help="inject a defect from the catalogue (repeatable); see `overlap-harness faults`")


def engine_config(a: argparse.Namespace):
    from harness.engine.config import EngineConfig
    from harness.validate import ParamError, check_engine, flag
    cfg = EngineConfig(model=a.model, overlap=a.overlap, device=a.device, policy=a.policy, seed=a.seed,
                       max_running=a.max_running, pool_slots=a.pool_slots, page_size=a.page_size,
                       prefix_cache=a.prefix_cache, max_prefill_tokens=a.max_prefill_tokens,
                       max_context=a.max_context, faults=frozenset(a.fault), threads=a.threads, spec=a.spec,
                       spec_k=a.spec_k, spec_wrong=a.spec_wrong)
    try:  # every switch by type and range: the same checks a reproducer's engine gets
        check_engine(cfg, flag)
    except ParamError as e:
        raise UsageError(str(e)) from None
    return cfg


def build(cfg):
    """Build the engine, turning a missing model or GPU into a one-line error."""
    from harness.device import DeviceError
    from harness.engine.build import ModelUnavailable, build_engine, load_model
    from harness.engine.spec import SpecError
    try:
        context = load_model(cfg.model, cfg.max_context)[0].max_context  # cached: build_engine reuses it
        if cfg.page_size > context:
            raise UsageError(f"--page-size {cfg.page_size} exceeds the context of {context} positions "
                             f"(model {cfg.model}; see --max-context): a row holds whole pages")
        return build_engine(cfg)
    except (ModelUnavailable, DeviceError, SpecError) as e:
        raise UsageError(str(e)) from None


# -- run ------------------------------------------------------------------------------
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
        from harness.prompt_file import read_prompt_file
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
        from harness.stress import check_writable
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
    from harness.workloads import clone
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
    from harness.overlap import judge, off_summary
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


# -- main -----------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="overlap-harness", description="Race detection and equivalence testing for overlapped "
                "LLM schedulers, with a reference overlap engine.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="generate for prompts and print a step summary")
    add_engine_flags(r)
    r.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    r.add_argument("--prompts", help="JSONL file: {\"prompt\": ...} or {\"messages\": [...]} per line")
    r.add_argument("--max-tokens", type=int, default=32)
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--repetition-penalty", type=float, default=1.0)
    r.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    _bool_flag(r, "chat", False, "wrap each --prompt in the model's chat template")
    r.add_argument("--timeline", metavar="DIR", help="write a Chrome trace and a PNG timeline into DIR")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(fn=cmd_run)
    for extra in _extra_commands():
        extra(sub)
    return p


def _extra_commands():
    """Sub-commands that live in their own modules (check, mutants, stress, replay, serve, gsm8k)."""
    out = []
    import importlib
    for mod in ("harness.gate", "harness.stress", "harness.serve.command", "harness.evals_cli",
                "harness.sanitize", "harness.setup_cmd"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        out.append(m.add_commands)
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        a = make_parser().parse_args(argv)
        return a.fn(a) or 0
    except UsageError as e:
        print(f"overlap-harness: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("overlap-harness: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # run the package's own module, so `python -m harness.cli` and the sub-command modules
    # share one UsageError class (a second copy of this file would not catch theirs)
    from harness.cli import main as _main
    sys.exit(_main())
