"""Per-request step books inside SGLang's scheduler (the steps oracle, harness.oracles.steps, reads
them as it reads vLLM's: the same FIELDS, role "steps").

Counted at the points the agent already wraps: a launched step (Scheduler.run_batch) schedules
every request of its batch, and samples for each but a prefill chunk that is not the prompt's last
(the scheduler's `chunked_req` at launch); a retraction (ScheduleBatch.retract_decode) is a
preemption; a processed result that finished a request (Scheduler.process_batch_result) gives its
finish, in the oracle's words. Waits are not counted on SGLang (0 on both arms).
"""
from __future__ import annotations

from collections import OrderedDict

from harness.agents.vllm.steps import request_key

KEEP = 4096  # the newest requests' records (a long stress run must not grow the facts file forever)
FINISH = {"FINISH_LENGTH": "FINISHED_LENGTH_CAPPED", "FINISH_ABORT": "FINISHED_ABORTED"}


class StepBooks:
    def __init__(self, facts):
        self.facts = facts  # a plan.Facts with role "steps"
        self.reqs: OrderedDict = OrderedDict()  # SGLang rid -> [key, scheduled, sampled, waited, pending, preempted, finish]

    def _rec(self, r):
        rid = getattr(r, "rid", None)
        rec = self.reqs.get(rid)
        if rec is None:
            max_new = getattr(getattr(r, "sampling_params", None), "max_new_tokens", None)
            rec = self.reqs[rid] = [request_key(list(getattr(r, "origin_input_ids", ()) or ()), max_new),
                                    0, 0, 0, 0, 0, ""]
            while len(self.reqs) > KEEP:
                self.reqs.popitem(last=False)
        return rec

    def launched(self, sched, batch) -> None:
        chunked = getattr(sched, "chunked_req", None)
        for r in getattr(batch, "reqs", None) or ():
            rec = self._rec(r)
            rec[1] += 1
            if r is not chunked:  # a middle chunk samples nothing
                rec[2] += 1
        self.publish()

    def retracted(self, reqs) -> None:
        for r in reqs:
            self._rec(r)[5] += 1
        self.publish()

    def processed(self, reqs) -> None:
        done = False
        for r in reqs:
            fin = getattr(r, "finished_reason", None)
            if fin is not None and not self._rec(r)[6]:
                self._rec(r)[6] = FINISH.get(type(fin).__name__, "FINISHED_STOPPED")
                done = True
        self.publish(force=done)  # a finish is written at once: the client may already hold the answer

    def publish(self, force: bool = False) -> None:
        self.facts.set(requests=dict(self.reqs))
        self.facts.write(force)


def client_key(r) -> str:
    """An SGLang request as the client knows it (prompt ids, max_new_tokens), "" without a prompt."""
    max_new = getattr(getattr(r, "sampling_params", None), "max_new_tokens", None)
    ids = list(getattr(r, "origin_input_ids", ()) or ())
    return request_key(ids, max_new) if ids else ""
