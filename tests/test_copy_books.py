"""The worker's books at idle count the host buffers of our sampled-id copy (harness/agents/vllm/
copy_engine.py) that a reader has not handed back. The books are written after each step, before
the output thread reads that step's ids and frees its buffer; after a run's last step nothing else
rewrote them, so 0.11.0's gate read one buffer held at idle (a false finding of ours). The reader
now updates the books when it frees the buffer. Driven here without vLLM: the output object's
constructor and reader are stand-ins wrapped as the agent wraps vLLM's."""

import torch

from harness.agents.vllm import copy_engine, state


class _Output:
    def __init__(self, ids):
        self._sampled_token_ids = ids


def _wrapped_output_init():
    """The output's __init__ wrapped by the agent (its state made fresh by the fresh_agent fixture)."""
    return copy_engine.output_copy(lambda self, ids: _Output.__init__(self, ids))


def test_the_books_say_a_host_buffer_is_free_once_its_reader_freed_it(fresh_agent):
    init = _wrapped_output_init()
    def get_output(self):  # vLLM's reader: it waits on the copy's event, then reads the host ids
        self.async_copy_ready_event.synchronize()
        return self.sampled_token_ids_cpu.flatten().tolist()
    read = copy_engine.before_wait(get_output)
    out = _Output.__new__(_Output)
    init(out, torch.tensor([[7], [9]]))
    f = state.facts("worker")
    held = lambda: sum(1 for b in copy_engine.COPY.buffers if not b.free.is_set())  # noqa: E731
    f.set(books={"host_buffers_held": held(), "step": 1})  # the step's books, its buffer handed out
    assert f.data["books"]["host_buffers_held"] == 1
    assert read(out) == [7, 9]
    assert held() == 0 and f.data["books"]["host_buffers_held"] == 0
    assert f.data["books"]["step"] == 1  # the rest of the books as the step wrote them


def test_a_rank_whose_outputs_nobody_reads_does_not_block_its_third_step(fresh_agent):
    """TP (issue 45): only the output rank's step results go back to the engine core; vLLM drops the
    other ranks' unread (multiproc_executor._execute_worker_rpc). Without the buffer going back when
    its output dies, rank 1 blocked on its third step (two buffers) and rank 0 in the all-reduce."""
    import threading
    init = _wrapped_output_init()

    def steps():
        for i in range(5):  # each step's output made and dropped unread
            out = _Output.__new__(_Output)
            init(out, torch.tensor([[i]]))
            del out
    t = threading.Thread(target=steps, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "a step blocked on a host buffer nobody will hand back"
    # a buffer a later copy took is not freed by the dead output that held it before
    keep = _Output.__new__(_Output)
    init(keep, torch.tensor([[5]]))
    buf = keep._oh_buffer
    copy_engine.release_unread(buf, buf.writer - 1)
    assert not buf.free.is_set()
