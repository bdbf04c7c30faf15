"""Custom logits processors the vLLM target loads, one each way vLLM offers:

- `NoRepeatProcessor` through the `vllm.logits_processors` entry point (pyproject.toml): it
  reads the VALUE of each request's newest output token and bans it for the next position.
  Under async scheduling that list holds a placeholder (-1) until the worker has replaced it
  with the copied id (vllm#26467, #27878): a processor that read the placeholder would ban
  nothing, so its tokens would differ from the async-off server's. It counts such reads.
- `BoostProcessor` through `--logits-processors harness.agents.vllm_logitsprocs:BoostProcessor`:
  forces a token at every k-th output position; it reads only how MANY tokens there are.

Both act only on requests that ask (`vllm_xargs`), and count what they did in the worker's
facts, so a suite can tell that the path ran. Imported inside vLLM's worker: torch and vLLM
only, besides the agent's facts.
"""
from __future__ import annotations

from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

NO_REPEAT = "oh_no_repeat"  # vllm_xargs key: 1 bans each request's newest token at the next position
BOOST = "oh_boost"  # vllm_xargs key: "token:every" forces `token` at positions that are multiples of `every`


def _count(key: str, n: int = 1) -> None:
    from harness.agents import vllm_plugin
    if vllm_plugin._PLAN is not None:  # no plan: the agent is inert and so are our facts
        f = vllm_plugin._facts("worker")
        f.add(key, n)
        f.write()


def _xarg(params, key):
    return (getattr(params, "extra_args", None) or {}).get(key)


class NoRepeatProcessor(AdapterLogitsProcessor):
    """Bans the newest output token (its id read from the running list) at the next position."""

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        if not _xarg(params, NO_REPEAT):
            return None

        def ban_last(output_ids, logits):  # logits: [vocab]
            _count("lp_no_repeat_calls")
            if not output_ids:
                return logits
            last = output_ids[-1]
            if last < 0 or last >= logits.shape[-1]:
                _count("lp_placeholder_reads")  # a placeholder where a token id belongs
                return logits
            logits[last] = float("-inf")
            return logits
        return ban_last


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
