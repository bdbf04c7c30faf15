"""The vLLM agent's worker side on vLLM's V2 model runner (harness.agents.vllm.v2.points).

harness.agents.vllm.install keeps the engine core's and the API server's side (shared by both
runners) and calls install() here when the worker runs V2. What it does on V2, point by point:
- the runner's facts: "runner": "v2", the async setting the engine asked for (V2's runner always
  hands back an AsyncOutput; whether the engine core overlaps is the scheduler's decision);
- the worker's step (execute_model): the worker_execute delay, the forward's times (what the
  overlap verdict compares the engine core's schedules with), the worker's books after each step;
- the sampled-id copy (AsyncOutput): on a CPU, V2's streams and events are no-ops (cpu/shm.py)
  and `.to("cpu", non_blocking=True)` is a synchronous copy, so the race its event guards cannot
  happen. The agent gives it a GPU's asynchrony, as it does for V1: the copy runs on the copy
  thread (harness.agents.vllm.copy_engine.CopyEngine) into a host buffer that is reused (two, each handed out again
  only after its reader is done), and copy_event is set when the copy has landed; the output
  thread's get_output waits on it. Delays output_copy (in the copy) and before_wait (before the
  wait) and the faults sampled_ids_no_wait / pinned_buffer_reuse act here as on V1;
- path counters with V1's names where the path is the same (penalty_steps, bad_words_steps,
  logit_bias_steps, min_tokens_steps, grammar_steps, custom_lp_steps, seeded_discards) and V2's
  own (v2_row_reuses, v2_resumed_rows, v2_device_fed_rows);
- the worker's books: the request state's rows (requests, rows naming a request, rows not free).
"""
from __future__ import annotations

import threading
import time
import weakref

from harness.agents.vllm import ranks
from harness.agents.vllm.v2 import kernels, ngram, shared, spec
from harness.agents.vllm.points import patch_at
from harness.agents.vllm.v2.points import POINTS_BY_NAME, points_in

_plan, _facts = shared.plan, shared.facts


class V2AgentError(RuntimeError):
    pass


def patch(point: str, make) -> None:
    patch_at(POINTS_BY_NAME[point], make, lambda detail: V2AgentError(f"overlap-harness agent (V2 runner): {detail}"))


# -- the runner and its step ------------------------------------------------------------------
def _runner_init(orig):
    def __init__(self, vllm_config, *a, **kw):
        orig(self, vllm_config, *a, **kw)
        f = _facts("worker")
        f.set(runner="v2", runner_class=type(self).__name__,
              use_async_scheduling=bool(vllm_config.scheduler_config.async_scheduling), async_outputs=0,
              **ranks.rank_facts())
        shared.register_stack_dump()
        f.write(True)
    return __init__


def _worker_execute(orig):
    def execute_model(self, scheduler_output, *a, **kw):
        if kw.get("dummy_run"):  # warm-up and profiling: not a step
            return orig(self, scheduler_output, *a, **kw)
        _plan().delay("worker_execute")
        f = _facts("worker")
        if "forward_inline" not in f.data and shared.engine_thread() is not None:
            f.set(forward_inline=threading.get_ident() == shared.engine_thread())
            f.write(True)
        t, t_ns = time.monotonic(), time.monotonic_ns()
        _hook_forward(self)
        out = None
        try:
            out = orig(self, scheduler_output, *a, **kw)
            return out
        finally:
            if not getattr(self, "_oh_forward_hooked", False):  # a model the hook cannot see: judged here
                shared.forward_begins()
            if out is not None:  # no sample_tokens follows: the step ends here
                shared.measured(time.monotonic() - t)
            else:  # the step ends when sample_tokens returns (v2_sample_tokens)
                self._oh_step_start = t
            shared.forwards().append((t_ns, time.monotonic_ns()))
            f.set(forwards=[list(x) for x in shared.forwards()])
            try:
                f.add("books_steps")
                f.set(books={**worker_books(self), "step": f.data["books_steps"]})
            except Exception as e:  # the books must never break the engine
                f.set(books_error=f"worker (v2): {e}")
            f.write()
    return execute_model


def _hook_forward(runner) -> None:
    """The worker's own overlap on V2 (issue 45: pp2's sampling stage runs V2): from the start of a
    step's sampled-id copy (AsyncOutput, inside sample_tokens: shared.watch_copy) to the next
    forward, did this thread wait on that copy? Watched from the copy's start, not the next step's
    arrival as on V1: on CPU our copy thread lands it before V2's next step arrives (pp2's last
    stage: 0 of 338 steps in flight at arrival, 11 of 340 at sample_tokens' return), so only a
    watch from the start judges every step. execute_model calls the model itself, so the forward's
    start is the model's forward pre-hook, registered once. A stage that samples nothing (PP, all
    but the last) has no copy and counts nothing."""
    m = getattr(runner, "model", None)
    if m is None or getattr(runner, "_oh_forward_hooked", False) or not hasattr(m, "register_forward_pre_hook"):
        return
    m.register_forward_pre_hook(lambda module, args: shared.forward_begins())
    runner._oh_forward_hooked = True


def _sample_tokens(orig):
    """V2's step is execute_model (inputs, forward) then sample_tokens (logits, sampling, the
    sampled-id copy): the step's time, for delays given in steps, and the forward's recorded end
    run to the end of the sample."""
    def sample_tokens(self, *a, **kw):
        try:
            return orig(self, *a, **kw)
        finally:
            t = getattr(self, "_oh_step_start", None)
            if t is not None:
                self._oh_step_start = None
                shared.measured(time.monotonic() - t)
                fw = shared.forwards()
                if fw:
                    fw[-1] = (fw[-1][0], time.monotonic_ns())
                    _facts("worker").set(forwards=[list(x) for x in fw])
    return sample_tokens


def worker_books(runner) -> dict:
    """The V2 worker's books: each request keeps a row of the request state from admission to its
    end, so at idle no request, no row naming one, and no row out of the free list."""
    st = runner.req_states
    copy = shared.current_copy()
    return {"runner_requests": len(st.req_id_to_index), "batch_rows": len(st.index_to_req_id),
            "batch_slots": st.max_num_reqs - len(st.free_indices), "generators": 0,
            "host_buffers_held": sum(1 for b in (copy.buffers if copy else ()) if not b.free.is_set())}


# -- the sampled-id copy, asynchronous on CPU --------------------------------------------------
def _output_copy(orig):
    def __init__(self, model_runner_output, sampler_output, *a, **kw):
        orig(self, model_runner_output, sampler_output, *a, **kw)
        _facts("worker").add("async_outputs")
        src = sampler_output.sampled_token_ids
        if src.device.type != "cpu":
            return  # a real device: vLLM's own copy stream and event are the real thing
        dst, done, self._oh_buffer = shared.copy_engine_().start(src)
        shared.copy_started(done)  # what the next step's forward must not wait for (the worker's overlap):
        shared.watch_copy()  # from the copy's start to the next forward, a wait of this thread on it is late
        self.sampled_token_ids = dst.numpy()  # a view of the reused host buffer, as pinned memory is
        self.copy_event = done
        # V2 hands back an AsyncOutput for every step, and its kernel warm-up drops some unread:
        # the buffer goes back when the output dies, as pinned memory goes back to its allocator,
        # but only if no later copy took it since. vLLM's output thread keeps the output it handled
        # last alive until the next one arrives, so with three steps in flight (pp2's queue) an
        # output died after a later copy took its buffer; freeing it then let the third copy
        # overwrite ids their reader had not read yet: a request lost a token (the pp2 finding)
        weakref.finalize(self, shared.release_unread, self._oh_buffer, done.seq)
    return __init__


def _before_wait(orig):
    def get_output(self):
        _plan().delay("before_wait", shared.step_period())
        ev = self.copy_event
        if _plan().fault("sampled_ids_no_wait"):
            self.copy_event = shared.no_wait()
        try:
            return orig(self)
        finally:
            self.copy_event = ev
            buf = getattr(self, "_oh_buffer", None)
            if buf is not None:
                if buf.writer != getattr(ev, "seq", buf.writer) and not _plan().fault("pinned_buffer_reuse"):
                    _facts("worker").add("buffer_overwritten")  # the agent's own error (copy_engine.before_wait)
                ev.synchronize()  # the copy has landed before the buffer is handed out again
                buf.free.set()
            _facts("worker").write()
    return get_output


# -- path counters ----------------------------------------------------------------------------
def _counted(key_fn):
    """A patch that calls the original and adds key_fn(self, args, result) -> {name: n} to the
    worker's facts (a counter never breaks the engine)."""
    def make(orig):
        def counted(*a, **kw):
            out = orig(*a, **kw)
            try:
                f = _facts("worker")
                for k, n in key_fn(a, kw, out).items():
                    if n:
                        f.add(k, int(n))
            except Exception as e:
                _facts("worker").set(counter_error=f"v2 {getattr(orig, '__name__', orig)}: {e}")
            return out
        return counted
    return make


def _penalties(a, kw, out):
    import numpy as np
    self, ctx = a[0], a[2] if len(a) > 2 else kw.get("ctx")
    return {"penalty_steps": int(bool(np.any(self.use_penalty[ctx.idx_mapping_np])))}


def _bad_words(a, kw, out):
    self, ctx = a[0], a[2] if len(a) > 2 else kw.get("ctx")
    return {"bad_words_steps": int(int(self.num_bad_words.np[ctx.idx_mapping_np].max()) > 0)}


def _logit_bias(a, kw, out):
    import numpy as np
    self, ctx = a[0], a[2] if len(a) > 2 else kw.get("ctx")
    rows = ctx.idx_mapping_np
    n = {"logit_bias_steps": int(bool(np.any(self.num_logit_bias.np[rows] > 0)))}
    stops = self.num_stop_token_ids.np[rows] > 0
    if np.any(stops):  # a stop token is held back where the row's position is under min_len
        pos = ctx.pos.cpu().numpy() if hasattr(ctx.pos, "cpu") else np.asarray(ctx.pos)
        exp = ctx.expanded_idx_mapping.cpu().numpy()
        held = [(self.num_stop_token_ids.np[r] > 0) and (p < self.min_lens.np[r]) for r, p in zip(exp, pos)]
        n["min_tokens_steps"] = int(any(held))
    return n


def _sampler(a, kw, out):
    self = a[0]
    custom = [p for p in self.logits_processors if not type(p).__module__.startswith("vllm.")]
    return {"custom_lp_steps": int(bool(custom))}


def _grammar(a, kw, out):
    ids = a[3] if len(a) > 3 else kw.get("grammar_req_ids")
    return {"grammar_steps": int(bool(ids))}


def _postprocess(a, kw, out):
    """Seeded samples thrown away (a partial prefill chunk samples nothing: num_sampled 0). V2 draws
    seeded noise from the seed and the position, so nothing is rewound: the path is counted."""
    self = a[0]
    idx = a[1] if len(a) > 1 else kw["idx_mapping"]
    num_sampled = a[3] if len(a) > 3 else kw["num_sampled"]
    rows = idx.cpu().numpy()
    seeded = self.sampler.sampling_states.seeds_set if self.sampler is not None else None
    if seeded is None:
        return {}
    ns = num_sampled.cpu().numpy()
    return {"seeded_discards": sum(1 for r, n in zip(rows, ns) if r >= 0 and n == 0 and seeded[r])}


def _combine(a, kw, out):
    """Decode rows whose input id is read from last_sampled_tokens (the device-side feed)."""
    seq_lens = a[4] if len(a) > 4 else kw["seq_lens"]
    prefill_len = a[5] if len(a) > 5 else kw["prefill_len"]
    idx = a[1] if len(a) > 1 else kw["idx_mapping"]
    rows = idx.cpu()
    n = int((seq_lens[:rows.shape[0]].cpu() > prefill_len.cpu()[rows]).sum())
    return {"v2_device_fed_rows": n}


_ROW_HELD: set = set()  # request-state rows some request has held in this process


def _add_request(a, kw, out):
    self = a[0]
    req_id = a[1] if len(a) > 1 else kw["req_id"]
    prompt_len = a[2] if len(a) > 2 else kw["prompt_len"]
    all_ids = a[3] if len(a) > 3 else kw["all_token_ids"]
    max_tokens = a[5] if len(a) > 5 else kw.get("max_tokens")
    spec.remember(req_id, list(all_ids)[:prompt_len], max_tokens)  # a window's key (harness.agents.vllm.v2.spec)
    row = self.req_id_to_index.get(req_id)
    reused = row in _ROW_HELD
    _ROW_HELD.add(row)
    return {"v2_row_reuses": int(reused), "v2_resumed_rows": int(len(all_ids) > prompt_len)}


# -- Triton's interpreter on a CPU ---------------------------------------------------------------
def _topk_topp(orig):
    """See the point v2_topk_topp: vLLM's PyTorch top-k/top-p masking (the path vLLM takes without
    Triton) where the interpreter cannot run the Triton kernel. Both servers of a pair run it."""
    import os

    def apply_top_k_top_p(logits, k, p, *a, **kw):
        if (k is None and p is None) or logits.device.type != "cpu" or os.environ.get("TRITON_INTERPRET") != "1":
            return orig(logits, k, p, *a, **kw)
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
        _facts("worker").add("v2_topk_topp_pytorch")
        return apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)
    return apply_top_k_top_p


COUNTERS = {"v2_penalties": _penalties, "v2_bad_words": _bad_words, "v2_logit_bias": _logit_bias,
            "v2_sampler": _sampler, "v2_grammar": _grammar, "v2_postprocess": _postprocess,
            "v2_combine": _combine, "v2_add_request": _add_request}
PATCHES = {"v2_runner_init": _runner_init, "v2_worker_execute": _worker_execute,
           "v2_sample_tokens": _sample_tokens,
           "v2_output_copy": _output_copy, "v2_before_wait": _before_wait,
           "v2_topk_topp": _topk_topp, "v2_topk_topp_states": _topk_topp, **kernels.PATCHES, **ngram.PATCHES,
           **spec.PATCHES}


def install(version: str | None) -> list[str]:
    """Patch V2's worker points that `version` has (the plan, facts, copy engine and step clock are
    the vLLM agent's: harness.agents.vllm.v2.shared). Returns the points patched."""
    here = {p.name for p in points_in(version)}
    done = []
    for point, make in PATCHES.items():
        if point in here:
            patch(point, make)
            done.append(point)
    for point, fn in COUNTERS.items():
        if point in here:
            patch(point, _counted(fn))
            done.append(point)
    return done
