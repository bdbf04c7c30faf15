"""Custom logits processors the vLLM target loads: both kinds vLLM offers, each through both of
its channels, so no kind and no channel goes untested.

| kind | what it reads | --logits-processors (CLI) | `vllm.logits_processors` entry point |
|---|---|---|---|
| per request (`AdapterLogitsProcessor`) | output ids by VALUE | `NoRepeatCliProcessor` | `NoRepeatProcessor` |
| per request | how MANY output ids | `BoostProcessor` | - |
| batch level (`LogitsProcessor` + `update_state`) | output ids by VALUE | `BatchNoRepeatCliProcessor` | `BatchNoRepeatProcessor` |

The no-repeat ones ban each request's newest output token at the next position. Under async
scheduling that list holds a placeholder (-1) until the worker replaces it with the copied id
(vllm#26467, #27878), and vLLM 0.32.0 does that only when a processor was given on the command
line (vllm#52461): a processor that read the placeholder bans nothing, so its tokens differ from
the async-off server's. Each counts such reads (`*_placeholder_reads`).

They act only on requests that ask (`vllm_xargs`), and count what they did in the worker's
facts, so a suite can tell that the path ran. Imported inside vLLM's worker: torch and vLLM
only, besides the agent's facts.
"""
from __future__ import annotations

from vllm.v1.sample.logits_processor import AdapterLogitsProcessor, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

NO_REPEAT = "oh_no_repeat"  # vllm_xargs key: 1 bans each request's newest token at the next position
NO_REPEAT_CLI = "oh_no_repeat_cli"  # the same, by the CLI copy (one key each, so each channel is counted)
BATCH_NO_REPEAT = "oh_batch_no_repeat"  # the same, by the batch-level processor (entry point)
BATCH_NO_REPEAT_CLI = "oh_batch_no_repeat_cli"  # ... and its CLI copy
BOOST = "oh_boost"  # vllm_xargs key: "token:every" forces `token` at positions that are multiples of `every`


def _count(key: str, n: int = 1) -> None:
    from harness.agents.vllm import state
    if state.PLAN is not None:  # no plan: the agent is inert and so are our facts
        f = state.facts("worker")
        f.add(key, n)
        f.write()


def _xarg(params, key):
    return (getattr(params, "extra_args", None) or {}).get(key)


def _banned(last: int, vocab: int, counter: str) -> bool:
    """Whether `last` (a request's newest output id) can be banned; a placeholder is counted."""
    if last < 0 or last >= vocab:
        _count(f"{counter}_placeholder_reads")  # a placeholder where a token id belongs
        return False
    return True


class NoRepeatProcessor(AdapterLogitsProcessor):
    """Bans the newest output token (its id read from the running list) at the next position."""
    KEY, COUNTER = NO_REPEAT, "lp_no_repeat"

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        if not _xarg(params, self.KEY):
            return None
        counter = self.COUNTER

        def ban_last(output_ids, logits):  # logits: [vocab]
            _count(f"{counter}_calls")
            if output_ids and _banned(output_ids[-1], logits.shape[-1], counter):
                logits[output_ids[-1]] = float("-inf")
            return logits
        return ban_last


class NoRepeatCliProcessor(NoRepeatProcessor):
    """NoRepeatProcessor given by --logits-processors (its own key and counters)."""
    KEY, COUNTER = NO_REPEAT_CLI, "lp_no_repeat_cli"


class BatchNoRepeatProcessor(LogitsProcessor):
    """The batch-level form, as a team writes one: keeps each asking row's running output list
    (a reference, updated by vLLM) through update_state, and bans each row's newest token."""
    KEY, COUNTER = BATCH_NO_REPEAT, "lp_batch"

    def __init__(self, vllm_config, device, is_pin_memory):
        self.rows: dict[int, list[int]] = {}  # batch index -> that request's output ids (vLLM's list)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        process_dict_updates(self.rows, batch_update,
                             lambda params, _prompt, out: out if _xarg(params, self.KEY) else None)

    def apply(self, logits):  # logits: [batch, vocab]
        for i, out in self.rows.items():
            _count(f"{self.COUNTER}_calls")
            if out and _banned(out[-1], logits.shape[-1], self.COUNTER):
                logits[i, out[-1]] = float("-inf")
        return logits


class BatchNoRepeatCliProcessor(BatchNoRepeatProcessor):
    """BatchNoRepeatProcessor given by --logits-processors."""
    KEY, COUNTER = BATCH_NO_REPEAT_CLI, "lp_batch_cli"


class BoostProcessor(AdapterLogitsProcessor):
    """Forces a token at every k-th output position (k from the request): length only."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        spec = _xarg(params, BOOST)
        if not spec:
            return None
        token, every = (int(x) for x in str(spec).split(":"))

        def boost(output_ids, logits):  # logits: [vocab]
            _count("lp_boost_calls")
            if len(output_ids) % every == 0:
                logits[token] = logits.max() + 100.0
            return logits
        return boost
