"""The catalogue of injectable defects: each one a mistake the seed article warns about.

A fault is a name in EngineConfig.faults; the engine checks for it at the one
place the defect lives. Each entry says which suite must catch it; the kill
matrix (`overlap-harness mutants`) runs every suite against every fault.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    section: str  # of the seed article
    suite: str  # the suite that must catch it (races/<suite>.py or equivalence/...)
    ordering: bool = True  # a missing order between streams (stress can provoke its corruption)
    # upstream issues / pull requests of the same class ("project#number"), where one exists
    upstream: tuple[str, ...] = ()


CATALOGUE: dict[str, Fault] = {f.name: f for f in [
    Fault("no_fence", "the schedule stream never waits for the running step's table reads", "7.3",
          "test_war_slot_table", upstream=("sglang#26380", "sglang#26646")),
    Fault("fence_before_read", "the fence event is recorded before the step's last read of req_to_token",
          "7.4", "test_fence_placement", upstream=("sglang#28363",)),
    Fault("unfenced_row_reuse", "a finished request's row is handed to a new request and rewritten on a "
          "stream the fence does not hold", "7.2", "test_war_slot_table", upstream=("sglang#26380", "sglang#31687")),
    Fault("single_input_buffer", "step inputs live in one buffer, rewritten for step N+1 while step N "
          "still reads them after the fence", "7.1", "test_war_slot_table", upstream=("vllm#31841",)),
    Fault("blocking_copy", "a blocking copy on the schedule stream: the host stalls a full forward", "7.5",
          "test_nonblocking_copies", ordering=False, upstream=("sglang#26380",)),
    Fault("copy_no_wait", "the copy stream does not wait for the forward before copying the tokens", "7.1",
          "test_war_slot_table"),
    Fault("early_process", "the result is processed before its copy-done event", "2.1",
          "test_war_slot_table", upstream=("vllm#36013",)),
    Fault("skip_prefill_publish", "the prefill does not write its token into the relay, so the first decode "
          "reads an entry before it was written for its request", "4.2", "test_relay_hygiene"),
    Fault("penalty_from_cpu", "the repetition penalty uses the CPU's one-step-old tokens, missing the "
          "newest one under overlap", "6", "test_overlap_equivalence", ordering=False,
          upstream=("vllm#27878", "vllm#26467")),
    Fault("single_window", "speculative: one window reserved instead of two, so a window that starts a full "
          "window past the CPU's count runs off the reserved slots", "5.2", "test_reservation"),
    Fault("cpu_count_for_len", "speculative: the step takes its length from the CPU's one-step-old count "
          "instead of the relay", "4.1", "test_provoked_corruption"),
    Fault("ngram_no_wait", "NGRAM looks up drafts without waiting for the accepted tokens' copy", "8.3",
          "test_war_slot_table", upstream=("vllm#36013",)),
    Fault("lengths_on_schedule", "speculative: the lengths are copied to the host on the schedule stream, "
          "behind the fence: the host stalls a full forward", "7.5", "test_nonblocking_copies", ordering=False,
          upstream=("sglang#26380",)),
    Fault("draft_extend_after_fence", "mtp: the fence event is recorded before draft extend, which reads the "
          "slot table again", "7.4", "test_fence_placement", upstream=("sglang#28363",)),
    Fault("wait_before_issue", "the host waits for step N's result before issuing step N+1: tokens stay "
          "right, the GPU idles between steps again (overlap silently lost)", "2.1", "test_overlap_effective",
          ordering=False),
    Fault("stale_logprobs", "the host reads a step's logprob records from the other step's pinned buffer: "
          "tokens stay right, each record belongs to another token", "2.1", "test_overlap_equivalence",
          ordering=False),
    Fault("packed_prefill_slip", "a prefill of several requests samples each one's first token from its "
          "neighbour's last position (an index slip in the packed batch): overlap on and off corrupt alike, "
          "a request alone is right", "3", "test_overlap_equivalence", ordering=False),
    Fault("verify_wastes_last_draft", "speculative: verify never accepts a window's last draft token (its "
          "match is dropped): tokens stay right, every fully right window wastes a draft", "5",
          "test_spec_acceptance", ordering=False),
    Fault("abort_drops_inflight", "aborting a running request ends it at once, dropping the step already "
          "in flight: it gets one token fewer than documented (a waiting request ends at once, a running one "
          "after one more step)", "2.1", "test_abort", ordering=False),
    Fault("pad_live_entry", "padded rows write a live relay entry instead of entry 0", "4.3",
          "test_relay_hygiene"),
    Fault("live_entry_zero", "the row / entry allocator hands out 0, so a live request owns relay entry 0 and "
          "slot-table row 0, which padded rows write", "4.3", "test_relay_hygiene", ordering=False),
    Fault("reused_host_buffer", "the sampling parameters are staged in one pinned host buffer reused every "
          "step: the host rewrites it for step N+1 while step N's non-blocking copy from it is still queued",
          "7.1", "test_war_slot_table", upstream=("vllm#24527", "vllm#25279", "vllm#31841")),
    Fault("early_free", "a request's pages go back to the pool when the CPU plans its last step (the count "
          "advanced at schedule time), while that dispatched step still reads and writes them", "6",
          "test_slot_ownership", ordering=False,
          upstream=("vllm-ascend#13501", "vllm-ascend#14055", "vllm#45357")),
    Fault("window_off_by_one", "speculative: the device places each window one position late, writing past "
          "the accepted length and, at full acceptance, one slot past the reservation (the CPU's view of "
          "the window stays right)", "5.2", "test_slot_ownership", ordering=False),
    # leaks (issue 23): every token stays right; only the books say a resource never came back
    Fault("dedup_keeps_page", "a request whose prompt page another request cached first is pointed at the "
          "cached page, and its own duplicate is never freed: the pool shrinks by a page each time", "5.3",
          "test_conservation", ordering=False),
    Fault("dedup_first_page_kept", "the prefix cache's dedup test is off by one character (`i > have`): a "
          "request whose first computed page another request cached first keeps its own copy, counted as "
          "cached, so it is never freed", "5.3", "test_conservation", ordering=False),
    Fault("abort_keeps_row", "a request aborted with a step in flight ends when that step is processed, and "
          "that path forgets to return its slot-table row: one request at a time, the next one waits for a "
          "row forever (HANG)", "4.2", "test_conservation", ordering=False),
    Fault("retract_keeps_entry", "a retracted request gives back its pages and row but keeps its relay "
          "entry; readmitted, it takes another, until no entry is left and admission stops (HANG)", "5.3",
          "test_conservation", ordering=False),
    Fault("evict_ref_twice", "admission holds a matched prefix while it evicts others and takes each "
          "node's reference twice on that path (the second by hand, past the cache's lock count), releasing "
          "it once: a reference no request owns stays on those pages, never evictable, and every count still "
          "adds up", "5.3", "test_conservation", ordering=False),
    Fault("abort_prefix_double_ref", "the client's abort of a running request whose prompt was a prefix-cache "
          "hit takes its cached pages' references again (released once, when its step in flight ends it): "
          "those pages are never evictable again; only a run where a client abort meets a prefix hit shows it",
          "5.3", "test_combos", ordering=False),
]}


def check_names(names, exc=ValueError) -> None:
    unknown = sorted(set(names) - set(CATALOGUE))
    if unknown:
        raise exc(f"unknown fault {', '.join(unknown)}; known: {', '.join(CATALOGUE)}")
