"""An lm-eval model ("overlap-ref") that runs the reference engine in-process.

    lm_eval --model overlap-ref --model_args model=arith,overlap=False --tasks gsm8k ...

after `import harness.evals.lm` (the import registers it). Each generate_until call runs
all of its requests as one workload on a fresh engine, so overlap on and off see the same
batches, and the batch composition (which rows and slots get reused) is the engine's own.
"""
from __future__ import annotations

import time

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from harness.engine.config import EngineConfig
from harness.engine.request import Request

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default when a task does not say


def _as_bool(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _faults(v) -> frozenset:
    if v is None or v == "":
        return frozenset()
    if isinstance(v, str):
        return frozenset(x for x in v.replace("+", ",").replace("|", ",").split(",") if x)
    return frozenset(v)


def _largest(ok, lo: int, hi: int) -> int | None:
    """Largest x in [lo, hi] with ok(x), for ok monotone (true then false); None if none."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_request(check, r: Request, want: int) -> None:
    """Make r fit the engine (check = Engine.check_fits): fewer new tokens if the row is short,
    and if fewer than `want` would remain, left-truncate the prompt (keeping BOS) as lm-eval's
    HF model truncates contexts."""
    if check(r) is None:
        return
    mt, ids = r.max_new_tokens, r.prompt_ids

    def fits_mt(m):
        r.max_new_tokens = m
        return check(r) is None
    best = _largest(fits_mt, 1, mt)
    if best is not None and best >= min(want, mt):
        r.max_new_tokens = best
        return
    r.max_new_tokens = min(want, mt)

    def fits_keep(k):
        r.prompt_ids = ids[:1] + ids[len(ids) - k:]
        return check(r) is None
    keep = _largest(fits_keep, 1, len(ids) - 1)
    if keep is None:
        r.prompt_ids = ids
        raise ValueError(check(r))
    r.prompt_ids = ids[:1] + ids[len(ids) - keep:]


class EngineFailure(RuntimeError):
    """The engine raised mid-run: an error to report, never an accuracy result."""


@register_model("overlap-ref")
class OverlapRefLM(LM):
    def __init__(self, model: str = "arith", overlap=True, policy: str = "serial", seed=0, faults=None,
                 max_running=16, page_size=1, pool_slots=4096, max_context=None, prefix_cache=True,
                 max_prefill_tokens=1024, threads=None, device: str = "sim", max_gen_toks=DEFAULT_MAX_GEN_TOKS,
                 background=0, progress=None, spec=None, spec_k=3, spec_wrong=0.3, **_ignored):
        super().__init__()
        self.cfg = EngineConfig(model=model, overlap=_as_bool(overlap), device=device, policy=policy,
                                seed=int(seed), max_running=int(max_running), pool_slots=int(pool_slots),
                                page_size=int(page_size), prefix_cache=_as_bool(prefix_cache),
                                max_prefill_tokens=int(max_prefill_tokens),
                                max_context=None if max_context in (None, "", "None") else int(max_context),
                                faults=_faults(faults), threads=None if threads in (None, "", "None") else int(threads),
                                # speculative decoding is honoured, never dropped (issue 10, item 9)
                                spec=None if spec in (None, "", "None") else str(spec), spec_k=int(spec_k),
                                spec_wrong=float(spec_wrong))
        self.max_gen_toks = int(max_gen_toks)
        self.background = int(background)
        self.progress = progress  # called as progress(done, total)
        self.last_summary: dict = {}
        from harness.engine.build import build_engine
        self._build = build_engine
        build_engine(self.cfg)  # fail now (missing model) rather than mid-evaluation

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        from lm_eval.utils import simple_parse_args_string
        args = simple_parse_args_string(arg_string)
        return cls(**args)

    @property
    def tokenizer_name(self) -> str:
        return f"overlap-harness-{self.cfg.model}"

    def loglikelihood(self, requests):
        raise NotImplementedError("overlap-ref generates only (generate_until tasks such as gsm8k); "
                                  "log-likelihood tasks need a model that scores prompts")

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError("overlap-ref generates only (generate_until tasks such as gsm8k)")

    def _request(self, i: int, context: str, kw: dict, tok, L: int, check) -> Request:
        ids = tok.encode(context)
        if tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id] + ids
        until = kw.get("until") or []
        until = (until,) if isinstance(until, str) else tuple(until)
        mt = int(kw.get("max_gen_toks", self.max_gen_toks))
        r = Request(rid=f"q{i}", prompt_ids=ids, max_new_tokens=mt, stop=until)
        fit_request(check, r, want=max(1, min(mt, 64, L // 4)))
        temp = float(kw.get("temperature", 0.0) or 0.0)
        if not _as_bool(kw.get("do_sample", temp > 0)):
            temp = 0.0
        r.temperature, r.top_p, r.seed = temp, float(kw.get("top_p", 1.0) or 1.0), kw.get("seed")
        return r

    def _background(self, i: int, r: Request, tok) -> list[Request]:
        """Short requests from other clients, sent right after question i: "Question: <n>",
        two new tokens, unscored. They share the head of the questions' prompts, finish at once,
        and hand their rows to requests whose cached prefix covers the position their extra
        step writes (the article's Figure 9): the workload where a missing fence does harm."""
        out = []
        for k in range(self.background):
            ids = tok.encode(f"Question: {i * self.background + k}")
            if tok.bos_id is not None:
                ids = [tok.bos_id] + ids
            out.append(Request(rid=f"{r.rid}-bg{k}", prompt_ids=ids, max_new_tokens=2))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        eng, tok = self._build(self.cfg)
        reqs = [self._request(i, inst.args[0], dict(inst.args[1] or {}), tok, eng.L, eng.check_fits)
                for i, inst in enumerate(requests)]
        work = reqs + []
        if self.background > 0:
            work = []
            for i, r in enumerate(reqs):
                work.append(r)
                work += self._background(i, r, tok)
        total, state = len(reqs), {"done": 0, "t": 0.0}

        def on_step(e):
            if self.progress is None:
                return
            done = sum(1 for r in reqs if r.finished)
            now = time.monotonic()
            if done != state["done"] and (now - state["t"] > 0.5 or done == total):
                state["done"], state["t"] = done, now
                self.progress(done, total)
        try:
            eng.run(work, on_step=on_step)
        except Exception as e:  # noqa: BLE001
            raise EngineFailure(f"the engine failed mid-run: {type(e).__name__}: {e}") from e
        from harness.device.timeline import step_summary
        try:
            self.last_summary = step_summary(eng.dev)
            self.last_summary["generated_tokens"] = sum(len(r.output_ids) for r in reqs)
            if eng.spec is not None:  # the run was speculative: say how well it drafted
                acc = eng.spec.accept_lens
                self.last_summary.update(spec=self.cfg.spec, spec_k=self.cfg.spec_k,
                                         mean_accept_len=sum(acc) / len(acc) if acc else None)
        except Exception:  # noqa: BLE001 - the summary is informative only
            self.last_summary = {}
        out = []
        for r in reqs:
            text = tok.decode(r.output_ids)
            cut = min((i for i in (text.find(s) for s in r.stop) if i >= 0), default=-1)
            out.append(text[:cut] if cut >= 0 else text)
        return out
