"""The paths of SGLang's overlap scheduler (the article's: the relay and its entry 0, one-step-old
results, retraction, chunked prefill, the finish check one step late, an abort with a step in
flight, the prefix cache, penalties and grammar reading the newest token), each exercised by one
workload and counted inside SGLang's scheduler by the agent (facts `path_*`), so a path that did
not run fails as "not exercised", as vLLM's table does (harness.targets.vllm.paths).

One server setting serves every row (a start costs minutes on a CPU): the default model's pair
runs it (SglangTarget.server_command), so the path attack shares the gate's pair.
"""
from __future__ import annotations

import random

from harness.engine.request import Request
from harness.targets.vllm.paths import PathRow, counts, delta, row_count  # noqa: F401 (the shared helpers)
# the same prompt text and request builder as vLLM's path workload: the two engines are judged on
# requests made alike (only the rows and the controls differ)
from harness.targets.vllm.workload import PREFIX, WORDS, _ids, _req

POOL_TOKENS = 1024  # --max-total-tokens: ten long requests need ~1400 at their peak (see build)
CHUNK = 64  # --chunked-prefill-size: the 93-token shared prefix is prefilled in two chunks
MAX_RUNNING = 16
CONTEXT = 2048
# SGLang admits a request on all its new tokens but counts the running ones at a ratio of theirs
# (0.7 x this, decaying): 0.3 makes the pool over-commit as decodes grow, so the second wave of long
# requests forces retraction (at SGLang's default the ten fit or wait: no retraction in two runs)
CONSERVATIVENESS = 0.3
SERVER_ARGS = {"--max-total-tokens": str(POOL_TOKENS), "--chunked-prefill-size": str(CHUNK),
               "--max-running-requests": str(MAX_RUNNING), "--context-length": str(CONTEXT),
               "--schedule-conservativeness": str(CONSERVATIVENESS)}
SECOND_WAVE = 50  # arrival of the second five long requests: 1.5 s (served.ARRIVAL_MS), once the first decode

# entry 0 on the CPU (measured 2026-12-05): SGLang pads a decode batch only on a captured graph; its
# CPU graph runner (torch.compile) captures CPU_GRAPH_BS = (4,) for the path pair, so every decode
# batch of 1-3 rows is padded to 4 and its padded rows must read and write entry 0 (req-pool row 0,
# which is also the relay's entry 0 since FutureMap is indexed by req-pool row, and KV slot 0)
ENTRY0_VIOLATIONS = ("pad_rows_off_entry0", "graph step(s) whose padded rows did not point at entry 0 (req-pool "
                     "row 0, KV slot 0) or whose requests held it (the agent's first: first_entry0_violation)")

# the fence on the CPU: the agent's happens-before model (harness.agents.sglang_fence) judges every
# req_to_token write against the forward steps in flight; the path is a write that overlaps an
# in-flight step's reads and that SGLang's barrier ordered after them (measured on stock 0.5.23:
# 29 of 276 writes, overlap on)
FENCE_VIOLATIONS = ("fence_hazards", "req_to_token write(s) overlapping the reads of a forward step in flight "
                    "that no fence ordered them after (the agent's first: first_fence_hazard)")

PATHS = [
    PathRow("relay_decode", "every decode step gathers its input ids from the relay (FutureMap) rows the "
            "previous step wrote", ("path_relay_decode",)),
    PathRow("relay_entry_0", "decode batches of 1-3 rows replayed on the captured graph of 4 (the CPU graph "
            "runner, --enable-torch-compile): each padded row reads and writes entry 0, and only it",
            ("path_relay_entry0",), violations=ENTRY0_VIOLATIONS),
    PathRow("fence", "the scheduler's req_to_token writes for step N+1 (a prefill's row, the prefix cache's "
            "rewrite of a chunked request's row) overlap the reads of step N, still in flight: the write-after-"
            "read barrier must order them after step N's reads (judged by happens-before, the CPU running "
            "SGLang's GPU barrier code: SGLANG_ENABLE_WAR_BARRIER=1)", ("fence_ordered_conflicts",), arm="on",
            violations=FENCE_VIOLATIONS),
    PathRow("one_step_old_result", "step N's result is taken after step N+1 was launched (the overlap loop)",
            ("path_one_step_old",), arm="on"),
    PathRow("retraction", f"ten requests of 128 tokens (min_new_tokens 128) after a shared prompt need ~1400 "
            f"tokens of a {POOL_TOKENS}-token pool: SGLang admits them on an estimate of their new tokens and "
            "retracts decodes that no longer fit",
            ("path_retraction",)),
    PathRow("chunked_prefill", f"prompts over {CHUNK} tokens, the chunk size", ("path_chunked_prefill",)),
    PathRow("finish_in_flight", "a request its in-flight result finishes by length is left out of the next "
            "step (the finish check one step late)", ("path_finish_in_flight",), arm="on"),
    PathRow("abort", "clients that disconnect after 4 tokens while their request runs; a twin of each is "
            "not aborted", ("path_abort_running",)),
    PathRow("abort_in_flight", "the same aborts, counted when the request's step was in flight",
            ("path_abort_in_flight",), arm="on"),
    PathRow("prefix_cache_hit", "requests sharing a 93-token prefix arrive after the first computed it",
            ("path_prefix_hit",)),
    PathRow("penalties", "repetition 1.3, presence 0.6, frequency 0.6 (read every token so far, the newest "
            "included)", ("path_penalties",)),
    PathRow("grammar", "regex-constrained requests (xgrammar on the CPU): the mask of step N+1 needs step "
            "N's token accepted", ("path_grammar",)),
    PathRow("grammar_delayed_sample", "overlap on: the step is launched before the previous token reached "
            "the grammar, and sampled once it has (launch_batch_sample_if_needed)",
            ("path_delayed_sample",), arm="on"),
]
PATHS_BY_NAME = {p.name: p for p in PATHS}


def build(tok, seed: int = 0) -> list[Request]:
    """Greedy requests, each tagged with the rows it serves (`r.paths`). Ten long ones share the
    prefix and, decoding together, outgrow the pool (SGLang admits them on an estimated 0.7 of their
    new tokens): retraction, with chunked prefill and prefix hits on the way; penalties, grammar,
    aborts with unaborted twins, and short ones that finish by length on each side of them."""
    rng = random.Random(seed)

    def words(k):
        return " ".join(rng.choice(WORDS) for _ in range(k))
    prefix = _ids(tok, PREFIX)
    reqs = []
    for i in range(10):  # min_new_tokens, not ignore_eos: SGLang admits an ignore_eos request on all of its
        # new tokens (so it never has to retract it), any other on the decaying estimate
        reqs.append(_req(f"p{i}", prefix + _ids(tok, words(3)), 128, ["retraction", "chunked_prefill",
                         "prefix_cache_hit", "relay_decode", "relay_entry_0", "fence", "one_step_old_result",
                         "finish_in_flight"],
                         arrival=0 if i < 5 else SECOND_WAVE, min_new_tokens=128))
    reqs.append(_req("pen0", _ids(tok, words(8)), 32, ["penalties"], arrival=1, repetition_penalty=1.3,
                     presence_penalty=0.6, frequency_penalty=0.6, ignore_eos=True))
    reqs.append(_req("pen1", prefix + _ids(tok, words(3)), 32, ["penalties"], arrival=3,
                     frequency_penalty=0.8, ignore_eos=True))
    reqs.append(_req("g0", _ids(tok, "The id is"), 16, ["grammar", "grammar_delayed_sample"], arrival=1,
                     regex=" [a-z]{3,8}-[0-9]{2,4}"))
    reqs.append(_req("g1", _ids(tok, "Answer yes or no, then say why: " + words(4)), 24,
                     ["grammar", "grammar_delayed_sample"], arrival=2, regex=" (yes|no), [a-z ]{4,40}\\."))
    for i in range(2):  # an abort while running, and its twin that runs to the end
        text = words(5)
        r = _req(f"a{i}", _ids(tok, text), 32, ["abort", "abort_in_flight"], arrival=1 + i, ignore_eos=True)
        r.abort_after = 4
        reqs.append(r)
        reqs.append(_req(f"a{i}full", _ids(tok, text), 32, ["abort"], arrival=1 + i, ignore_eos=True))
    for i, k in enumerate((1, 2, 3)):
        reqs.append(_req(f"t{i}", _ids(tok, words(2)), k, ["finish_in_flight"], arrival=i))
    for r in reqs:
        r.temperature = 0.0
    return reqs
