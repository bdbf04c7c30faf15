"""Server configurations of vLLM as a dimension of the attack (issue 36, item 1).

The path setting (harness.targets.vllm.paths.SETTINGS) is one corner of vLLM's surface; async
bugs that shipped lived in others: a batch of one or two requests, another token budget per
step, a whole prompt prefilled in one step, another block size, a KV pool under more pressure
or none, prefix caching off, the engine core and the worker in one process, the priority
policy choosing its own victims. Each CONFIG here is one named change of the path setting:
the flags (and environment) that replace the path pair's, what it could expose, which path
rows it takes away (their workload cannot reach them there: the row is "n/a in configuration
X", never a pass), and the releases that allow it.

`stress --target vllm` draws a configuration per segment of runs (a server pair costs about a
minute to start here), `check --target vllm --configs NAME,...|all` runs the gate once per
configuration (the scheduled tier: the default stays one configuration), a reproducer records
its configuration and `replay` starts the servers in it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from harness.targets.vllm import paths as vp

DEFAULT = "default"
# rows a configuration cannot reach with the path workload (a reason each)
_PREEMPT = ("preemption", "preemption_in_flight")
_CHUNK = ("chunked_prefill", "seeded_partial_prefill")


# with a --speculative-config vLLM loads no CLI or entry-point logits processor (it refuses the CLI
# ones: vllm/v1/sample/logits_processor/__init__.py, STR_SPEC_DEC_REJECTS_LOGITSPROCS) and builds
# no logit_bias or min_p processor ("won't work with speculative decoding", the same function)
_NO_LP = "a speculative config loads no CLI or entry-point logits processor (vLLM refuses them with drafts)"
SPEC_HIDES = {**{r: _NO_LP for r in ("logits_processor_cli", "logits_processor_cli_value",
                                      "logits_processor_batch_cli", "logits_processor_entry_point",
                                      "logits_processor_batch_entry_point", "installed_logits_processors")},
              "logit_bias": "vLLM applies no logit_bias with drafts (its builtin processor is not built)",
              # measured on both drafters (2026-12-07): "min_tokens changed no output of mt0, mt1, mt2"
              "min_tokens": "the workload's min_tokens requests stop early only where logit_bias forces their stop "
                            "token, which vLLM refuses with drafts: min_tokens changes no output here (docs/vllm-spec.md)"}
# the rows only a drafter's configuration reaches (harness.targets.vllm.paths, the spec_* rows)
SPEC_ROWS = ("spec_windows", "spec_rejection", "spec_in_flight", "spec_penalties", "spec_reset_in_flight")


@dataclass(frozen=True)
class ServerConfig:
    name: str
    args: tuple[str, ...]  # flags replacing the path pair's (a flag given here drops the pair's own)
    exposes: str  # what vLLM does differently here: the bugs it could expose
    hides: dict  # path row -> why its workload cannot reach it in this configuration
    since: str = "0.11.0"  # the oldest release of the table that takes these flags
    env: tuple[str, ...] = ()  # "VAR=value" for both servers
    refused: str = ""  # non-empty: vLLM (this release) cannot run it, measured; the line says why
    priority: bool = False  # requests carry a "priority" (the priority policy orders by it)
    drop: tuple[str, ...] = ()  # the path pair's flags (names without --) this configuration leaves out
    spec: tuple = ()  # (drafter, num_speculative_tokens): a --speculative-config (harness.targets.vllm.spec)
    model: str = ""  # a model of setup's other than SmolLM2 (harness.targets.vllm.setup.MODEL_DIRS; "split": TP/PP)
    runner: str = ""  # the model runner it needs ("v2"), where --vllm-runner says auto
    heavy: bool = False  # several workers a server: run only when named (--configs NAME), never drawn by default
    lifted_by: str = ""  # a source patch that lifts `refused` (the refusal was vLLM's fix: the patch re-creates the bug)

    def flags(self) -> str:
        spec = [f"--speculative-config {self._method()}:{self.spec[0]},k={self.spec[1]}"] if self.spec else []
        drop = [f"(no --{d})" for d in self.drop]
        more = ([f"(model {self.model})"] if self.model else []) + ([f"(runner {self.runner.upper()})"] if self.runner else [])
        return " ".join([*self.env, *self.args, *spec, *drop, *more]) or "(the path setting)"

    def _method(self) -> str:
        from harness.targets.vllm.spec import DRAFTERS
        return DRAFTERS[self.spec[0]].method


CONFIGS: dict[str, ServerConfig] = {c.name: c for c in [
    ServerConfig(DEFAULT, (), "the path setting itself (vllm_paths.SETTINGS): today's gate", {}),
    ServerConfig(
        "one-seq", ("--max-num-seqs", "1"),
        "a batch of one: every step's input ids come from that one request's previous sample, and a "
        "finished request's row is refilled by the next waiting one while its last step is in flight",
        {**{r: "one request at a time never outgrows the pool" for r in _PREEMPT},
         "seeded_reorder": "a batch of one is never condensed or reordered"}),
    ServerConfig(
        "two-seqs", ("--max-num-seqs", "2"),
        "a batch of two: a row swap whenever one of two finishes, admission one at a time behind it",
        {r: "two requests never outgrow the pool" for r in _PREEMPT}),
    ServerConfig(
        "small-budget", ("--max-num-batched-tokens", "32"),
        "32 tokens a step (one block): a 93-token prompt takes three chunks, decodes and chunks share "
        "tight steps, a request can get no tokens in a step while its previous one is in flight", {}),
    ServerConfig(
        "whole-prefill", ("--max-num-batched-tokens", "2048", "--no-enable-chunked-prefill"),
        "chunked prefill off: every prompt prefilled whole in one step, so no partial-prefill sample "
        "is discarded and a long prefill and decodes share one step",
        {**{r: "chunked prefill is off" for r in _CHUNK}}),
    ServerConfig(
        "block-64", ("--block-size", "64", "--num-gpu-blocks-override", str(vp.KV_BLOCKS * vp.BLOCK // 64)),
        f"blocks of 64 tokens (the same {vp.KV_BLOCKS * vp.BLOCK}-token pool): a block boundary every 64 "
        "positions, a prefix hit only on whole 64-token blocks, fewer and larger frees on preemption",
        {}),
    ServerConfig(
        "kv-tight", ("--num-gpu-blocks-override", str(vp.MAX_MODEL_LEN // vp.BLOCK + 1)),
        f"a pool of {vp.MAX_MODEL_LEN // vp.BLOCK + 1} blocks, one more than the longest request "
        "needs: preemption on almost every admission, victims resumed while others decode", {}),
    ServerConfig(
        "kv-plenty", ("--num-gpu-blocks-override", "1024"),
        "a pool no workload fills: nothing is preempted, every request decodes to its end in one run",
        {r: "a 1024-block pool is never short" for r in _PREEMPT}),
    ServerConfig(
        "no-prefix-cache", ("--no-enable-prefix-caching",),
        "no block is looked up or cached: every prompt computed in full, the cache-blocks calls after "
        "each output skipped",
        {"prefix_cache_hit": "prefix caching is off"}),
    ServerConfig(
        "one-process", (),
        "the engine core inside the API server's process and the worker inline on its thread "
        "(UniProcExecutor): async scheduling without a second process, the sampled ids' copy waited "
        "for on the same thread that schedules", {}, env=("VLLM_ENABLE_V1_MULTIPROCESSING=0",)),
    ServerConfig(
        "uni-executor", ("--distributed-executor-backend", "uni"),
        "the engine core in its own process with the worker inline on it", {},
        refused="vLLM's CPU platform turns --distributed-executor-backend uni into mp while "
                "VLLM_ENABLE_V1_MULTIPROCESSING=1 (vllm/platforms/cpu.py): it runs as the default; "
                "one-process is the uni executor"),
    # speculative decoding (issue 43; harness.targets.vllm.spec): a drafter's windows on every request
    ServerConfig(
        "spec-draft", (),
        "draft-model speculative decoding, 3 drafts a step from SmolLM2 cut to 3 layers: windows accepted "
        "whole, in part and not at all; under async scheduling the scheduler counts 1+3 placeholders a "
        "step, rolls back the rejected ones a step late, guards max_tokens against drafts that may be "
        "rejected, and the penalties read output ids whose accepted drafts were placeholders",
        SPEC_HIDES, since="0.12.0", drop=("logits-processors",), spec=("cut3", 3)),
    ServerConfig(
        "spec-same", (),
        "the target as its own drafter, 3 drafts a step: greedy windows accepted whole (each step carries "
        "the bonus token, the max_tokens guard meets whole windows), penalized, bad-words and sampled "
        "requests' drafts rejected in part (the drafter proposes from unprocessed logits)",
        SPEC_HIDES, since="0.12.0", drop=("logits-processors",), spec=("same", 3)),
    ServerConfig(
        "v2-ngram", (),
        "V2's n-gram drafter (ngram_gpu), 3 drafts a step from the request's own tokens: the drafts live on "
        "the device (the runner scatters them into the request state, the next step's inputs read them), "
        "the scheduler holds placeholders and rolls back the rejected ones a step late; accepted where "
        "the output repeats the prompt or itself, rejected elsewhere (the last sampled token fills a slot "
        "without a match)",
        SPEC_HIDES, since="0.32.0", drop=("logits-processors",), spec=("ngram", 3), runner="v2"),
    # beyond one worker (issue 45; docs/multi-worker.md): the split model (SmolLM2 cut to 6 heads over
    # 2 KV heads, 4 layers: harness.targets.split_model), one worker process per rank
    ServerConfig(
        "tp2", ("--tensor-parallel-size", "2"),
        "tensor parallelism over two worker processes (the multiprocess executor, vLLM's CPU communicator): "
        "every rank keeps its own input batch, request states and sampled-id copy for the same batch, and "
        "the engine core's one schedule is broadcast to both; a rank whose books or placeholders drift "
        "from its peer's answers other tokens or leaks alone", {}, since="0.12.0", model="split", heavy=True),
    ServerConfig(
        "pp2", ("--pipeline-parallel-size", "2"),
        "pipeline parallelism over two stages on V2's runner: with async scheduling the batch queue holds "
        "pipeline size + 1 = 3 batches, so two steps are in flight ahead of the one waited on; decodes "
        "are staggered across stages, only the last stage samples, and a preemption or a finish meets "
        "two frames in flight", {}, since="0.32.0", model="split", runner="v2", heavy=True),
    ServerConfig(
        "pp2-v1", ("--pipeline-parallel-size", "2"),
        "pipeline parallelism on V1's runner with async scheduling (only with the source patch that lifts vLLM's "
        "refusal: --fault v1_pp_async_allowed)", {}, model="split", runner="v1", heavy=True,
        lifted_by="v1_pp_async_allowed",
        refused="vLLM 0.32.0 refuses pipeline parallelism with async scheduling on the V1 model runner "
                "(vllm/config/vllm.py, _get_v1_model_runner_unsupported_features: vllm#45014); pp2 runs it on V2"),
    # V1's engine core defers a structured request's grammar mask while its token is in flight and
    # then processes the OLDEST batch in flight (EngineCore.step_with_batch_queue): with PP=2 (a queue
    # of 2) that is the request's own batch, so the lifted refusal runs clean (pp2-v1, measured); with
    # PP=3 a batch can sit between, and the mask is built from a grammar a token behind (vllm#45014)
    ServerConfig(
        "pp3-v1", ("--pipeline-parallel-size", "3"),
        "pipeline parallelism over three stages on V1's runner with async scheduling (only with the source patch "
        "that lifts vLLM's refusal: --fault v1_pp_async_allowed): two batches can be in flight when a structured "
        "request is scheduled again", {}, model="split", runner="v1", heavy=True,
        lifted_by="v1_pp_async_allowed",
        refused="vLLM 0.32.0 refuses pipeline parallelism with async scheduling on the V1 model runner "
                "(vllm/config/vllm.py, _get_v1_model_runner_unsupported_features: vllm#45014); pp2 runs it on V2"),
    ServerConfig(
        "priority", ("--scheduling-policy", "priority"),
        "the priority policy: the waiting queue is a heap by (priority, arrival), and a KV-pressure "
        "victim is the lowest-priority running request, not the newest: it may be one already "
        "scheduled in this step, or one with a step in flight far from the batch's end", {},
        priority=True),
]}
# A drafter's configuration drawn by stress (issue 43, item 4): "spec-<drafter>-k<k>", any drafter of
# harness.targets.vllm.spec and k drafts a step, built on demand (a reproducer names it; replay and
# check take the name). The two named above are the gate's.
SPEC_KS = (1, 2, 3, 4)
_DRAWN = re.compile(r"spec-(\w+)-k(\d+)")


def drafted(name: str) -> ServerConfig | None:
    """The drafter's configuration a "spec-<drafter>-k<k>" name stands for, or None."""
    from harness.targets.vllm.spec import DRAFTERS
    m = _DRAWN.fullmatch(name or "")
    if m is None or m.group(1) not in DRAFTERS or int(m.group(2)) not in SPEC_KS:
        return None
    d, k = m.group(1), int(m.group(2))
    return ServerConfig(name, (), f"{DRAFTERS[d].method} speculative decoding, {k} draft(s) a step from drafter {d} "
                        f"({DRAFTERS[d].what})", SPEC_HIDES, since="0.32.0" if DRAFTERS[d].runner else "0.12.0",
                        drop=("logits-processors",), spec=(d, k), runner=DRAFTERS[d].runner)


def draw_drafted(rng, runner: str = "auto") -> str:
    """A drafter the servers' runner (`runner`, --vllm-runner's) runs here and its
    num_speculative_tokens, drawn (`rng`: random.Random): a configuration's name."""
    from harness.targets.vllm.spec import drawn
    return f"spec-{rng.choice(drawn(runner))}-k{rng.choice(SPEC_KS)}"


def known(name: str | None) -> bool:
    return (name or DEFAULT) in CONFIGS or drafted(name) is not None


# what `check --configs all` and stress's default draw run. The drafters' configurations run only
# when named (`--configs spec-draft`): their stock gate is not quiet yet on vLLM's CPU build (runs of
# token 0 in both arms, docs/vllm-spec.md), and a draw that fails on stock would bury real findings
MATRIX = [c.name for c in CONFIGS.values() if not c.refused and not c.spec and not c.heavy]


def parse(spec: str | None, exc=ValueError, flag: str = "--configs") -> list[str]:
    """"NAME,...", "all", or "all,-NAME,..." (also "-NAME,...", which argparse takes only as
    --configs=-NAME): every runnable one but those. The names, or one line."""
    if spec is None or spec == "":
        return [DEFAULT]
    spec = spec.strip()
    if spec == "all":
        return list(MATRIX)
    if spec.startswith("all,"):
        spec = spec[4:]
        if not all(n.strip().startswith("-") for n in spec.split(",") if n.strip()):
            raise exc(f"{flag}: after all, only exclusions (-NAME), got {spec!r}")
    drop = spec.startswith("-")
    names = [n.strip().lstrip("-") for n in spec.split(",") if n.strip()]
    for n in names:
        if not known(n):
            raise exc(f"{flag}: unknown server configuration {n!r}; known: {', '.join(CONFIGS)}, or "
                      f"spec-<drafter>-k<{'|'.join(map(str, SPEC_KS))}>")
        if get(n).refused and not get(n).lifted_by and not drop:
            raise exc(f"{flag}: configuration {n} cannot run on vLLM's CPU build: {CONFIGS[n].refused}")
    if drop:
        names = [n for n in MATRIX if n not in names]
        if not names:
            raise exc(f"{flag}: every configuration excluded")
    return list(dict.fromkeys(names))


def get(name: str | None) -> ServerConfig:
    return CONFIGS.get(name or DEFAULT) or drafted(name) or CONFIGS[name]


def resolve(name: str | None, unavailable=RuntimeError, faults=()) -> ServerConfig:
    """The configuration a target is made in: an unknown name is a ValueError, one that vLLM's
    CPU build refuses is `unavailable` (each one line), unless `faults` has the source patch that
    lifts the refusal."""
    if not known(name):
        raise ValueError(f"unknown server configuration {name!r}; known: {', '.join(CONFIGS)}")
    c = get(name)
    if c.refused and not (c.lifted_by and c.lifted_by in set(faults)):
        raise unavailable(f"configuration {c.name}: {c.refused}")
    return c


def _split(args) -> list[tuple[str, list[str]]]:
    """Flags as (key, tokens): a flag and the values after it; --no-X and --X share the key X."""
    out: list[tuple[str, list[str]]] = []
    for a in args:
        if a.startswith("--"):
            key = a[2:].split("=", 1)[0]
            out.append((key[3:] if key.startswith("no-") else key, [a]))
        elif out:
            out[-1][1].append(a)
        else:
            out.append(("", [a]))
    return out


def apply(args, config: ServerConfig) -> list[str]:
    """The servers' flags with the configuration's in place of the same flags (last, so a
    release that reads a flag twice still takes the configuration's)."""
    mine = _split(config.args)
    keys = {k for k, _ in mine} | set(config.drop)
    return [t for k, toks in _split(args) if k not in keys for t in toks] + [t for _, toks in mine for t in toks]


def env(config: ServerConfig) -> dict:
    return dict(a.split("=", 1) for a in config.env)


def row_absent(row: str, config: ServerConfig) -> str:
    """"n/a in configuration X: why" for a path row this configuration takes away; the rows of
    the bare pair run in the default configuration only (a second pair per configuration would
    double the matrix's cost)."""
    if row in SPEC_ROWS and not config.spec:
        return (f"n/a in configuration {config.name}: {row}: no drafter (the configurations "
                f"{', '.join(c.name for c in CONFIGS.values() if c.spec)})")
    if config.name == DEFAULT:
        return ""
    why = config.hides.get(row)
    if why:
        return f"n/a in configuration {config.name}: {row}: {why}"
    if vp.PATHS_BY_NAME.get(row) is not None and vp.PATHS_BY_NAME[row].pair == "bare":
        return (f"n/a in configuration {config.name}: {row}: the bare pair runs in the default configuration "
                "only")
    return ""


def after_known_crashes(config: ServerConfig, proven: dict, remedy) -> ServerConfig:
    """The configuration a pair starts (again) in: the one it was made in, or, once a live known
    bug that names configurations never reaching it (KnownUpstream.avoid) killed an async-on
    engine in this process, those combined (issue 36, item 6: the rest of the rows are judged
    there; the rows they take away say why). `proven`: ServedTarget.proven_crashes; `remedy`:
    known id -> (trigger, avoid) in the pair's release."""
    for kid, (case, _) in proven.items():
        names = remedy(kid)[1]
        if not names or config.name == "+".join(names):
            continue
        parts = [CONFIGS[n] for n in names]
        why = f" (the pair runs {'+'.join(names)} since KNOWN UPSTREAM {kid} killed its async-on engine in {case})"
        print(f"vllm: the server pair starts in configuration {'+'.join(names)} "
              f"({' '.join(a for c in parts for a in c.args)}): KNOWN UPSTREAM {kid} killed the async-on engine "
              f"in {case}, and these servers never reach it", flush=True)
        return ServerConfig("+".join(names), tuple(a for c in parts for a in c.args),
                            " and ".join(c.exposes for c in parts),
                            {r: w + why for c in parts for r, w in c.hides.items()},
                            env=tuple(e for c in parts for e in c.env), drop=tuple(d for c in parts for d in c.drop),
                            spec=next((c.spec for c in parts if c.spec), ()))
    return config


def matrix_markdown() -> str:
    """The catalogue as docs/vllm-configs.md shows it (a test checks the doc against it)."""
    rows = ["| configuration | flags | what it could expose | rows it takes away | releases |",
            "|---|---|---|---|---|"]
    for c in CONFIGS.values():
        hid = ", ".join(sorted(c.hides)) or "none"
        rel = f"refused on the CPU build: {c.refused}" if c.refused else f"{c.since} and newer"
        rows.append(f"| `{c.name}` | `{c.flags()}` | {c.exposes} | {hid} | {rel} |")
    return "\n".join(rows)
