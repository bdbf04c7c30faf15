"""Bug classes of vLLM's V2 model runner, re-created as source patches of a private copy of vLLM.

Like harness.agents.vllm.patches (V1), each is an exact search/replace of vLLM's own text (the
V2 runner's, identical in 0.32.0, 0.33.0 and 0.34.0 where these edits land; tests/test_vllm_v2.py
applies and compiles each against every cached release), applied only to the async-on server's
copy, so the suites compare a patched V2 with stock vLLM. V2's Triton kernels run in Triton's
interpreter on a CPU (TRITON_INTERPRET=1), which executes the kernels' Python source: a patch of
a kernel is a patch of what runs.

V2 keeps a request's state in one row of RequestState from its admission to its end, the previous
step's ids on the device, and penalty counts on the device; so its async bugs are not V1's
placeholder bugs but these classes. Each names the V1 bug of the same class where no V2 one is
public (the upstream field), and the path row whose workload exercises it.
"""
from __future__ import annotations

# plain data: harness.agents.vllm.patches makes each a VllmPatch in its registry (one registry for
# --fault, `faults`, `mutants` and the patched copy), and vllm_releases.PATCH_SINCE says from
# which release each applies; importing neither here keeps the modules free of an import cycle
PATHS_SUITE = "test_paths"

INPUT_BATCH = "v1/worker/gpu/input_batch.py"
STATES = "v1/worker/gpu/states.py"
ASYNC = "v1/worker/gpu/async_utils.py"
PENALTIES = "v1/worker/gpu/sample/penalties.py"
PROVOKED = "test_provoked_delays"  # a copy held back (output_copy) is what a missing wait reads early

SPECS: list[dict] = [dict(zip(("name", "description", "path", "suite", "file", "search", "replace", "upstream"), s))
                     for s in [
    # -- where the previous step's sampled ids live -------------------------------------------
    (
        "v2_last_sampled_stale_row",
        "post_update stores a request's newest sampled id at its position in this step's batch "
        "instead of its request-state row: the row combine_sampled_and_draft_tokens reads for the "
        "next step keeps a stale id (an older token of the request, or of the row's last holder), "
        "which becomes the next input id", "penalties", PATHS_SUITE, INPUT_BATCH,
        "        tl.store(last_sampled_tokens_ptr + req_state_idx, token_id)\n",
        "        tl.store(last_sampled_tokens_ptr + req_id, token_id)\n",
        ("tenstorrent/vllm#395", "vllm-project/vllm#41177")),
    # -- positions after a preemption or a cache reset --------------------------------------------
    (
        "v2_resume_position_off_by_one",
        "a request re-added after a preemption or a prefix-cache reset (its prefill holds output "
        "ids: prefill_len > prompt_len) gets its device-side num_computed_tokens one short of the "
        "scheduler's: every later position of it is off by one and it samples a position it "
        "already has", "preemption", PATHS_SUITE, STATES,
        "        self.num_computed_tokens.stage_write_elem(req_idx, num_computed_tokens)\n",
        "        self.num_computed_tokens.stage_write_elem(\n"
        "            req_idx, max(num_computed_tokens - int(prefill_len > prompt_len), 0)\n"
        "        )\n",
        ("vllm-project/vllm#28787", "vllm-project/vllm#41190")),
    # -- penalty counts kept on the device --------------------------------------------------------
    (
        "v2_penalty_counts_twice",
        "post_update counts each sampled id twice in output_bin_counts (as an update run both "
        "where a token is sampled and where it is written back would): frequency penalties "
        "weigh every output token double", "penalties", PATHS_SUITE, INPUT_BATCH,
        "            tl.store(token_ptr, count + 1)\n",
        "            tl.store(token_ptr, count + 2)\n",
        ("vllm-project/vllm#27878",)),
    (
        "v2_penalty_counts_lost_on_resume",
        "a request re-added after a preemption or a reset has its counts rebuilt from its prompt "
        "alone: the outputs it already produced are not counted at all, so its penalties forget "
        "them", "preemption", PATHS_SUITE, PENALTIES,
        "        mask = block < prefill_len\n"
        "        mask &= block >= prompt_len\n",
        "        mask = block < prompt_len\n"
        "        mask &= block >= prompt_len\n",
        ("vllm-project/vllm#27878", "vllm-project/vllm#28787")),
    # -- a request's state reused by the next request of its row ----------------------------------
    (
        "v2_row_counts_inherited",
        "a new request with penalties takes a row without its output counts being cleared: it "
        "inherits the counts of the row's last holder (every row's counts grow with each sample, "
        "penalised or not), and is penalised for tokens it never produced", "penalties", PATHS_SUITE,
        PENALTIES,
        "    output_bin_counts.index_fill_(0, idx_long, 0)\n",
        "",
        ("tenstorrent/vllm#395", "vllm-project/vllm#26467")),
    # -- the sampled-id copy and its event --------------------------------------------------------
    (
        "v2_copy_read_before_event",
        "the output thread reads the host copy of the sampled ids before waiting on copy_event: on "
        "a device it reads a host buffer the copy has not landed in (on a CPU only once the agent "
        "makes the copy asynchronous, as a GPU's is)", "penalties", PROVOKED, ASYNC,
        "        self.copy_event.synchronize()\n"
        "\n"
        "        # NOTE(woosuk): The following code is to ensure compatibility with\n"
        "        # the existing model runner.\n"
        "        # Going forward, we should keep the data structures as NumPy arrays\n"
        "        # rather than Python lists.\n"
        "        sampled_token_ids: list[list[int]] = self.sampled_token_ids.tolist()\n",
        "        # NOTE(woosuk): The following code is to ensure compatibility with\n"
        "        # the existing model runner.\n"
        "        # Going forward, we should keep the data structures as NumPy arrays\n"
        "        # rather than Python lists.\n"
        "        sampled_token_ids: list[list[int]] = self.sampled_token_ids.tolist()\n"
        "        self.copy_event.synchronize()\n",
        ("vllm-project/vllm#24527", "vllm-project/vllm#25279")),
]]

# the runner each patch needs: a V2 patch on a V1 server changes code that never runs
RUNNER = {s["name"]: "v2" for s in SPECS}
