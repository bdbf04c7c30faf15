"""The workload that exercises every row of the path table (harness.targets.vllm.paths.PATHS):
requests built from SmolLM2's tokenizer so each one drives the path its row names, and the runs
that send them with the controls some rows need (a pause and resume, a prefix-cache reset with
running requests) while they are in flight.
"""
from __future__ import annotations

import random
import threading
import time

from harness.engine.request import Request


PREFIX = ("You are a careful assistant that answers questions about schedulers. The slot table maps each "
          "request to its pages, the relay carries the sampled ids to the next step, and a fence keeps a "
          "freed row from being written while a step still reads it. When memory runs short the scheduler "
          "retracts the newest request, returns its pages to the pool and later recomputes its prompt, so "
          "every answer must come out the same as it would without the overlap. ")
# prompts whose greedy continuation repeats (SmolLM2's): the bad-word and no-repeat rows' requests
COUNT = "one two three one two three one two three one two three one"
COLOURS = "red green blue red green blue red green blue red green blue red"
ECHO = ("ha ha ha ha ha ha ha ha ha ha ha ha", "0 0 0 0 0 0 0 0 0 0 0 0 0 0")
WORDS = "slot table relay fence window step stream token prefix cache batch entry row page copy event".split()


def token_ids(tok, text):
    return ([tok.bos_id] if getattr(tok, "add_bos", False) else []) + tok.encode(text)


def path_request(rid, prompt, n_out, paths, arrival=0, **extra):
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
    long_prefix = token_ids(tok, PREFIX)  # 93 tokens, 2 full blocks: shared, so later requests hit the cache
    period, comma = tok.encode(".")[-1], tok.encode(",")[-1]
    reqs = []
    # first: short outputs (never the preemption victim: vLLM preempts the newest) and the seeded
    # requests, all prompts together within one step's token budget
    for i, k in enumerate((1, 1, 2, 2)):
        reqs.append(path_request(f"t{i}", token_ids(tok, words(2)), k, ["max_tokens_1_2"]))
    for i in range(2):
        r = path_request(f"s{i}", token_ids(tok, words(3)), 16 + 4 * i, ["seeded_reorder"], ignore_eos=True)
        r.temperature, r.top_p, r.seed = 0.9, 0.95, rng.randrange(1 << 30)
        reqs.append(r)
    # prompt logprobs over a prompt prefilled in chunks (issue 36, item 2: compared like output logprobs)
    r = path_request("sx0", token_ids(tok, words(90)), 12, ["seeded_partial_prefill"], ignore_eos=True, prompt_logprobs=2)
    r.temperature, r.top_p, r.seed = 0.9, 0.95, rng.randrange(1 << 30)
    reqs.append(r)
    r = path_request("n0", token_ids(tok, words(3)), 14, ["n_gt_1", "seeded_reorder"])
    r.temperature, r.top_p, r.seed, r.n = 0.8, 1.0, 7, 3
    reqs.append(r)
    for r in reqs[4:]:
        r.phase = "first"
    # eight long requests, sent together: each holds 2 shared and 4 own blocks at its peak, 34
    # blocks of the 28, whatever else runs or however fast steps are, so both arms preempt;
    # victims resume by recompute (a chunked prefill) with a step in flight
    for i in range(8):
        reqs.append(path_request(f"p{i}", long_prefix + token_ids(tok, words(3)), 80 + 4 * i,
                         ["preemption", "preemption_in_flight", "prefix_cache_hit", "chunked_prefill",
                          "pause_resume", "prefix_cache_reset"], arrival=4, ignore_eos=True))
    # the newest (the first victim) with a frequency penalty: a resumed request's output counts must
    # survive its preemption (V2 rebuilds them on resume: v2_penalty_counts_lost_on_resume)
    reqs[-1].extra["frequency_penalty"] = 0.5
    reqs[-1].paths.add("penalties")
    reqs.append(path_request("pen0", token_ids(tok, words(8)), 32, ["penalties"], arrival=3,
                     repetition_penalty=1.3, frequency_penalty=0.6, ignore_eos=True))
    # presence alone: beside repetition and frequency on pen0 it changed no token (issue 36, item 3)
    reqs.append(path_request("pen2", token_ids(tok, words(8)), 32, ["penalties"], arrival=3, presence_penalty=1.5,
                     ignore_eos=True))
    reqs.append(path_request("pen1", long_prefix + token_ids(tok, words(3)), 32, ["penalties", "prefix_cache_hit"],
                     arrival=6, frequency_penalty=0.8, ignore_eos=True))
    reqs.append(path_request("bw0", token_ids(tok, words(6)), 24, ["bad_words"], arrival=3,
                     bad_words=[" slot table", " the", " cache"], ignore_eos=True))
    reqs.append(path_request("mt0", token_ids(tok, words(4)), 20, ["min_tokens"], arrival=3, min_tokens=12,
                     stop_token_ids=[period]))
    for i, k in enumerate((5, 9)):  # the stop token wins as soon as min_tokens lets it: the length says when
        reqs.append(path_request(f"mt{i + 1}", token_ids(tok, "Write one short sentence about " + words(2) + ":"), 20,
                         ["min_tokens", "logit_bias"], arrival=3 + 2 * i, min_tokens=k,
                         stop_token_ids=[period], logit_bias={str(period): 100.0}))
    common = tok.encode(" the")[-1], tok.encode(" and")[-1]
    reqs.append(path_request("lb0", token_ids(tok, words(5)), 20, ["logit_bias"], arrival=4,
                     logit_bias={str(common[0]): 4.0, str(common[1]): 4.0}, ignore_eos=True))
    reqs.append(path_request("st0", token_ids(tok, "Write a list of short sentences about the slot table."), 40, ["stop"],
                     arrival=3, stop_token_ids=[period]))
    r = path_request("st1", token_ids(tok, "Name three things, separated by commas:"), 40, ["stop"], arrival=4)
    r.stop = (",", ".")
    reqs.append(r)
    reqs.append(path_request("st2", token_ids(tok, words(5)), 40, ["stop"], arrival=5, stop_token_ids=[comma, period]))
    reqs.append(path_request("lpc0", token_ids(tok, words(6)), 20, ["logits_processor_cli"], arrival=3,
                     vllm_xargs={"oh_boost": f"{common[0]}:3"}, ignore_eos=True))
    reqs.append(path_request("lpe0", token_ids(tok, words(6)), 24, ["logits_processor_entry_point"], arrival=3,
                     vllm_xargs={"oh_no_repeat": 1}, ignore_eos=True))
    reqs.append(path_request("lpe1", long_prefix + token_ids(tok, words(2)), 24, ["logits_processor_entry_point"], arrival=7,
                     vllm_xargs={"oh_no_repeat": 1}, ignore_eos=True))
    reqs.append(path_request("so0", token_ids(tok, "The id is"), 16, ["structured_output"], arrival=4,
                     structured_outputs={"regex": " [a-z]{3,8}-[0-9]{2,4}"}))
    # aborted clients and their unaborted twins
    for i, k in enumerate((3, 5)):
        prompt = token_ids(tok, words(6))
        a = path_request(f"ab{i}", prompt, 24, ["abort"], arrival=4 + i, ignore_eos=True)
        a.abort_after = k
        reqs += [a, path_request(f"ab{i}full", list(prompt), 24, ["abort"], arrival=4 + i, ignore_eos=True)]
    # last: prompts whose greedy continuation repeats, so the two-token bad word is what the model
    # would say next at once, and the no-repeat processor bans a token it wants
    count, colours = token_ids(tok, COUNT), token_ids(tok, COLOURS)
    # prompts whose greedy continuation repeats a token at once: a no-repeat processor (a team's
    # installed one acts on every request) changes them, so a placeholder read shows as tokens
    echo = tuple(token_ids(tok, t) for t in ECHO)
    # prompt logprobs in a batch of its own too (on lb0, in the main run, async on returned 1 entry of 5
    # once in 5 runs on stock 0.32.0: not understood yet, see docs/vllm-paths.md "The request surface")
    for r in (path_request("bw1", count, 16, ["bad_words"], bad_words=[" two three", " three one"], ignore_eos=True,
                   prompt_logprobs=2),
              path_request("lpe2", colours, 16, ["logits_processor_entry_point"], arrival=1,
                   vllm_xargs={"oh_no_repeat": 1}, ignore_eos=True),
              path_request("lpc1", list(colours), 16, ["logits_processor_cli_value"], arrival=1,
                   vllm_xargs={"oh_no_repeat_cli": 1}, ignore_eos=True),
              path_request("lpb0", list(echo[0]), 16, ["logits_processor_batch_entry_point"], arrival=1,
                   vllm_xargs={"oh_batch_no_repeat": 1}, ignore_eos=True),
              # the "ha" prompt: on the "0" one the processor changed no token (issue 36, item 3)
              path_request("lpbc0", list(echo[0]), 16, ["logits_processor_batch_cli"], arrival=1,
                   vllm_xargs={"oh_batch_no_repeat_cli": 1}, ignore_eos=True),
              *(path_request(f"inst{i}", list(e), 16, ["installed_logits_processors"], arrival=2, ignore_eos=True)
                for i, e in enumerate(echo))):
        r.phase = "last"
        reqs.append(r)
    reqs += build_bare(tok, count, colours, echo)
    for r in reqs:
        r.paths.add("logprobs")
        if not str(getattr(r, "phase", "")).startswith("bare"):  # the spec rows (a drafter's configuration only)
            if not getattr(r, "temperature", None):
                r.paths |= {"spec_windows", "spec_rejection", "spec_in_flight"}
            if r.paths & {"penalties", "bad_words"}:
                r.paths.add("spec_penalties")
    return reqs


def build_bare(tok, count, colours, echo) -> list[Request]:
    """The bare pair's runs (phase "bare", then "bare_words"): the rows that need vLLM's
    placeholder repair off, each on the same prompts as its twin on the main pair. The bad-words
    request runs alone, after the others: a batch with bad words is repaired whole (for every
    processor in it), which would hide vllm#52461 from the processors beside it."""
    bw = path_request("bw2", list(count), 16, ["bad_words_bare"], bad_words=[" two three", " three one"], ignore_eos=True)
    bw.phase = "bare_words"
    out = [path_request("lpe3", list(colours), 16, ["logits_processor_entry_point_bare"], vllm_xargs={"oh_no_repeat": 1},
                ignore_eos=True),
           path_request("lpb1", list(echo[0]), 16, ["logits_processor_batch_entry_point_bare"],
                vllm_xargs={"oh_batch_no_repeat": 1}, ignore_eos=True),
           *(path_request(f"inst{i}b", list(e), 16, ["installed_logits_processors_bare"], ignore_eos=True)
             for i, e in enumerate(echo))]
    for r in out:
        r.phase = "bare"
    return out + [bw]


def repeating_prompts(tok) -> list[list[int]]:
    """The prompts the no-repeat rows may take when the model served repeats no token on theirs
    (harness.targets.vllm.acting): the workload's own repeating prompts, the ones it uses first."""
    return [token_ids(tok, t) for t in (COLOURS, *ECHO, COUNT)]


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
    from harness.targets.base import Run
    from harness.targets.served import openai_wire
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
        with openai_wire.client(30.0) as c:
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
    merged.surface = {k: v for x in (runs["first"], run, last) for k, v in (getattr(x, "surface", {}) or {}).items()}
    return merged, got


# -- resets with a frame in flight, met by a request resumed whole (the spec_reset_in_flight row) --
# The main run's reset finds the long requests running: each resumes by a chunked prefill over
# several steps, so a stale frame returns to a request still in its prefill (no placeholder held)
# and a wrong rollback there only makes vLLM recompute positions with the same KV. The class shows
# where the stale frame returns to a request resumed whole in the schedule right after the reset
# (vllm#46066: its placeholders went below 0): short requests, all of them inside one step's
# budget, decoding with drafts, reset several times over their life (timing decides which reset
# meets a frame of rejected drafts in flight; the agent counts the ones that did).
RESET_ROW = "spec_reset_in_flight"
RESETS_AT = (0.4, 0.9, 1.5, 2.2, 3.0)  # seconds after the run starts
RESET_REQUESTS, RESET_TOKENS = 3, 18  # each request's prompt and output together stay under 26 tokens
# greedy, on prompts whose greedy continuation repeats, under a repetition and a frequency penalty:
# a drafter that proposes from unpenalized logits (the target as its own drafter, spec-same; the
# n-gram drafter, which drafts the repeats) sees its drafts rejected where the penalty bites, so a
# frame in flight carries rejections with every drafter (measured: plain greedy requests on
# spec-same met the shape 0 times in two runs, its greedy windows accepted whole)
RESET_PENALTIES = {"repetition_penalty": 1.4, "frequency_penalty": 0.6}


def build_resets(tok, label: int = 0) -> list[Request]:
    """The row's requests: greedy (their tokens compared on vs off), short repeating prompts under
    penalties, ignore_eos; `label` gives a run again its own prompts."""
    out = []
    for i, text in enumerate((COUNT, COLOURS, ECHO[0])[:RESET_REQUESTS]):
        prompt = token_ids(tok, f"{label + i} {text}")[:7]
        out.append(path_request(f"rs{label}x{i}" if label else f"rs{i}", prompt, RESET_TOKENS, [RESET_ROW],
                                ignore_eos=True, **RESET_PENALTIES))
    return out


def run_resets(target, reqs, overlap: bool, at=RESETS_AT):
    """The requests on one server while a second client resets the prefix cache (running requests
    preempted) at each of `at`; returns (the run, the control responses)."""
    from harness.targets.served import openai_wire
    base, got = target.url(overlap), []
    t0 = time.monotonic()

    def resets():
        with openai_wire.client(30.0) as c:
            for s in at:
                time.sleep(max(0.0, t0 + s - time.monotonic()))
                try:
                    resp = c.post(base + RESET)
                    got.append((RESET, resp.status_code, resp.text[:200]))
                except Exception as e:  # the server died under the run: the run says so (a CRASH)
                    got.append((RESET, 0, f"{type(e).__name__}: {e}"[:200]))
                    return
    ctl = threading.Thread(target=resets, daemon=True)
    ctl.start()
    try:
        run = target.run(reqs, overlap=overlap)
    finally:
        ctl.join(max(at) + 30.0)
    return run, got
