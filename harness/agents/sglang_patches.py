"""SGLang overlap bugs re-created as source patches of the installed SGLang (as harness/agents/vllm/patches.py
does for vLLM): exact search/replace edits of sglang 0.5.23's own text, applied in a private
linked copy of the package (harness.targets.sglang.patched_copy) that only the overlap-on server of a
pair imports; the off server stays stock. Each names the class of the article it belongs to and
the upstream entries of the same kind, and the suite that must catch it.

A search text the installed SGLang no longer has is one clear error (PatchError);
tests/test_sglang_patches.py applies and compiles every patch against the real source.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.agents.sglang_points import WRITTEN_AGAINST

RESULTS = "srt/managers/scheduler_components/batch_result_processor.py"
RELAY = "srt/managers/overlap_utils.py"
SCHED = "srt/managers/scheduler.py"
BATCH = "srt/managers/schedule_batch.py"
GRAPH = "srt/model_executor/cpu_graph_runner.py"
NATIVE = "srt/layers/attention/torch_native_backend.py"


class PatchError(RuntimeError):
    """A patch does not apply to the installed SGLang (one line)."""


@dataclass(frozen=True)
class SglangPatch:
    name: str
    description: str
    suite: str  # the suite that must catch it
    file: str  # relative to the sglang package
    search: str  # exact source text, found exactly once in `file`
    replace: str
    upstream: tuple[str, ...] = ()
    also: tuple[tuple[str, str], ...] = ()

    @property
    def edits(self) -> tuple[tuple[str, str], ...]:
        return ((self.search, self.replace),) + self.also

    @property
    def point(self) -> str:
        return self.file.rsplit("/", 1)[-1]


EQUIV = "test_overlap_equivalence"
STEPS = "test_steps"  # tests/test_sglang_pair.py: the steps oracle (harness.oracles.steps) over both arms
PATHS = "test_paths"  # equivalence/test_paths.py's SGLang rows: a pool the path workload outgrows

PATCHES: dict[str, SglangPatch] = {p.name: p for p in [
    SglangPatch(
        "sglang_decode_reads_before_copy",
        "a result read before its copy: the decode result processor no longer waits on the step's "
        "copy-done event before it appends the sampled ids to each request (on a GPU it reads "
        "pinned memory the copy has not filled yet; on the CPU the agent's copy thread lands later)",
        EQUIV, RESULTS,
        "    def process_batch_result_decode(\n"
        "        self,\n"
        "        batch: ScheduleBatch,\n"
        "        result: GenerationBatchResult,\n"
        "    ):\n"
        "        if result.copy_done is not None:\n"
        "            result.copy_done.synchronize()\n",
        "    def process_batch_result_decode(\n"
        "        self,\n"
        "        batch: ScheduleBatch,\n"
        "        result: GenerationBatchResult,\n"
        "    ):\n",
        # the class: a host read of step N's output ids ahead of their copy's event
        ("sgl-project/sglang#8056",)),
    SglangPatch(
        "sglang_relay_entry_padded_row",
        "a relay entry written for a padded row: the last row of every relayed batch is written to "
        "FutureMap's entry 0 (the padding row's) instead of its own request's entry, so that request's "
        "next step gathers a stale token as its input",
        EQUIV, RELAY,
        "        else:\n"
        "            self.output_tokens_buf[indices] = payload.bonus_tokens.to(\n"
        "                self.output_tokens_buf.dtype\n"
        "            )\n",
        "        else:\n"
        "            if indices.shape[0] > 1:\n"
        "                indices = indices.clone()\n"
        "                indices[-1] = 0\n"
        "            self.output_tokens_buf[indices] = payload.bonus_tokens.to(\n"
        "                self.output_tokens_buf.dtype\n"
        "            )\n",
        # the same class in SGLang's JAX port: padded rows' entries overwrite live ones
        ("sgl-project/sglang-jax#1487", "sgl-project/sglang-jax#1504")),
    SglangPatch(
        "sglang_finish_check_late",
        "the finish check one step late: a request whose in-flight result finishes it by length is no "
        "longer left out of the next step, so the overlap loop runs a step past max_new_tokens for it "
        "(its sample thrown away: no token differs, a step is wasted)",
        STEPS, SCHED,
        "        if not self.enable_skip_finishing_decode or not self.result_queue:\n"
        "            return []\n",
        "        if True:\n"
        "            return []\n",
        # the class: overlap schedulers that decode a finished request once more
        ("sgl-project/sglang#25361", "sgl-project/mini-sglang#111")),
    SglangPatch(
        "sglang_decode_reservation_short",
        "a reservation one window short: overlap on, the capacity check before a decode step "
        "(ScheduleBatch.new_tokens_required_next_decode, plain decoding) counts the window the step in "
        "flight already allocated as the next step's, so it reserves one token a request too few: when "
        "the pool runs short the step is scheduled anyway and its allocation fails (SGLang's 'Out of "
        "memory', the scheduler dies) where stock SGLang retracts a request first",
        PATHS, BATCH,
        "            new_pages = sum(\n"
        "                1 for r in requests if r.kv.kv_committed_len % page_size == 0\n"
        "            )\n"
        "            return new_pages * page_size + num_beam_member_rows(requests)\n",
        "            new_pages = sum(\n"
        "                1 for r in requests if r.kv.kv_committed_len % page_size == 0\n"
        "            )\n"
        "            if self.enable_overlap:\n"
        "                new_pages = max(0, new_pages - len(requests))\n"
        "            return new_pages * page_size + num_beam_member_rows(requests)\n",
        # the class: the two-window reservation of speculative decoding's overlap (eagle_prepare_for_decode,
        # get_alloc_reserve_per_decode's 2x) and the out-of-memory crashes of a short one
        ("sgl-project/sglang#14972", "sgl-project/sglang#13741", "sgl-project/sglang#14645")),
    SglangPatch(
        "sglang_pad_rows_not_reset",
        "a padded row that is not entry 0's: when the CPU graph runner pads a decode batch up to the "
        "captured size, it no longer points the padded rows back at req-pool row 0 and KV slot 0; they "
        "keep the rows and KV slots of the last padded replay, i.e. of requests that ran in that step, "
        "and the graph writes the padded rows' K/V into those requests' slots. Only a padded batch "
        "shows it (the runner's own buffers are used only when a batch is padded)",
        PATHS, GRAPH,
        "        captured_forward_batch.out_cache_loc.zero_()\n"
        "        # Pair with seq_lens fill: padded rows must point at reserved\n"
        "        # req_pool slot 0 (req_to_token[0, :] is all zeros from init).\n"
        "        captured_forward_batch.req_pool_indices.zero_()\n",
        "",
        # the class: padded graph rows writing into live entries (SGLang's JAX port; SGLang's
        # allocators keep slot 0 for padded tokens for this reason)
        ("sgl-project/sglang-jax#1487", "sgl-project/sglang-jax#1504")),
    SglangPatch(
        "sglang_war_barrier_no_wait",
        "a table write without the fence: the write-after-read barrier still consumes the forward's "
        "read-done event but no longer makes the schedule stream wait on it (or on the forward stream), "
        "so the scheduler's req_to_token writes for step N+1 are not ordered after step N's reads (on a "
        "CPU nothing races: the agent's fence model, harness.agents.sglang_fence, judges the order)",
        PATHS, SCHED,
        "        if ev is not None and not envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():\n"
        "            self.schedule_stream.wait_event(ev)\n"
        "        else:\n"
        "            self.schedule_stream.wait_stream(self.forward_stream)\n",
        "",
        # the barrier's fix; its removal off CUDA; memory faults on ROCm without it
        ("sgl-project/sglang#26380", "sgl-project/sglang#26646", "sgl-project/sglang#38258")),
    SglangPatch(
        "sglang_read_done_before_reads",
        "the fence's event recorded before the reads: torch_native attention declares that its prefill "
        "reads of req_to_token end with its metadata (SharedReadEnds.PRE_REPLAY, as a backend that "
        "snapshots the table may), so the eager runner publishes a read-done event right after "
        "init_forward_metadata and the barrier waits on it; torch_native reads req_to_token in every "
        "layer after that event, so the scheduler's next writes are ordered after none of those reads",
        PATHS, NATIVE,
        "class TorchNativeAttnBackend(AttentionBackend):\n"
        "    def __init__(self, model_runner: ModelRunner):\n",
        "class TorchNativeAttnBackend(AttentionBackend):\n"
        "    def shared_read_ends(self, fm):\n"
        "        from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds\n"
        "\n"
        "        return SharedReadEnds.PRE_REPLAY\n"
        "\n"
        "    def __init__(self, model_runner: ModelRunner):\n",
        # where a backend's shared reads end, and the read-done event's placement
        ("sgl-project/sglang#28363", "sgl-project/sglang#31687", "sgl-project/sglang#34052")),
]}


def apply(p: SglangPatch, text: str) -> str:
    for search, replace in p.edits:
        n = text.count(search)
        if n != 1:
            raise PatchError(f"SGLang patch {p.name}: its search text occurs {n} times in sglang/{p.file} "
                             f"(written against SGLang {WRITTEN_AGAINST})")
        text = text.replace(search, replace)
    return text


def check_names(names, exc=ValueError) -> None:
    unknown = sorted(set(names) - set(PATCHES))
    if unknown:
        raise exc(f"unknown SGLang patch {', '.join(unknown)}; known: {', '.join(PATCHES)}")
