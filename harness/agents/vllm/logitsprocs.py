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

Each class has BOTH runners' interfaces: V1's (`vllm.v1.sample.logits_processor`, built with
(vllm_config, device, is_pin_memory), `apply(logits)`) and V2's
(`vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor`, built with (vllm_config,
req_states), `add_request`, `apply(logits, ctx)`): the two runners read the same entry-point
group and each refuses a class that is not a subclass of its own interface, which would stop the
server from starting. A vLLM that lacks one interface (0.34 has no V1) gets the other alone; this
module never fails to import. On V2 the newest output token of a row is its input id (V2 feeds
the previously sampled id back on the device), read where the row's position is past the prompt.
"""
from __future__ import annotations

try:  # V1's interface (gone with the V1 runner in 0.34)
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor as _V1Adapter
    from vllm.v1.sample.logits_processor import LogitsProcessor as _V1
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates
except Exception:  # noqa: BLE001 - any failure here must leave the server able to start
    _V1 = _V1Adapter = process_dict_updates = None
try:  # V2's
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as _V2
except Exception:  # noqa: BLE001
    _V2 = None


def _bases(v1) -> tuple:
    return tuple(b for b in (v1, _V2) if b is not None) or (object,)


class _BothRunners:
    """The V2 side of a processor (and the dispatch between the two): per-slot arguments from
    add_request, the rows of this step from the context."""
    V2_ARG = ""  # the vllm_xargs key that makes a request ask

    def __init__(self, vllm_config, *rest):
        self.v2 = len(rest) == 1  # V2: (vllm_config, req_states); V1: (vllm_config, device, is_pin_memory)
        if self.v2:
            self.req_states = rest[0]
            self.slots: dict[int, object] = {}  # request slot -> its argument (a slot is reused: add_request resets)
        else:
            self._v1_init(vllm_config, *rest)

    def _v1_init(self, vllm_config, *rest) -> None:
        pass

    def add_request(self, req_idx: int, sampling_params) -> bool:  # V2
        arg = _xarg(sampling_params, self.V2_ARG)
        if arg:
            self.slots[req_idx] = arg
        else:
            self.slots.pop(req_idx, None)
        return bool(arg)

    def apply(self, logits, ctx=None):
        if ctx is None:  # V1: [batch, vocab]
            return self._v1_apply(logits)
        return self._v2_apply(logits, ctx)

    def _v2_rows(self, ctx):
        """(row, slot, position, input id, prompt length) of each asking row of this step."""
        slots = ctx.expanded_idx_mapping.tolist()  # [rows] -> request slot
        pos, ids = ctx.pos.tolist(), ctx.input_ids.tolist()
        plen = self.req_states.prompt_len.np
        return [(r, s, pos[r], ids[r], int(plen[s])) for r, s in enumerate(slots) if s in self.slots]

    def _v2_apply(self, logits, ctx):  # logits: [rows, vocab]
        for r, _s, pos, last, plen in self._v2_rows(ctx):
            _count(f"{self.COUNTER}_calls")
            if pos >= plen and _banned(last, logits.shape[-1], self.COUNTER):  # an output token is the input
                logits[r, last] = float("-inf")
        return logits

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


class NoRepeatProcessor(_BothRunners, *_bases(_V1Adapter)):
    """Bans the newest output token (its id read from the running list) at the next position."""
    KEY, COUNTER = NO_REPEAT, "lp_no_repeat"
    V2_ARG = NO_REPEAT

    def _v1_init(self, vllm_config, *rest) -> None:
        _V1Adapter.__init__(self, vllm_config, *rest)

    def _v1_apply(self, logits):
        return _V1Adapter.apply(self, logits)

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
    V2_ARG = NO_REPEAT_CLI


class BatchNoRepeatProcessor(_BothRunners, *_bases(_V1)):
    """The batch-level form, as a team writes one: keeps each asking row's running output list
    (a reference, updated by vLLM) through update_state, and bans each row's newest token."""
    KEY, COUNTER = BATCH_NO_REPEAT, "lp_batch"
    V2_ARG = BATCH_NO_REPEAT

    def _v1_init(self, vllm_config, *rest) -> None:
        self.rows: dict[int, list[int]] = {}  # batch index -> that request's output ids (vLLM's list)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        process_dict_updates(self.rows, batch_update,
                             lambda params, _prompt, out: out if _xarg(params, self.KEY) else None)

    def _v1_apply(self, logits):  # logits: [batch, vocab]
        for i, out in self.rows.items():
            _count(f"{self.COUNTER}_calls")
            if out and _banned(out[-1], logits.shape[-1], self.COUNTER):
                logits[i, out[-1]] = float("-inf")
        return logits


class BatchNoRepeatCliProcessor(BatchNoRepeatProcessor):
    """BatchNoRepeatProcessor given by --logits-processors."""
    KEY, COUNTER = BATCH_NO_REPEAT_CLI, "lp_batch_cli"
    V2_ARG = BATCH_NO_REPEAT_CLI


class BoostProcessor(_BothRunners, *_bases(_V1Adapter)):
    """Forces a token at every k-th output position (k from the request): length only."""
    V2_ARG = BOOST

    def _v1_init(self, vllm_config, *rest) -> None:
        _V1Adapter.__init__(self, vllm_config, *rest)

    def _v1_apply(self, logits):
        return _V1Adapter.apply(self, logits)

    def _v2_apply(self, logits, ctx):  # logits: [rows, vocab]; outputs so far: position + 1 - prompt
        for r, s, pos, _last, plen in self._v2_rows(ctx):
            _count("lp_boost_calls")
            token, every = (int(x) for x in str(self.slots[s]).split(":"))
            if pos + 1 >= plen and (pos + 1 - plen) % every == 0:
                logits[r, token] = logits[r].max() + 100.0
        return logits

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
