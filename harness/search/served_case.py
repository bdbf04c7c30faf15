"""A served case: request mixes over what the vLLM path rows know, and the agent's delays and the
server controls of one submission; drawn by hypothesis (`submissions`).

One submission merges `cases` independent request mixes (each 1-3 requests, rids `c<i>r<j>`)
into one run on each server: the servers stay warm and a run of a few seconds buys several cases
(benchmarks/bench_vllm_stress.py measures what that buys). The mixes share the run's delays and
controls, which are drawn once per submission.

What a request can carry (harness.targets.vllm.paths.PATHS names the same paths): greedy, seeded
or unseeded temperature sampling, repetition / presence / frequency penalties, two-token
bad_words, min_tokens with a stop token id (and that token boosted, so the stream ends right at
the minimum), logit_bias, stop strings and stop token ids, n = 2-3 seeded samples, top-5 logprobs
(always: the tie/race classifier needs them), a regex (structured output), each of our logits
processors (CLI and entry point, per request and batch level: vllm_xargs), prompt logprobs, top_k
and min_p on a sampled request, a stream read whole with its usage, prompts short, over the
step budget (chunked prefill) or on the 93-token shared prefix (prefix hits), max_tokens 1-3 or
up to 24, arrival times, and a client that disconnects after k tokens. A submission adds the
agent's delay points (harness.agents.vllm.points.DELAY_POINTS) on the async-on server, and a
/pause + /resume or a /reset_prefix_cache (running requests preempted) at a chosen time.
"""
from __future__ import annotations

import copy
import random
import zlib
from dataclasses import dataclass, field

from hypothesis import strategies as st

from harness.engine.request import Request

# the agent's delay points (harness.agents.vllm.points.DELAY_POINTS; not imported: that module is
# the agent's and its table is checked against it in tests/test_served_search.py)
DELAY_POINTS = ("engine_step", "worker_execute", "output_copy", "before_wait")
# "pause" is /pause?mode=keep (requests frozen in place); vLLM 0.32 has two more modes: "wait" (no
# new request admitted until those running drain) and "abort" (every request in flight aborted:
# its client gets what was generated so far, finish "abort"; harness.oracles.pause_abort)
CONTROLS = ("pause", "reset", "pause_wait", "pause_abort")
PAUSE_MODES = {"pause": "keep", "pause_wait": "wait", "pause_abort": "abort"}
PAUSE_FOR_S = 0.3
# what each request body may carry beyond the plain greedy request (the keys of `Request.extra`)
XARGS = {"boost": "oh_boost", "no_repeat": "oh_no_repeat", "no_repeat_cli": "oh_no_repeat_cli",
         "batch_no_repeat": "oh_batch_no_repeat", "batch_no_repeat_cli": "oh_batch_no_repeat_cli"}
OPTIONS = ("penalties", "bad_words", "min_tokens", "logit_bias", "stop_str", "stop_ids", "regex", "lp", "prompt_lp")
VLLM_ONLY = ("bad_words", "min_tokens", "structured_outputs", "vllm_xargs", "repetition_penalty", "ignore_eos",
             "stop_token_ids", "prompt_logprobs", "top_k", "min_p", "stream", "chat", "request_id", "oh_x_request_id",
             "allowed_token_ids", "oh_x_vllm_priority")


@dataclass
class ServedCase:
    """One submission: the merged requests of `cases` mixes, the async-on server's delays, and
    the controls [(seconds after the start, "pause" | "reset")] sent to both servers."""
    requests: list
    delays: dict = field(default_factory=dict)
    controls: list = field(default_factory=list)
    cases: int = 1

    def size(self) -> tuple:
        """What shrinking makes smaller, in order of weight (a smaller tuple is a simpler case)."""
        return (len(self.requests), len(self.controls), len(self.delays),
                sum(len(features(r)) for r in self.requests), sum(len(r.prompt_ids) for r in self.requests),
                sum(r.max_new_tokens for r in self.requests))

    def shape(self) -> str:
        """One line: how many cases and requests, and what they exercise (progress lines)."""
        feats = sorted({f for r in self.requests for f in features(r)})
        extra = [f"delays {'+'.join(sorted(self.delays))}"] if self.delays else []
        extra += [c for _, c in self.controls]
        return (f"{self.cases} case(s), {len(self.requests)} request(s): {', '.join(feats) or 'greedy'}"
                + (f"; {', '.join(extra)}" if extra else ""))


def clone_request(r: Request) -> Request:
    c = copy.copy(r)
    c.prompt_ids, c.stop = list(r.prompt_ids), tuple(r.stop)
    c.extra = copy.deepcopy(getattr(r, "extra", None) or {})
    c.n = getattr(r, "n", 1)
    return c


def clone(case: ServedCase) -> ServedCase:
    return ServedCase([clone_request(r) for r in case.requests], copy.deepcopy(case.delays),
                      list(case.controls), case.cases)


def features(r: Request) -> list[str]:
    """The paths one request exercises, by what it asks for (the summary counts cases by these)."""
    from harness.targets.vllm import paths as vp
    ex = getattr(r, "extra", None) or {}
    out = []
    if r.temperature > 0:
        out.append("seeded" if r.seed is not None else "sampled")
    if getattr(r, "n", 1) > 1:
        out.append("n>1")
    if r.repetition_penalty != 1.0 or ex.get("presence_penalty") or ex.get("frequency_penalty"):
        out.append("penalties")
    for k in ("bad_words", "min_tokens", "logit_bias", "structured_outputs", "prompt_logprobs", "stream",
              "allowed_token_ids"):
        if ex.get(k):
            out.append(k)
    if ex.get("top_k") or ex.get("min_p"):
        out.append("top_k/min_p")
    if ex.get("chat"):  # harness.search.served_chat: a conversation, and client-set request ids
        out.append("chat")
    if "oh_x_vllm_priority" in ex:
        out.append("x-vllm-priority")
    cid = ex.get("oh_x_request_id", ex.get("request_id"))
    if cid is not None:
        out.append("duplicate_id" if "-dup-" in str(cid) else
                   "x-request-id" if "oh_x_request_id" in ex else "request_id")
    if r.stop or ex.get("stop_token_ids"):
        out.append("stop")
    out += [f"lp:{k}" for k, v in XARGS.items() if v in (ex.get("vllm_xargs") or {})]
    if r.max_new_tokens <= 2:
        out.append("max_tokens<=2")
    if len(r.prompt_ids) > vp.MAX_BATCHED_TOKENS:
        out.append("chunked_prefill")
    if len(r.prompt_ids) > vp.MAX_MODEL_LEN // 2:
        out.append("kv_pressure")
    if getattr(r, "shared_prefix", False):
        out.append("shared_prefix")
    if r.abort_after is not None:
        out.append("abort")
    if r.arrival:
        out.append("arrival")
    if getattr(r, "priority", 0):
        out.append("priority")
    return out


def case_features(case: ServedCase) -> list[str]:
    out = sorted({f for r in case.requests for f in features(r)})
    out += [f"delay:{k}" for k in sorted(case.delays)] + sorted({c for _, c in case.controls})
    return out


# -- drawing ------------------------------------------------------------------------------
def _words(draw, lo, hi):
    from harness.targets.vllm.workload import WORDS
    return " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=lo, max_size=hi)))


def _seeded_words(seed: int, n: int) -> str:
    from harness.targets.vllm.workload import WORDS
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


@st.composite
def requests(draw, tok, rid: str, vllm: bool = True, huge: bool = False, priority: bool = False):
    """One request; every option off in hypothesis's simplest example (a short greedy request).
    `huge`: one of a KV-pressure mix (see submissions): a prompt of 257-280 tokens and 40-56 more.
    `priority`: the servers run the priority policy (harness.targets.vllm.configs), so the request
    carries a priority 0-3 (drawn only then: every other configuration keeps its draws)."""
    from harness.targets.vllm import paths as vp
    from harness.targets.vllm import workload as vllm_workload
    kind = "huge" if huge else draw(st.sampled_from(("short", "long", "prefix")))
    text = (_words(draw, 2, 12) if kind in ("short", "prefix") else
            _words(draw, 70, 110) if kind == "long" else
            # its own first block: three equal prompts (hypothesis's simplest draw) share their blocks;
            # its words from one drawn seed: drawn one by one, hypothesis dropped most pressure
            # submissions for running past its budget of choices (2 of 50 drawn, for 18 coins)
            f"Part {rid}: " + _seeded_words(draw(st.integers(0, 2**32 - 1)), 300))  # > 64 tokens: chunked
    prompt = vllm_workload._ids(tok, text) if kind != "prefix" else vllm_workload._ids(tok, vllm_workload.PREFIX) + tok.encode(" " + text)
    # a huge prompt fills 9 blocks, and crosses into a 10th within 32 tokens of decoding: see submissions
    cut = draw(st.integers(9 * vp.BLOCK - 31, 9 * vp.BLOCK - 8)) if huge else vp.MAX_MODEL_LEN - 32
    max_tokens = draw(st.integers(40, 56) if huge else st.one_of(st.sampled_from((1, 2, 3)), st.integers(4, 24)))
    r = Request(rid=rid, prompt_ids=prompt[:cut], max_new_tokens=max_tokens)
    r.extra, r.n, r.shared_prefix = {}, 1, kind == "prefix"
    r.arrival = draw(st.sampled_from((0, 0, 2, 5, 10, 20)))
    sampling = draw(st.sampled_from(("greedy", "seeded", "sampled")))
    if sampling != "greedy":
        r.temperature = draw(st.sampled_from((0.7, 1.0)))
        r.top_p = draw(st.sampled_from((1.0, 0.9)))
        r.seed = draw(st.integers(0, 1 << 20)) if sampling == "seeded" else None
        if sampling == "seeded" and not huge and draw(st.booleans()):  # n > 1 shares the prompt's blocks
            r.n = draw(st.sampled_from((2, 3)))
        if vllm and draw(st.integers(0, 3)) == 3:  # the sampler's other truncations (vLLM's extra fields)
            r.extra.update(draw(st.sampled_from(({"top_k": 5}, {"min_p": 0.1}, {"top_k": 20, "min_p": 0.05}))))
    if (draw(st.booleans()) or huge) and vllm:
        r.ignore_eos = True
    # each option on in one request of four, independently: a set drawn whole (hypothesis's sets lean
    # to the empty one) gave a request penalties 3% of the time (7 of 32 runs of ~8 requests had one),
    # and bugs that need two readers of the output history in one batch need them far more often
    opts = {o for o in OPTIONS if draw(st.integers(0, 3)) == 3}  # 0, the simplest draw: off
    if not vllm:
        opts -= {"bad_words", "min_tokens", "regex", "lp", "stop_ids", "prompt_lp"}
    if huge:  # a pressure request must live its 40-56 tokens: nothing that may end it early
        opts -= {"min_tokens", "stop_str", "stop_ids", "regex"}
    period, comma = tok.encode(".")[-1], tok.encode(",")[-1]
    common = tok.encode(" the")[-1], tok.encode(" and")[-1]
    if "penalties" in opts:
        pick = draw(st.sampled_from(("repetition", "presence", "frequency", "all")))
        if pick in ("repetition", "all") and vllm:
            r.repetition_penalty = 1.3
        if pick in ("presence", "all"):
            r.extra["presence_penalty"] = 0.6
        if pick in ("frequency", "all") or (pick == "repetition" and not vllm):
            r.extra["frequency_penalty"] = 0.8
    if "bad_words" in opts:
        r.extra["bad_words"] = draw(st.lists(st.sampled_from((" slot table", " the", " cache", " two three",
                                                              " relay fence")), min_size=1, max_size=2, unique=True))
    if "min_tokens" in opts:
        k = draw(st.integers(1, max(1, max_tokens - 1)))
        r.extra["min_tokens"], r.extra["stop_token_ids"] = k, [period]
        if draw(st.booleans()):  # the stop token wins as soon as min_tokens lets it
            r.extra["logit_bias"] = {str(period): 100.0}
    if "logit_bias" in opts and "logit_bias" not in r.extra:
        r.extra["logit_bias"] = {str(common[0]): 4.0, str(common[1]): 4.0}
    if "stop_str" in opts:
        r.stop = tuple(draw(st.lists(st.sampled_from((",", ".", " table", " the")), min_size=1, max_size=2,
                                     unique=True)))
    if "stop_ids" in opts:
        r.extra["stop_token_ids"] = sorted(set(r.extra.get("stop_token_ids", [])) | {comma})
    if "regex" in opts:
        r.extra["structured_outputs"] = {"regex": draw(st.sampled_from((" [a-z]{3,8}-[0-9]{2,4}", " (yes|no)",
                                                                        " [0-9]{1,3}")))}
    if "lp" in opts:
        # boost forces its token past every mask, a grammar's too: under a regex the engine fails the
        # request in both arms (an error event mid-stream, measured on stock 0.32.0), nothing judged
        lp = draw(st.sampled_from([k for k in sorted(XARGS) if not ("regex" in opts and k == "boost")]))
        r.extra["vllm_xargs"] = {XARGS[lp]: f"{common[0]}:3" if lp == "boost" else 1}
    if "prompt_lp" in opts:  # judged like output logprobs by the surface oracle (harness.oracles.surface)
        r.extra["prompt_logprobs"] = draw(st.sampled_from((1, 2)))
    elif vllm and r.n == 1 and draw(st.integers(0, 3)) == 3:  # read as a stream, usage in its last chunk
        r.extra["stream"] = True
    # a client that disconnects reads a stream, and vLLM refuses prompt_logprobs on a stream (400)
    if (not huge and draw(st.integers(0, 4)) == 0 and r.n == 1 and max_tokens > 1
            and "prompt_logprobs" not in r.extra):
        r.abort_after = draw(st.integers(1, max_tokens - 1))
    if priority:  # lower runs first; a KV-pressure victim is the highest value (then the newest)
        r.priority = draw(st.integers(0, 3))
    return r


@st.composite
def submissions(draw, tok, cases: int = 4, vllm: bool = True, agent: bool = True, priority: bool = False,
                surface=None):
    """`cases` mixes merged into one submission, with its delays and controls (none on a target
    without our agent: `agent=False`); `priority`: every request carries a priority; `surface`
    (draw, tok, mixes, priority) -> mixes redraws some mixes over more of vLLM's request surface
    (harness.search.served_chat.submissions passes its own)."""
    mixes = [[draw(requests(tok, f"c{i}r{j}", vllm, priority=priority)) for j in range(draw(st.integers(1, 3)))]
             for i in range(cases)]
    if vllm and surface is not None:  # conversations, client ids, ... (harness.search.served_chat)
        mixes = surface(draw, tok, mixes, priority)
    delays, controls = {}, []
    if agent:
        for point in draw(st.sets(st.sampled_from(DELAY_POINTS), max_size=2)):
            if point == "before_wait" and draw(st.booleans()):  # hold the reader back a step or two
                delays[point] = {"p": draw(st.sampled_from((0.5, 1.0))), "steps": draw(st.sampled_from((1, 2)))}
            else:
                delays[point] = {"p": draw(st.sampled_from((0.2, 0.5, 1.0))), "ms": draw(st.sampled_from((2, 5, 20)))}
        for c in draw(st.sets(st.sampled_from(CONTROLS), max_size=2)):
            controls.append((draw(st.sampled_from((0.2, 0.5, 1.0))), c))
    # in one submission of four, the first mix fills the KV pool *while decoding*: three prompts of 9
    # blocks fit the path pair's 28 once prefilled (27), and each needs a 10th block within 32 tokens,
    # long before the first of them ends (40-56 tokens): the second to cross preempts the newest, a
    # decoding request with a step in flight under async. (Measured: prompts of 300-420 tokens
    # overfilled the pool during the third's prefill, so vLLM preempted that prefill, with no token in
    # flight, and the preempt_* source patches were never found.) The coin is a hash of everything
    # drawn before it, not a draw: hypothesis keeps choices across runs of examples, so a drawn coin
    # came up the same 6-16 times in a row (a 4-minute search saw 1 pressure mix in 22 runs).
    if vllm and agent and zlib.crc32(repr((mixes, delays, controls)).encode()) % 4 == 3:
        mixes[0] = [draw(requests(tok, f"c0r{j}", vllm, huge=True, priority=priority)) for j in range(3)]
        for r in mixes[0][1:]:  # sent together, so all three hold their blocks at once
            r.arrival = mixes[0][0].arrival
    return ServedCase([r for m in mixes for r in m], delays, sorted(controls), cases)
