"""The engine's flags, the EngineConfig they make, the engine built from it, and the one-line
usage error: shared by the CLI's commands and by `serve`."""
from __future__ import annotations

import argparse


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


def bool_flag(p, name: str, default: bool, help: str) -> None:
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                   default=default, help=help)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """Every EngineConfig switch, shared by run / serve / gsm8k / check."""
    from harness.engine.build import MODELS
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="tiny", choices=MODELS, help="weights to serve (default: tiny)")
    bool_flag(g, "overlap", True, "prepare step N+1 while step N runs (default: on)")
    g.add_argument("--device", default="sim", choices=("sim", "cuda"), help="simulated device or a real GPU")
    g.add_argument("--policy", default="serial",
                   help="schedule policy: serial | random[:SEED] | pct[:SEED[:DEPTH]] | delay[:STREAM[:MS]]")
    g.add_argument("--seed", type=int, default=0, help="drives every random choice (default 0)")
    g.add_argument("--max-running", type=int, default=16, help="rows of the slot table / relay entries")
    g.add_argument("--pool-slots", type=int, default=4096, help="KV slots in the pool")
    g.add_argument("--page-size", type=int, default=1, help="KV slots per page")
    g.add_argument("--max-context", type=int, default=None, help="positions per slot-table row")
    g.add_argument("--max-prefill-tokens", type=int, default=1024, help="tokens one prefill step may process")
    bool_flag(g, "prefix-cache", True, "share cached prompt slots between requests")
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
