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

CONFIGS = {c.name: c for c in [
    SglangConfig("ngram", f"NGRAM (SGLang's n-gram trie, no draft model; window {DRAFT_TOKENS}: the bonus token and "
                 f"{DRAFT_TOKENS - 1} drafts, tree breadth {BFS_BREADTH}; greedy verify)",
                 ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(DRAFT_TOKENS),
                  "--speculative-ngram-max-bfs-breadth", str(BFS_BREADTH)),
                 absent=(("relay_entry_0", GRAPH_RUNNER_REFUSES),)),
    # beyond one worker (issue 45): a scheduler process per rank, each with its own pool and rows;
    # no drafter ("" drafter). One core per rank: SGLang's CPU backend binds each rank's OpenMP
    # threads to the cores SGLANG_CPU_OMP_THREADS_BIND names, "|" between ranks
    SglangConfig("tp2", "", ("--tp", "2"), absent=(("relay_entry_0", "the tp2 pair runs without the CPU graph "
                                                    "runner (a torch.compile per rank): no batch is padded"),),
                 env=("SGLANG_CPU_OMP_THREADS_BIND=0|1",), model="split"),
]}

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
    names = [n for n, c in CONFIGS.items() if c.drafter] if spec.strip() == "all" else \
        [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise error(f"unknown SGLang server configuration {', '.join(unknown) or spec!r}; known: {', '.join(CONFIGS)}")
    return names


PAST_RESERVATION = ("spec_past_reservation", "verify windows running past the slots the CPU reserved for "
                    "them before the step (the agent's first: first_spec_reservation_violation)")
BONUS_WRONG = ("spec_bonus_wrong", "windows whose first token is not the last token the previous step "
               "accepted for that request (the agent's first: first_spec_bonus_violation)")

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
]
SPEC_ROW_NAMES = tuple(r.name for r in SPEC_ROWS)


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
