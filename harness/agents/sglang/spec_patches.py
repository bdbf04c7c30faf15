"""SGLang's speculative-decoding overlap bugs re-created as source patches (the mechanism and rules of
harness/agents/sglang/patches.py, which merges these into PATCHES): each is an exact edit of 0.5.23's
own text that only the overlap-on server of a pair imports. Caught by the speculative rows
(harness/agents/sglang/spec.py's judgements, the gate's `spec` rows), stock quiet.
"""
from __future__ import annotations

SPEC = "test_paths"  # the speculative rows of the SGLang path table (harness/targets/sglang/spec.py)
CONFIG = "ngram"  # they need a drafter: check --target sglang --configs ngram --fault NAME
SIZING = "srt/mem_cache/allocation_sizing.py"
NGRAM = "srt/speculative/ngram_worker.py"


def spec_patches(SglangPatch) -> list:
    return [
        SglangPatch(
            "sglang_spec_reservation_one_window",
            "the decode reservation short by a window: get_alloc_reserve_per_decode reserves one window "
            "beyond the CPU's count instead of two, so with overlap on, where the CPU's count lags the "
            "GPU's length by the step in flight (its accepted tokens and bonus token), the next window "
            "runs past the reserved slots: it reads req_to_token cells never reserved for the request "
            "and writes its K/V into whatever slots they hold (the capacity check shrinks with it, so no "
            "retraction covers it)",
            SPEC, SIZING,
            "    return 2 * get_alloc_len_per_decode()\n",
            "    return get_alloc_len_per_decode()\n",
            # check_decode_mem / the spec reservation short for the speculative stages; overlap + retract
            ("sgl-project/sglang#13741", "sgl-project/sglang#14645", "sgl-project/sglang#14972"), config=CONFIG),
        SglangPatch(
            "sglang_spec_bonus_stride",
            "the relayed tokens read with the wrong stride for batches over one: NGRAM's draft preparation "
            "(overlap only: the previous step's accepted tokens are not in req.output_ids yet and come "
            "from the relay, rows of speculative_num_draft_tokens) steps through them by the drafts-only "
            "width (num_draft_tokens - 1): request 0 is right, request i > 0 splices tokens of the wrong "
            "row, so its window starts from a wrong bonus token and its drafts from a wrong context",
            SPEC, NGRAM,
            "        stride = self.draft_token_num\n",
            "        stride = self.draft_token_num - 1\n",
            # the bonus-token / verified-id stride of spec v2 for batches over one
            ("sgl-project/sglang#13741", "sgl-project/sglang#14645"), config=CONFIG),
    ]
