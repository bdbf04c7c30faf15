"""The paths of vLLM's async scheduling where its bugs have lived, each attacked by one workload
and counted from inside vLLM by the agent, so a path that did not run fails as "not exercised".

One server setting serves almost every row (every extra server pair costs most of a minute):
a KV pool far smaller than the workload (preemption), a small token budget per step (chunked
prefill), prefix caching, our `--logits-processors` processors plus the entry-point ones, and
vLLM's dev endpoints (pause / resume, prefix-cache reset). `SETTINGS` says, per setting, which
vLLM behaviour it changes and which rows it could hide; `SERVER_ARGS` is the main pair's. One
setting hides a whole bug class: a CLI logits processor turns vLLM's output-id repair on for
every batch (vllm#52461), so the rows that need the repair off run on a second pair without it
(`BARE_ARGS`, rows with pair="bare"), and only those rows, to keep the cost to one pair.

PATHS is the table: row name -> how the workload exercises it -> the agent's counters (summed
over vLLM's processes) -> the suite that judges it (equivalence/test_paths.py). A row whose
path vLLM's CPU build cannot run says why in `cpu_reason` (measured; the suite skips it with
that line).

The workload that exercises the rows is harness.targets.vllm.workload; the divergences found in
unmodified vLLM, which the gate reports apart as KNOWN UPSTREAM, are harness.targets.vllm.upstream.
"""
from __future__ import annotations

from dataclasses import dataclass, field


BLOCK = 32  # tokens per KV block (vLLM's CPU backend wants a multiple of 32)
KV_BLOCKS = 28  # 896 tokens: the long requests alone need 34 blocks at their peak (see build)
MAX_BATCHED_TOKENS = 64  # a prompt longer than this is prefilled in chunks
MAX_MODEL_LEN = 512
_LP = "harness.agents.vllm.logitsprocs"
LOGITS_PROCESSOR = f"{_LP}:BoostProcessor"  # by --logits-processors
CLI_PROCESSORS = (LOGITS_PROCESSOR, f"{_LP}:NoRepeatCliProcessor", f"{_LP}:BatchNoRepeatCliProcessor")


@dataclass(frozen=True)
class ServerSetting:
    """One server setting of the path workload: what it changes in vLLM and what it could hide."""
    args: tuple[str, ...]  # the servers' flags ("VAR=value": an environment variable)
    changes: str  # which vLLM behaviour it changes
    could_hide: str  # which rows it could hide, and how
    guard: str  # why it does not: where those rows run without it, or what proves them
    bare: bool = True  # the bare pair has it too (only the setting that hides a row is left out)
    by_target: bool = False  # VllmTarget.server_command gives it for every pair (not in SERVER_ARGS)
    implicit: bool = False  # vLLM's own default, no flag of ours: said here for what it could hide
    # the server configurations (harness.targets.vllm.configs) that run without this setting: where
    # what it could hide shows (issue 36, item 1); "" when none can (a rule of the comparison)
    configs: str = ""


SETTINGS = [
    ServerSetting(("--block-size", str(BLOCK), "--num-gpu-blocks-override", str(KV_BLOCKS)),
                  f"a KV pool of {KV_BLOCKS} blocks of {BLOCK} tokens, fewer than the eight long requests need "
                  "at their peak: the scheduler preempts and its victims resume by recompute",
                  "a bug that needs a request to decode long without a preemption; prefix_cache_hit "
                  "(a block evicted under pressure is no hit)",
                  "every row is counted, so a path pressure kept from running fails as not exercised; the "
                  "short requests are never the victims (vLLM preempts the newest)",
                  configs="kv-plenty (no preemption), kv-tight (more), block-64 (another block size)"),
    ServerSetting(("--max-num-batched-tokens", str(MAX_BATCHED_TOKENS)),
                  f"at most {MAX_BATCHED_TOKENS} tokens a step: a longer prompt is prefilled in chunks",
                  "a bug of a long prompt prefilled whole in one step",
                  f"every short prompt (under {MAX_BATCHED_TOKENS} tokens) is prefilled whole, beside the "
                  "chunked ones", configs="whole-prefill (chunked prefill off; 2048 tokens), small-budget (32)"),
    ServerSetting(("--enable-prefix-caching",),
                  "full prompt blocks are looked up and reused: the 93-token shared prefix is 2 blocks",
                  "a bug in computing those blocks (a hit skips it), on the rows whose prompts share them "
                  "(preemption, penalties' pen1, the entry-point processor's lpe1)",
                  "the other rows share no full block and compute every one; /reset_prefix_cache drops "
                  "the cache mid-run", configs="no-prefix-cache"),
    ServerSetting(("--logits-processors", *CLI_PROCESSORS),
                  "loads our CLI processors; and vLLM 0.32.0 then repairs the output-id placeholders of "
                  "every batch (InputBatch.logitsprocs_need_output_token_ids = bool(CLI processors)), for "
                  "every processor",
                  "every value-reading processor given through the entry point, the ones installed in "
                  "vLLM's venv included (vllm#52461), and a broken bad-words repair (its batch is repaired "
                  "anyway)",
                  "the rows that need the repair off run on a second pair without this flag (pair bare: "
                  "*_bare rows), where vllm#52461 shows",
                  bare=False, configs="spec-draft (drafts: vLLM loads no logits processor), spec-same"),
    ServerSetting(("--max-model-len", str(MAX_MODEL_LEN)),
                  f"at most {MAX_MODEL_LEN} positions a request",
                  "nothing here: every request fits",
                  "tests/test_vllm_paths.py checks that every request fits (SmolLM2's tokens)", by_target=True),
    ServerSetting(("--enforce-eager",), "no CUDA graphs (vLLM's CPU build has none anyway)",
                  "a bug of a graph replay reading stale buffers: device only",
                  "the device runs (docs/device.md) drop it", by_target=True),
    ServerSetting(("--dtype", "float32"), "float32 weights and activations",
                  "nothing: in bfloat16 a different batch can change a rounding and a request diverge "
                  "legitimately, which would blur real divergences", "the tie/race classifier judges the rest",
                  by_target=True),
    ServerSetting(("--max-num-seqs", "32"), "up to 32 requests a step",
                  "a bug of a batch of one or two: a row refilled while its last step is in flight, a swap "
                  "whenever one of two finishes",
                  "the path workload batches many requests; configurations one-seq and two-seqs run it "
                  "one and two at a time", by_target=True, configs="one-seq, two-seqs"),
    ServerSetting(("--scheduling-policy", "fcfs"), "vLLM's default policy: first come first served, the "
                  "newest running request preempted",
                  "every bug of the priority policy's own branch (its victim chosen by priority, maybe "
                  "one already scheduled in the step)",
                  "configuration priority runs the workloads with requests that carry a priority",
                  implicit=True, configs="priority"),
    ServerSetting(("VLLM_ENABLE_V1_MULTIPROCESSING=1",), "vLLM's default: the engine core in its own process "
                  "and, on the CPU build, the worker in another (MultiprocExecutor)",
                  "a bug of the worker run inline on the engine core's thread (UniProcExecutor)",
                  "configuration one-process runs both in the API server's process", implicit=True,
                  configs="one-process"),
    ServerSetting(("VLLM_SERVER_DEV_MODE=1",),
                  "opens /pause, /resume and /reset_prefix_cache; the engine's paths are unchanged",
                  "nothing", "-"),
]


def _flags(bare: bool) -> list[str]:
    return [a for st in SETTINGS if (st.bare or not bare) and not st.by_target and not st.implicit
            for a in st.args if "=" not in a]


SERVER_ARGS = _flags(bare=False)  # the main pair
BARE_ARGS = _flags(bare=True)  # the bare pair: no CLI processor, so vLLM's repair is off
SERVER_ENV = dict(a.split("=", 1) for st in SETTINGS if not st.implicit for a in st.args if "=" in a)  # /pause, ...


def settings_markdown() -> str:
    """SETTINGS as the table docs/vllm-paths.md shows (a test checks the doc against it)."""
    rows = ["| setting | what it changes in vLLM | what it could hide | why it does not | bare pair | "
            "configurations without it |",
            "|---|---|---|---|---|---|"]
    for st in SETTINGS:
        rows.append(f"| `{' '.join(st.args)}`{' (vLLM default)' if st.implicit else ''} | {st.changes} | "
                    f"{st.could_hide} | {st.guard} | {'yes' if st.bare else 'no'} | {st.configs or '-'} |")
    return "\n".join(rows)


@dataclass(frozen=True)
class PathRow:
    name: str
    how: str  # how the workload exercises it
    counters: tuple[str, ...]  # the agent's facts, summed: the path's count
    arm: str = "both"  # where the count must be > 0: "both" arms, or only "on" (async)
    suite: str = "test_paths"
    cpu_reason: str = ""  # non-empty: vLLM's CPU build cannot run it (measured)
    pair: str = "main"  # the server pair it runs on: "main" (SERVER_ARGS) or "bare" (BARE_ARGS)
    placeholders: str = ""  # a value-reading processor's counter of placeholder reads: > 0 fails the row
    violations: tuple[str, str] = ()  # (an agent's counter, what it counts): > 0 on either arm fails the row


PATHS = [
    PathRow("preemption", f"eight long requests that alone need 34 blocks of a {KV_BLOCKS}-block KV pool; the "
            "scheduler preempts (in a step, for KV space) and victims resume by recompute", ("preemptions_kv",)),
    PathRow("preemption_in_flight", "the same, counted when a batch was in flight (async only)",
            ("preemptions_in_flight",), arm="on"),
    PathRow("chunked_prefill", f"prompts over {MAX_BATCHED_TOKENS} tokens, the per-step token budget",
            ("chunked_prefills",)),
    PathRow("prefix_cache_hit", "requests sharing a 93-token prefix (2 full blocks) arrive after the first computed it",
            ("prefix_hits",)),
    PathRow("seeded_partial_prefill", f"a seeded request with a prompt over {MAX_BATCHED_TOKENS} tokens: its "
            "first chunk's sample is discarded and its generator rewound", ("seeded_discards",)),
    PathRow("n_gt_1", "n=3 seeded samples from one request", ("parallel_parents",)),
    PathRow("seeded_reorder", "seeded requests stay in a batch whose rows are condensed / swapped as "
            "others finish", ("seeded_reorders",)),
    PathRow("penalties", "repetition 1.3, presence 0.6, frequency 0.6", ("penalty_steps",)),
    PathRow("bad_words", "two-token bad words (read the previous output token); one the model would say at "
            "once, in a batch without penalties (vLLM repairs the output ids only for some batches)",
            ("bad_words_steps",)),
    PathRow("min_tokens", "min_tokens 12 with EOS and a likely stop token id held back; min_tokens 5 and 9 "
            "with the stop token biased +100, so the stream ends exactly one token after the minimum",
            ("min_tokens_steps",)),
    PathRow("logit_bias", "a +4 bias on two frequent tokens", ("logit_bias_steps",)),
    PathRow("stop", "stop strings and stop token ids that occur mid-output",
            ("stop_string_stops", "stop_token_stops")),
    PathRow("max_tokens_1_2", "max_tokens 1 and 2; sampling steps equal the async-off arm's",
            ("sampled_max1", "sampled_max2")),
    PathRow("logprobs", "top-5 logprobs on every request", ("logprob_requests",)),
    PathRow("logits_processor_cli", f"--logits-processors {LOGITS_PROCESSOR}: forces a token at every "
            "3rd position (reads only how many ids)", ("lp_boost_calls",)),
    PathRow("logits_processor_cli_value", "--logits-processors NoRepeatCliProcessor (per request): bans the "
            "newest output token by VALUE", ("lp_no_repeat_cli_calls",),
            placeholders="lp_no_repeat_cli_placeholder_reads"),
    PathRow("logits_processor_batch_cli", "--logits-processors BatchNoRepeatCliProcessor (batch level, rows "
            "kept through update_state): bans each row's newest token by VALUE", ("lp_batch_cli_calls",),
            placeholders="lp_batch_cli_placeholder_reads"),
    PathRow("logits_processor_entry_point", "the vllm.logits_processors entry point NoRepeatProcessor (per "
            "request): bans the newest output token by VALUE (a placeholder read changes its effect)",
            ("lp_no_repeat_calls",), placeholders="lp_no_repeat_placeholder_reads"),
    PathRow("logits_processor_batch_entry_point", "the entry point BatchNoRepeatProcessor (batch level): bans "
            "each row's newest token by VALUE", ("lp_batch_calls",), placeholders="lp_batch_placeholder_reads"),
    PathRow("installed_logits_processors", "every vllm.logits_processors entry point found in the target's "
            "environment (a team's own), on requests that ask for nothing: async on vs off",
            ("custom_lp_steps",)),
    PathRow("structured_output", "a regex-constrained request", ("grammar_steps",)),
    PathRow("spec_decode_ngram", "ngram speculative decoding", (),
            cpu_reason="vLLM 0.32 refuses it with async scheduling: 'Currently, async scheduling is only "
                       "supported with EAGLE/MTP/Draft Model/NGram GPU/DSpark/DFlash kind of speculative "
                       "decoding' (plain ngram, V1's); V2's n-gram drafter (ngram_gpu) is the configuration "
                       "v2-ngram, judged by the spec_* rows"),
    # draft-model speculative decoding (issue 43): only a drafter's configuration (spec-draft,
    # spec-same; harness.targets.vllm.spec) reaches these, n/a in every other one
    PathRow("spec_windows", "the greedy requests on a drafter's configuration: windows of drafts verified; "
            "their accepted lengths equal async on and off where the arms gave them the same draft counts "
            "(harness.oracles.spec_steps)", ("spec_windows",)),
    PathRow("spec_rejection", "windows with a draft rejected: num_computed_tokens (and async, the "
            "placeholders) rolled back a step late, a request near max_tokens guarded against drafts that "
            "may be rejected (vllm#29542's class; the steps oracle judges its steps)", ("spec_rejections",)),
    PathRow("spec_in_flight", "steps with drafts scheduled while the previous one was in flight (async only)",
            ("spec_steps_in_flight",), arm="on"),
    PathRow("spec_penalties", "penalties and bad words with drafts: the rejection sampler reads the output "
            "ids with the drafts appended, every accepted draft repaired from its placeholder first "
            "(vllm#30122's class)", ("spec_lp_steps",),
            violations=("spec_lp_placeholders", "placeholder ids read by the rejection sampler's penalties or "
                        "bad words")),
    PathRow("pause_resume", "POST /pause?mode=keep then /resume while requests run",
            ("pauses", "resumes")),
    PathRow("prefix_cache_reset", "POST /reset_prefix_cache?reset_running_requests=true while requests "
            "run (preempts them all)", ("prefix_cache_resets",)),
    # a reset or preemption with a frame in flight (vllm#46066's class, issue 43): a run of its own
    # (harness.targets.vllm.workload.run_resets), so a death there is this row's
    PathRow("spec_reset_in_flight", "resets while only short requests decode with drafts: a request is resumed "
            "whole in the schedule right after the reset, its frame of rejected drafts still in flight, so "
            "that stale frame returns to a request holding its new step's placeholder (counted async on: "
            "spec_stale_drop_resumed); its tokens, its books at idle, the engine's life and the placeholders "
            "(never below 0 after a step's update) are judged",
            ("spec_stale_drop_resumed",), arm="on",
            violations=("placeholders_below_zero", "running request(s) whose output placeholders (tokens in "
                        "flight) went below 0 after a step's update")),
    PathRow("abort", "clients that disconnect after 3-5 tokens; a twin of each is not aborted",
            ("aborted_requests",)),
    # the pair without a CLI processor: vLLM repairs the placeholders only for batches with
    # penalties or bad words (see SETTINGS); each row's twin above runs with the repair on
    PathRow("logits_processor_entry_point_bare", "NoRepeatProcessor by the entry point, no CLI processor "
            "on the servers: the placeholder repair is off", ("lp_no_repeat_calls",),
            pair="bare", placeholders="lp_no_repeat_placeholder_reads"),
    PathRow("logits_processor_batch_entry_point_bare", "BatchNoRepeatProcessor by the entry point, no CLI "
            "processor", ("lp_batch_calls",), pair="bare", placeholders="lp_batch_placeholder_reads"),
    PathRow("bad_words_bare", "the two-token bad word the model would say at once, no CLI processor: vLLM "
            "must repair its batch for the bad words alone", ("bad_words_steps",), pair="bare"),
    PathRow("installed_logits_processors_bare", "the installed entry points on requests that ask for "
            "nothing, no CLI processor: a value-reading one sees placeholders", ("custom_lp_steps",),
            pair="bare"),
]
PATHS_BY_NAME = {p.name: p for p in PATHS}


def counts(facts: list[dict]) -> dict[str, int]:
    """Every numeric fact over the engine's processes (a counter lives in one role): summed over the
    API server and the engine core, taken once (the largest rank's) over the workers, one per
    rank, and SGLang's schedulers, one per rank (harness.targets.served.ranks: TP=2 runs each
    path on both ranks; it ran once)."""
    from harness.targets.served import ranks
    return ranks.counts(facts, ranked=("worker", "sglang-scheduler"))


def delta(before: dict, after: dict) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}


def row_count(row: PathRow, c: dict) -> int:
    return sum(c.get(k, 0) for k in row.counters)


@dataclass
class PathRun:
    """One run of the workload on each arm, with each arm's counts (deltas over the run)."""
    reqs: list
    off: object
    on: object
    counts_off: dict
    counts_on: dict
    controls: dict = field(default_factory=dict)
    installed: list = field(default_factory=list)  # "name = module:attr" of every vllm.logits_processors entry point
    books: dict = field(default_factory=dict)  # overlap -> the engine's books at idle (VllmTarget.idle_books)
    release: str | None = None  # the vLLM release the servers ran (known upstream is per release)
    runner: str | None = None  # the model runner they ran ("v1" / "v2"; known upstream is per runner too)
    steps: dict = field(default_factory=dict)  # overlap -> the agent's books per request (harness.oracles.steps)
    effects: dict | None = None  # (rid, parameter) -> it changed the async-off output (harness.oracles.effects)
    surface: dict = field(default_factory=dict)  # rid -> what is wrong with its other response fields (harness.oracles.surface)
    spec: dict = field(default_factory=dict)  # overlap -> each request's speculative windows (harness.oracles.spec_steps)
    absent: dict = field(default_factory=dict)  # row -> "n/a in ...: why" (a release or server configuration without it)
    left_out: dict = field(default_factory=dict)  # rid -> (known id, fields, case): a known crash's trigger not sent
    in_flight: int = 2  # the steps the async-on engine may keep in flight (its batch queue: harness.oracles.steps)
    fitted: dict = field(default_factory=dict)  # row -> how its inputs were fitted to the model (harness.targets.vllm.acting)


def bare_rows() -> list[PathRow]:
    return [p for p in PATHS if p.pair == "bare"]
