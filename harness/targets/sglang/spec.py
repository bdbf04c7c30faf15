"""SGLang's server configurations with a drafter (`check --target sglang --configs ngram`; SGLang's
counterpart of harness/targets/vllm/configs.py) and the speculative rows of its path table.

The drafter is SGLang's own (NGRAM: no draft model, drafts looked up on the CPU in a trie of the
text served so far) in its spec-v2 workers, the article's overlap path: the relay carries the new
length and the accepted tokens to the next step, the CPU reserves two windows a request before each
step, the next window starts with the bonus token. On these CPUs it needs our CPU path
(harness/targets/sglang/cpu_path/speculative_cpu.py): the adaptations are listed in CPU_ADAPTATIONS
and named in the gate's verdict.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.targets.vllm.paths import PathRow


@dataclass(frozen=True)
class SglangConfig:
    name: str
    drafter: str  # one line for the verdict
    args: tuple[str, ...]
    # the path rows this configuration cannot exercise here, and why (measured)
    absent: tuple[tuple[str, str], ...] = ()
    env: tuple[str, ...] = ()  # "VAR=value" for both servers
    model: str = ""  # "split": the model two ranks divide (harness.targets.split_model)
    # non-empty: SGLang (this release) cannot run it on a CPU, measured; the line says why, from the code
    cpu_refused: str = ""

    def flags(self) -> str:
        return " ".join([*self.env, *self.args] + ([f"(model {self.model})"] if self.model else []))


DRAFT_TOKENS = 4  # the window: the bonus token and 3 drafts
# NGRAM's tree breadth is SGLang's topk; with 2, steps = 4 // 2 = 2 and one window of the reservation
# is max(steps * topk, draft tokens) = 4 = the window (allocation_sizing.get_alloc_len_per_decode), so
# the two reserved windows are exactly 8 slots, as in the article's figure 7
BFS_BREADTH = 2

# the pair runs without the CPU graph runner, so no batch is padded and entry 0 is not exercised
GRAPH_RUNNER_REFUSES = ("SGLang's CPU graph runner refuses a drafter (model_executor/cpu_graph_runner.py:663 "
                        "asserts spec_algorithm.is_none()): no decode batch is padded, so no padded row reads entry 0")

# measured 0/0 in the gate (07:58): NGRAM has no grammar overlap, so no delayed sample
GRAMMAR_SYNC = ("NGRAM takes a grammar batch synchronously (speculative/spec_info.py supports_grammar_overlap is "
                "False for it, so Scheduler.is_disable_overlap_for_batch processes the previous result first): no "
                "step is launched before the previous token reached the grammar")


def _ngram(name: str, tokens: int, breadth: int, why: str) -> SglangConfig:
    return SglangConfig(name, f"NGRAM (SGLang's n-gram trie, no draft model; window {tokens}: the bonus token and "
                        f"{tokens - 1} drafts, tree breadth {breadth}{why}; greedy verify: SGLang verifies greedily on "
                        "a CPU whatever the temperature, eagle_utils._verify_uses_greedy)",
                        ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(tokens),
                         "--speculative-ngram-max-bfs-breadth", str(breadth)),
                        absent=(("relay_entry_0", GRAPH_RUNNER_REFUSES), ("grammar_delayed_sample", GRAMMAR_SYNC)))


# the drafter's shape is part of the configuration stress draws (one pair start each): the gate's
# window of 4 in a tree of breadth 2; a chain of 3 (breadth 1: one window = 3 slots); a wide tree of 8
CONFIGS = {c.name: c for c in [
    _ngram("ngram", DRAFT_TOKENS, BFS_BREADTH, ""),
    _ngram("ngram-chain", 3, 1, " (a chain)"),
    _ngram("ngram-wide", 8, 4, ""),
    # beyond one worker (issue 45): a scheduler process per rank, each with its own pool and rows;
    # no drafter ("" drafter). One core per rank: SGLang's CPU backend binds each rank's OpenMP
    # threads to the cores SGLANG_CPU_OMP_THREADS_BIND names, "|" between ranks
    SglangConfig("tp2", "", ("--tp", "2"), absent=(("relay_entry_0", "the tp2 pair runs without the CPU graph "
                                                    "runner (a torch.compile per rank): no batch is padded"),),
                 env=("SGLANG_CPU_OMP_THREADS_BIND=0|1",), model="split"),
]}


def runs_in_all(c: SglangConfig) -> bool:
    """`all` (check, stress): the drafters a CPU runs; several ranks (tp2) and a drafter that needs a
    GPU (standalone) run only when named."""
    return bool(c.drafter) and not c.cpu_refused


def stress_order(spec: str, error) -> list[str]:
    """stress's --configs for SGLang: NAME,...|all|all,-NAME,...; NAME: default (no drafter) or a
    drafter's configuration."""
    known = ["default", *CONFIGS]
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if parts and (parts[0] == "all" or parts[0].startswith("-")):
        drop = {p[1:] for p in parts if p.startswith("-")}
        # all: default and the drafters; a configuration of several ranks (tp2) only when named
        names = [n for n in known if n not in drop and (n == "default" or runs_in_all(CONFIGS[n]))]
        bad = [p for p in parts[1 if parts[0] == "all" else 0:] if not p.startswith("-")] + sorted(drop - set(known))
    else:
        names, bad = parts, [p for p in parts if p not in known]
    if bad or not names:
        raise error(f"unknown SGLang server configuration {', '.join(bad) or spec!r}; known: {', '.join(known)}")
    return names


CPU_ADAPTATIONS = (
    "overlap kept on with a drafter (SGLang 0.5.23 turns it off on CPU: "
    "arg_groups/speculative_hook.py:66-78 _disable_overlap_schedule_for_cpu)",
    "speculative kernels of a CPU sgl_kernel build supplied in PyTorch (reconstruct_indices_from_tree_mask, "
    "assign_extend_cache_locs_cpu, verify_tree_greedy_cpu, fill_accept_out_cache_loc_cpu; "
    "sglang/cpu_path/sgl_kernel/spec_ops.py)",
    "torch_native attention's target-verify branch (sglang/cpu_path/speculative_cpu.py: the AMX backend's has one)",
)


def parse(spec: str, error) -> list[str]:
    """NAME,...|all: the configurations asked for, in order."""
    # all: the drafters; a configuration of several ranks (tp2) runs only when named, as vLLM's do
    names = [n for n, c in CONFIGS.items() if runs_in_all(c)] if spec.strip() == "all" else \
        [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise error(f"unknown SGLang server configuration {', '.join(unknown) or spec!r}; known: {', '.join(CONFIGS)}")
    return names


PAST_RESERVATION = ("spec_past_reservation", "verify windows running past the slots the CPU reserved for "
                    "them before the step (the agent's first: first_spec_reservation_violation)")
BONUS_WRONG = ("spec_bonus_wrong", "windows whose first token is not the last token the previous step "
               "accepted for that request (the agent's first: first_spec_bonus_violation)")

RELAY_LEN_WRONG = ("spec_relay_len_wrong", "windows not starting at the length the request's previous step "
                   "published (its start plus its accepted tokens: the relay's new_seq_lens)")
RELAY_TOKENS_WRONG = ("spec_relay_tokens_wrong", "windows whose drafter spliced from the relay other tokens than "
                      "the request's previous step added (the agent's first: first_spec_relay_tokens_violation)")
CONTEXT_TWICE = ("spec_context_twice", "windows drafted from a context holding the previous step's tokens twice: "
                 "spliced from the relay although that step's result was already in the request's tokens (the "
                 "agent's first: first_spec_context_twice)")
SLOTS_WRONG = ("spec_window_slots_wrong", "windows writing their drafts' K/V to a slot not reserved for the "
               "request: free, slot 0, another request's, or twice (the agent's first: "
               "first_spec_window_slots_violation)")

SPEC_ROWS = [
    PathRow("spec_verify", "decode steps verify a window of drafts a request (the drafter's verify pass)",
            ("spec_verify_steps",)),
    PathRow("spec_accepted", "requests of a verify step with at least one draft accepted (repetitive prompts "
            "whose continuation the trie has seen)", ("path_spec_accepted",)),
    PathRow("spec_rejected", "requests of a verify step with a draft rejected (the bonus token replaces it)",
            ("path_spec_rejected",)),
    PathRow("spec_reservation", "each verify window lies inside the slots reserved before the step (the "
            "CPU's count plus two windows): none is written past them", ("path_spec_reservation",),
            violations=PAST_RESERVATION),
    PathRow("spec_second_window", "overlap on: the CPU's count lags a step, and the window reaches into the "
            "second reserved window (the case it exists for)", ("path_spec_second_window",), arm="on"),
    PathRow("spec_bonus", "each window starts with the bonus token the previous step accepted for its "
            "request (overlap on: carried by the relay, not yet in the request's tokens)",
            ("path_spec_bonus",), violations=BONUS_WRONG),
    PathRow("spec_bonus_batched", "the same, for the rows after the first of a batch of several (where a "
            "stride error shows)", ("path_spec_bonus_batched",), violations=BONUS_WRONG),
    PathRow("spec_relay_len", "each window starts at the length the request's previous step published (the "
            "relay's new_seq_lens: its start plus its accepted tokens; after a prefill, the prefill's length)",
            ("path_spec_relay_len",), violations=RELAY_LEN_WRONG),
    PathRow("spec_relay_tokens", "overlap on: the drafter splices the previous step's accepted tokens from the "
            "relay (FutureMap's NGRAM rows, by req-pool row), not yet in the request's tokens: they must be "
            "exactly what that step added", ("path_spec_relay_tokens",), arm="on", violations=RELAY_TOKENS_WRONG),
    PathRow("spec_relay_reuse", "a request's first window on a req-pool row (the relay's entry) that a "
            "finished request used before: nothing of the old request's reaches it", ("path_spec_relay_reuse",),
            violations=RELAY_TOKENS_WRONG),
    PathRow("spec_draft_context", "overlap on: a decode window whose previous step's result was already taken "
            "(another batch, a prefill, ran between its two decode steps): the drafter must not splice that "
            "step's tokens from the relay again", ("path_spec_prev_processed",), arm="on", violations=CONTEXT_TWICE),
    PathRow("spec_window_slots", "each window writes its drafts' K/V only to slots reserved for its request "
            "(out_cache_loc: none free, none slot 0, none another request's, none twice)",
            ("path_spec_window_slots",), violations=SLOTS_WRONG),
    PathRow("spec_retraction", "the pool cannot keep two windows reserved for every running request: SGLang "
            "retracts (check_decode_mem counts the spec reservation) and no window runs past what is left",
            ("path_retraction",), violations=PAST_RESERVATION),
    PathRow("spec_overlap", "overlap on: each verify step's result is taken after the next step was launched "
            "(grammar batches apart: NGRAM syncs on them by design); judged on its share",
            ("path_spec_one_step_old",), arm="on"),
    PathRow("spec_acceptance", "a request's windows, on vs off: where both arms built the same window (start, "
            "drafts), it accepts the same tokens (requests whose tokens diverge are the token oracle's)",
            ("spec_verify_steps",)),
]
SPEC_ROW_NAMES = tuple(r.name for r in SPEC_ROWS)

# STANDALONE: a draft model (SGLang's EAGLE-v2 worker, eagle_worker_v2 / standalone_worker_v2). On this
# CPU the scheduler died at init, measured 2026-12-07 (/work/cache-sspec3/probe): the draft model's
# attention backends come from DraftBackendFactory, whose maps have no torch_native entry
STANDALONE_CPU = ("SGLang 0.5.23's draft-model worker needs a draft attention backend torch_native lacks: "
                  "speculative/draft_utils.py:64 DraftBackendFactory._create_backend raises \"EAGLE is not "
                  "supported in decode attention backend torch_native\" at scheduler init (measured; the maps' only "
                  "CPU entry, intel_amx, runs torch.ops.sgl_kernel CPU kernels that no PyPI build has); run it on a "
                  "GPU (ci/gpu-check.sh step 11)")
TARGET_MODEL = "{target-model}"  # the server's own model path, filled in by the target (a drafter for itself)
_NGRAM_ONLY = ("the agent judges NGRAM's windows only (harness/agents/sglang/spec.py wraps NGRAMWorker); a draft "
               "model's EAGLE-v2 worker is not wrapped")
CONFIGS["standalone"] = SglangConfig(
    "standalone", "STANDALONE (a draft model: the served model drafting for itself, SGLang's EAGLE-v2 worker; "
    "2 draft steps, topk 1, a window of 3)",
    ("--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", TARGET_MODEL,
     "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"),
    absent=tuple((r, _NGRAM_ONLY) for r in SPEC_ROW_NAMES), cpu_refused=STANDALONE_CPU)


def row_absent(row: str, config: SglangConfig | None) -> str:
    """"n/a in configuration X: why" for a drafter's row where the pair runs no drafter (`config`:
    the pair's configuration, None for the default one): that path does not exist there, so it is
    neither a pass nor a failure to exercise. With a drafter configured "" : a drafter's row that
    then never runs is the row's own `not exercised` (its count stays 0)."""
    if row not in SPEC_ROW_NAMES or (config is not None and config.drafter):
        return ""
    drafters = ", ".join(n for n, c in CONFIGS.items() if c.drafter)
    return (f"n/a in configuration {config.name if config is not None else 'default'}: {row}: no drafter "
            f"(a drafter's row; the configurations {drafters} run one: check --target sglang --configs ngram)")


def violation_lines(on: dict, off: dict) -> list[tuple[str, str]]:
    """(counter, line) for each speculative judgement of the agent that fired on either arm (counter
    deltas of a run): what stress reports as a finding of a drafter's configuration."""
    out = []
    for counter, what in dict.fromkeys(r.violations for r in SPEC_ROWS if r.violations):
        for arm, c in (("on", on), ("off", off)):
            if c.get(counter, 0) > 0:
                out.append((counter, f"overlap {arm}: {c[counter]} {what}"))
    return out


def tag(reqs, tok) -> list:
    """The path workload with the speculative rows: the ten long plain requests serve them, plus
    repetitive prompts whose continuation the n-gram trie finds (acceptance)."""
    from harness.targets.vllm.workload import path_request, token_ids
    for r in reqs:  # the long plain requests (p0-p9): a penalty's, a grammar's or an abort's findings stay
        # in their own rows (measured: pen0's penalty divergence failed every spec row when tagged here)
        if "retraction" in r.paths:
            r.paths = list(r.paths) + list(SPEC_ROW_NAMES)
    texts = ["1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "Monday, Tuesday, Wednesday, Thursday, Friday,",
             "red green blue red green blue red green blue", "a b c d e f g h i j k l m n"]
    for i, text in enumerate(texts):
        r = path_request(f"s{i}", token_ids(tok, text), 48, list(SPEC_ROW_NAMES), arrival=i % 2)
        r.temperature = 0.0
        reqs.append(r)
    return reqs


def acceptance_line(counts: dict, arm: str) -> str:
    """Acceptance over a run from the agent's counters (both arms should agree for greedy requests)."""
    prop, acc = counts.get("spec_drafts_proposed", 0), counts.get("spec_drafts_accepted", 0)
    windows = counts.get("path_spec_reservation", 0)
    if not prop:
        return f"acceptance (overlap {arm}): no draft proposed"
    return (f"acceptance (overlap {arm}): {acc} of {prop} drafts accepted ({100 * acc / prop:.0f}%) over "
            f"{counts.get('spec_verify_steps', 0)} verify steps, {windows} windows; mean accept length "
            f"{1 + acc / max(1, windows):.2f}")


# the steps oracle counts one token a step; with a drafter a step gives 1 to n tokens a request, and the
# accepted lengths differ between the arms (the trie's state at a lookup depends on the timing: measured
# 167/27/21/78 vs 163/22/13/83 windows accepting 1/2/3/4), so a request's step count may differ with no bug
STEPS_WITH_DRAFTER = ("the steps oracle counts one token a step; a drafter's step gives 1 to n tokens a request and "
                      "the accepted lengths differ between the arms (the n-gram trie's state depends on timing), so "
                      "step counts are not comparable")


# overlap on the speculative steps: below this share of verify results taken one step old (after the
# next launch), over at least MIN_SPEC_RESULTS of them, the overlap is lost there (the tail of a run,
# where no next step exists, and grammar batches are the only ones SGLang takes at once)
MIN_SPEC_SHARE = 0.5
MIN_SPEC_RESULTS = 20


def overlap_line(counts: dict) -> tuple[bool | None, str]:
    """(lost?, line) for the speculative steps of the overlap-on arm; None: too few to judge."""
    judged, old = counts.get("spec_results", 0), counts.get("path_spec_one_step_old", 0)
    sync = counts.get("spec_results_sync", 0)
    line = (f"overlap on the speculative steps: {old} of {judged} verify results taken after the next launch"
            + (f" ({old / judged:.0%})" if judged else "") + f"; {sync} grammar batches taken at once (by design)")
    if judged < MIN_SPEC_RESULTS:
        return None, line + f": too few to judge (< {MIN_SPEC_RESULTS})"
    return old / judged < MIN_SPEC_SHARE, line


def accept_lengths_line(facts: list[dict], arm: str) -> str:
    """The server's accepted lengths over its life (the scheduler's facts): for the gate's verdict."""
    from harness.targets.vllm.paths import counts
    c, hist = counts(facts), {}
    for f in facts:
        for k, n in (f.get("spec_accept_hist") or {}).items():
            hist[int(k)] = hist.get(int(k), 0) + int(n)
    return acceptance_line(c, arm) + (f"; accept lengths {dict(sorted(hist.items()))}" if hist else "")


def windows_of(facts: list[dict]) -> dict:
    """rid -> (request key, [[window signature, accepted signature], ...]) from the scheduler's facts."""
    out = {}
    for f in facts:
        for rid, (key, wins) in (f.get("spec_windows") or {}).items():
            out[rid] = (key, [tuple(w) for w in wins])
    return out


def speed_line(counts: dict, wall_s: float, arm: str) -> str:
    steps = counts.get("spec_verify_steps", 0)
    return (f"speed (overlap {arm}): {steps} verify steps in {wall_s:.1f} s of the path workload "
            f"({steps / wall_s:.2f} steps/s)" if wall_s > 0 else f"speed (overlap {arm}): not timed")


def acceptance_verdict(reqs, off_run, on_run, on: dict, off: dict) -> tuple[str, list, int]:
    """(line, findings, windows judged) of a drafter's windows on vs off (harness.oracles.spec_steps
    .compare): while both arms built a request the same windows (start, drafts), the same tokens
    accepted. Requests whose tokens diverge are the token oracle's (a near tie decided otherwise changes
    the windows after it); aborted ones stop wherever their abort lands."""
    from harness.agents.vllm.steps import request_key
    from harness.oracles import spec_steps
    from harness.oracles.reference import divergences
    diverged = {d.rid.split("#")[0] for _, _, divs in divergences(off_run, on_run) for d in divs}
    keys = [request_key(r.prompt_ids, r.max_new_tokens) for r in reqs
            if r.rid not in diverged and not getattr(r, "abort_after", None)]
    found, compared, parted = spec_steps.compare(on, off, keys)
    alike = same_windows(on, off, keys)
    line = (f"spec_acceptance: {alike} window(s) built alike on both arms judged, over {compared} request(s) "
            f"({len(diverged)} with diverging tokens left out); {parted} request(s) whose windows part between the "
            f"arms (other drafts: the n-gram trie's state depends on timing)")
    return line, found, alike


def same_windows(on: dict, off: dict, keys) -> int:
    """How many windows both arms built alike (same start, same drafts), request by request from the
    first until they part: what the acceptance comparison judged (0: not exercised)."""
    def by_key(acc):
        out: dict = {}
        for key, wins in acc.values():
            out.setdefault(key, []).append(wins)
        return {k: sorted(v) for k, v in out.items()}
    a, b, n = by_key(on), by_key(off), 0
    for key in set(keys):
        for w_on, w_off in zip(a.get(key, ()), b.get(key, ())):
            for (k, _), (k2, _) in zip(w_on, w_off):
                if k != k2:
                    break
                n += 1
    return n
