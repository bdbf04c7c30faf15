"""Speculative decoding (article sections 3-6): a window of the last token plus k draft
tokens, one verify pass that computes the accept length on the device, and the relay
carrying each request's new length and bonus token to the next step, so the CPU queues
step N+1 with entry numbers only and learns step N's growth one step late.

Drafters:
- `oracle`: the target's own greedy token, replaced by a wrong one with a seeded
  probability (accept lengths span 1..k+1; full acceptance is the reservation's worst case);
- `mtp`: a draft head (one decoder layer fed the target's hidden state) that keeps its own
  KV in the target's slots; draft extend at the end of a step reads the slot table again,
  so the fence event sits at the end of the step (article 7.4);
- `ngram`: draft tokens looked up on the CPU in an index of produced text; the lookup needs
  the previous step's accepted tokens, so the host waits for that step (article 8.3).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.engine.model import pad_rows
from harness.engine.sampling import sample, uniform

DRAFTERS = ("oracle", "mtp", "ngram")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "mtp"


class SpecError(ValueError):
    pass


# -- the MTP draft head -----------------------------------------------------------------
def init_draft_head(mcfg, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random draft-head weights (HF-style names under `mtp.`); trained ones live in fixtures/mtp."""
    g = torch.Generator().manual_seed(seed)
    H, d, kv = mcfg.hidden, mcfg.head_dim, mcfg.kv_heads

    def w(*shape):
        return torch.randn(*shape, generator=g) / math.sqrt(shape[-1])
    p = "mtp.layer."
    return {"mtp.enorm.weight": torch.ones(H), "mtp.hnorm.weight": torch.ones(H), "mtp.fc.weight": w(H, 2 * H),
            p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
            p + "self_attn.q_proj.weight": w(mcfg.heads * d, H), p + "self_attn.k_proj.weight": w(kv * d, H),
            p + "self_attn.v_proj.weight": w(kv * d, H), p + "self_attn.o_proj.weight": w(H, mcfg.heads * d),
            p + "mlp.gate_proj.weight": w(mcfg.intermediate, H), p + "mlp.up_proj.weight": w(mcfg.intermediate, H),
            p + "mlp.down_proj.weight": w(H, mcfg.intermediate), "mtp.norm.weight": torch.ones(H)}


def load_draft_head(model_name: str) -> dict[str, torch.Tensor]:
    path = FIXTURES / f"{model_name}_mtp.pt"
    if not path.exists():
        raise SpecError(f"--spec mtp: model {model_name!r} has no draft head (no {path.relative_to(FIXTURES.parents[1])})")
    return torch.load(path, map_location="cpu", weights_only=True)


def draft_head_forward(model, tokens_next, hiddens, positions, out_loc, groups, kv_indices, dk, dv):
    """The draft head at positions p: input (embedding of token p+1, the target's hidden at p);
    writes its KV at out_loc (the target's slots, its own pool); returns (state g [N, H], logits).
    g is what a chained draft pass feeds back in place of the target's hidden."""
    w = model.w
    e = model._rms(F.embedding(tokens_next, w["model.embed_tokens.weight"]), w["mtp.enorm.weight"])
    h = model._rms(hiddens, w["mtp.hnorm.weight"])
    x = model.linear(torch.cat([e, h], dim=-1), "mtp.fc.weight")  # row tiles, as every linear layer
    ctx = model.pass_context(positions, groups, kv_indices)
    x = model.layer("mtp.layer.", x, ctx, out_loc, dk, dv)
    g = model._rms(x, w["mtp.norm.weight"])
    return g, model.logits(g)


# -- NGRAM's index -----------------------------------------------------------------------
class NgramIndex:
    """Continuations of the n-grams (n = 3, 2, 1) of every sequence the server has produced;
    a lookup takes the longest n-gram ending the context and returns what followed it last."""

    def __init__(self, n: int = 3):
        self.n = n
        self.next: dict[tuple, tuple[int, ...]] = {}
        self.seqs: list[list[int]] = []

    def add(self, seq: list[int], k: int) -> None:
        for i in range(len(seq)):
            for n in range(1, self.n + 1):
                if i - n + 1 < 0:
                    break
                self.next[tuple(seq[i - n + 1:i + 1])] = tuple(seq[i + 1:i + 1 + k])

    def lookup(self, context: list[int], k: int) -> list[int]:
        for n in range(self.n, 0, -1):
            cont = self.next.get(tuple(context[-n:]))
            if cont:
                out = list(cont[:k])
                return out + [out[-1]] * (k - len(out))
        return [context[-1]] * k


# -- the speculative step on the device -------------------------------------------------
def _upto_window(kv: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """kv [M, max_context] slot-table rows, pos [M, window]: the rows up to each window's last
    position, padding slot 0 after it. Past the window a row holds slot numbers its previous
    owner left there; attention masks those positions, but it must not even gather them (the
    slot-ownership check would rightly call that a read of another request's slot)."""
    past = torch.arange(kv.shape[1], device=kv.device)[None, :] > pos[:, -1:]
    return kv.masked_fill(past, 0)


class SpecDecoder:
    """Queues a speculative decode step and takes its result; owned by the Engine."""

    def __init__(self, eng):
        cfg, mcfg, dev = eng.cfg, eng.mcfg, eng.dev
        self.eng, self.algo, self.k = eng, cfg.spec, cfg.spec_k
        self.w = self.k + 1  # the window: the last token plus k draft tokens
        n, maxb, H = cfg.max_running, eng.maxb, mcfg.hidden
        rl = eng.relay
        rl.seq_lens = dev.alloc("relay.seq_lens", (n + 1,), torch.int64)  # cache length before the next window
        rl.draft = dev.alloc("relay.draft", (n + 1,), torch.int64)  # first draft token (mtp)
        rl.hidden = dev.alloc("relay.hidden", (n + 1, H))  # the drafter's state (mtp)
        w = self.w
        self.win_ids = dev.alloc("fwd.window_ids", (maxb, w), torch.int64)  # [batch, window]
        self.win_pos = dev.alloc("fwd.window_pos", (maxb, w), torch.int64)
        self.win_loc = dev.alloc("fwd.window_loc", (maxb, w), torch.int64)
        self.f_len = dev.alloc("fwd.seq_lens", (maxb,), torch.int64)
        self.f_ent = dev.alloc("fwd.entries", (maxb,), torch.int64)
        self.f_rows = dev.alloc("fwd.rows", (maxb,), torch.int64)
        self.f_preds = dev.alloc("fwd.preds", (maxb, w), torch.int64)
        self.f_acc = dev.alloc("fwd.accepted", (maxb,), torch.int64)
        self.f_hid = dev.alloc("fwd.verify_hidden", (maxb * w, H))
        self.f_g = dev.alloc("fwd.draft_state", (maxb, H))
        self.b_drafts = [dev.alloc(f"batch[{s}].drafts", (maxb, self.k), torch.int64) for s in range(eng.ring)]
        ring = range(2)
        self.o_tok = [dev.alloc(f"out[{s}].window_tokens", (maxb, w), torch.int64) for s in ring]
        self.o_acc = [dev.alloc(f"out[{s}].accept_len", (maxb,), torch.int64) for s in ring]
        self.h_tok = [dev.pinned(f"host[{s}].window_tokens", (maxb, w), torch.int64) for s in ring]
        self.h_acc = [dev.pinned(f"host[{s}].accept_len", (maxb,), torch.int64) for s in ring]
        self.o_len = [dev.alloc(f"out[{s}].seq_lens", (maxb,), torch.int64) for s in ring]
        self.h_len = [dev.pinned(f"host[{s}].seq_lens", (maxb,), torch.int64) for s in ring]
        if self.algo == "mtp":
            eng.model.w.update({k: v.to(eng.model.device, torch.float32) for k, v in load_draft_head(mcfg.name).items()})
            self.dk = dev.alloc("draft_kv.k", (cfg.pool_slots, mcfg.kv_heads, mcfg.head_dim))
            self.dv = dev.alloc("draft_kv.v", (cfg.pool_slots, mcfg.kv_heads, mcfg.head_dim))
            self.f_phid = dev.alloc("fwd.prefill_hidden", (eng.max_tokens, H))
        self.index = NgramIndex() if self.algo == "ngram" else None
        self.accept_lens: list[int] = []
        self.accept_by_rid: dict[str, list[int]] = {}  # per request, in step order: the acceptance oracle

    @property
    def faults(self):
        return self.eng.cfg.faults

    # -- queueing the step ------------------------------------------------------------------
    def queue_passes(self, b, meta):
        """Queue the step's passes on the forward stream; returns the fence event."""
        eng, c, fwd = self.eng, self.eng.cfg.costs, self.eng.forward
        fwd.launch("attn_metadata", lambda: self._metadata(b), meta=meta)
        fence = None
        if self.algo != "mtp" or "draft_extend_after_fence" in self.faults:
            fence = fwd.record("shared_read_done")
        n_draft = {"oracle": self.k, "mtp": self.k - 1, "ngram": 0}[self.algo]
        if n_draft:
            fwd.launch("draft", lambda: self._draft(b), cost=n_draft * c.draft_ms, meta=meta)
        fwd.launch("verify", lambda: self._verify(b), cost=c.verify_ms, meta=meta)
        ready = fwd.record("publish_ready")  # the new lengths are in the relay
        if "lengths_on_schedule" not in self.faults:
            eng.copy.wait_event(ready)  # the lengths go to the host early, on their own stream
            eng.copy.launch("seq_lens.d2h", lambda: self._copy_lens(b), kind="copy")
        if self.algo == "mtp":
            # draft extend reads the slot table again: it is the step's last shared read
            fwd.launch("draft_extend", lambda: self._extend(b), cost=c.extend_ms, meta=meta)
        fwd.launch("stash", lambda: self._stash(b), meta=meta)
        if fence is None:
            fence = fwd.record("shared_read_done")
        return fence

    def queue_copies(self, b):
        r = b.ring % 2
        self.eng.copy.launch("window_tokens.d2h", lambda: self.h_tok[r].copy_(self.o_tok[r], non_blocking=True),
                             kind="copy")
        return self.eng.copy.copy_to_host("accept_len.d2h", self.o_acc[r], self.h_acc[r])

    def after_fence(self, b):
        if "lengths_on_schedule" in self.faults:
            # the defect: a blocking copy of the lengths on the schedule stream, behind the fence
            self.eng.schedule.launch("seq_lens.d2h", lambda: self._copy_lens(b), kind="copy")
            self.eng.schedule.synchronize()

    def _copy_lens(self, b):
        # from this step's own output buffer: the relay's lengths are rewritten by the next step
        r = b.ring % 2
        self.h_len[r][:b.size].copy_(self.o_len[r][:b.size], non_blocking=True)

    # -- device side ------------------------------------------------------------------------
    def _padded(self, b):
        eng, s, B = self.eng, b.ring, b.size
        M = pad_rows(B)
        ent = eng.b_entries[s][:M].clone()
        rows = eng.b_rows[s][:M].clone()
        ent[B:], rows[B:] = 0, 0  # padded rows: relay entry 0 and slot-table row 0
        return M, ent, rows

    def _metadata(self, b):
        eng, rl, s, w = self.eng, self.eng.relay, b.ring, self.w
        M, ent, rows = self._padded(b)
        self.f_ent[:M], self.f_rows[:M] = ent, rows
        if "cpu_count_for_len" in self.faults:
            L = eng.b_pos[s][:M].clone()  # the defect: the CPU's one-step-old count
            L[b.size:] = 0
        else:
            L = torch.where(ent == 0, 0, rl.seq_lens[ent])  # [M] from the relay
        self.f_len[:M] = L
        kv = eng.req_to_token.index_select(0, rows)  # [M, max_context]
        pos = L[:, None] + torch.arange(w, device=L.device)[None, :]  # [M, window]
        if "window_off_by_one" in self.faults:  # the defect: the window starts one position late
            pos = pos + 1
        kv = _upto_window(kv, pos)
        eng.f_kvidx[:M] = kv
        self.win_pos[:M] = pos
        self.win_loc[:M] = kv.gather(1, pos)
        self.win_ids[:M, 0] = rl.tokens[ent]
        if self.algo == "mtp":
            self.win_ids[:M, 1] = rl.draft[ent]
            self.f_g[:M] = rl.hidden[ent]
        elif self.algo == "ngram":
            self.win_ids[:M, 1:] = self.b_drafts[s][:M]

    def _samp(self, b, M, reps=1):
        samp = self.eng.b_samp[b.ring][:, :M].clone()
        seeds = self.eng.b_seed[b.ring][:M].clone()
        samp[:, b.size:] = 0.0  # padded rows: greedy
        samp[1, b.size:] = 1.0
        if reps > 1:
            samp, seeds = samp.repeat_interleave(reps, dim=1), seeds.repeat_interleave(reps)
        return samp[0], samp[1], seeds

    def _draft(self, b):
        eng, model, M = self.eng, self.eng.model, pad_rows(b.size)
        groups = [(i, 1) for i in range(M)]
        kv = eng.f_kvidx[:M]
        temp, top_p, seeds = self._samp(b, M)
        anys = any(t > 0 for t in b.temperature)
        if self.algo == "oracle":
            wrong_p = eng.cfg.spec_wrong
            for j in range(self.k):
                pos = self.win_pos[:M, j]
                h = model.forward(self.win_ids[:M, j].clone(), pos, self.win_loc[:M, j].clone(), groups, kv,
                                  eng.kv_k, eng.kv_v)
                tok = sample(model.logits(h), temp, top_p, seeds, pos + 1, any_sampled=anys)
                wrong = uniform(seeds ^ 0x5EED, pos + 1) < wrong_p  # seeded: the same run twice
                self.win_ids[:M, j + 1] = torch.where(wrong, (tok + 1) % model.cfg.vocab_size, tok)
        else:  # mtp: chain the draft head from the state draft extend left in the relay
            g = self.f_g[:M]
            for j in range(1, self.k):
                g, logits = draft_head_forward(model, self.win_ids[:M, j].clone(), g, self.win_pos[:M, j - 1].clone(),
                                               self.win_loc[:M, j - 1].clone(), groups, kv, self.dk, self.dv)
                self.win_ids[:M, j + 1] = torch.argmax(logits, dim=-1)

    def _verify(self, b):
        eng, model, rl, w, k = self.eng, self.eng.model, self.eng.relay, self.w, self.k
        M = pad_rows(b.size)
        pos = self.win_pos[:M].reshape(-1)
        hidden = model.forward(self.win_ids[:M].reshape(-1).clone(), pos, self.win_loc[:M].reshape(-1).clone(),
                               [(i * w, w) for i in range(M)], eng.f_kvidx[:M], eng.kv_k, eng.kv_v)
        self.f_hid[:M * w] = hidden
        temp, top_p, seeds = self._samp(b, M, reps=w)
        preds = sample(model.logits(hidden), temp, top_p, seeds, pos + 1,
                       any_sampled=any(t > 0 for t in b.temperature)).view(M, w)
        match = (self.win_ids[:M, 1:] == preds[:, :k]).long()
        if "verify_wastes_last_draft" in self.faults:  # the defect: the last draft is never accepted
            match[:, -1] = 0
        acc = match.cumprod(dim=1).sum(dim=1)  # accepted draft tokens [M]
        self.f_preds[:M], self.f_acc[:M] = preds, acc
        new_len = self.f_len[:M] + acc + 1
        rl.seq_lens.index_copy_(0, self.f_ent[:M], new_len)  # published right after verify
        r = b.ring % 2
        self.o_len[r][:b.size] = new_len[:b.size]
        self.o_tok[r][:b.size] = preds[:b.size]
        self.o_acc[r][:b.size] = acc[:b.size] + 1  # the accept length counts the bonus token

    def _extend(self, b):
        """Draft extend: the draft head over the window's verified positions, fed the target's
        hidden states; its last accepted position gives the next step's first draft token."""
        eng, model, w = self.eng, self.eng.model, self.w
        M = pad_rows(b.size)
        kv = _upto_window(eng.req_to_token.index_select(0, self.f_rows[:M]), self.win_pos[:M])  # reads it again
        loc = kv.gather(1, self.win_pos[:M])
        g, logits = draft_head_forward(model, self.f_preds[:M].reshape(-1).clone(), self.f_hid[:M * w],
                                       self.win_pos[:M].reshape(-1).clone(), loc.reshape(-1),
                                       [(i * w, w) for i in range(M)], kv, self.dk, self.dv)
        sel = torch.arange(M, device=g.device) * w + self.f_acc[:M]
        self.f_g[:M] = g[sel]
        self.win_ids[:M, 1] = torch.argmax(logits[sel], dim=-1)  # reused as scratch: next first draft

    def _stash(self, b):
        """End of the step: the bonus token (and the drafter's inputs) for the next step."""
        rl, M = self.eng.relay, pad_rows(b.size)
        ent = self.f_ent[:M]
        rl.tokens.index_copy_(0, ent, self.f_preds[:M].gather(1, self.f_acc[:M, None])[:, 0])
        if self.algo == "mtp":
            rl.draft.index_copy_(0, ent, self.win_ids[:M, 1].clone())
            rl.hidden.index_copy_(0, ent, self.f_g[:M].clone())

    # prefill: the relay gets the length, and for mtp the draft head runs over the prompt
    def after_prefill(self, b, ent, hidden):
        rl, eng = self.eng.relay, self.eng
        B = b.size
        rl.seq_lens.index_copy_(0, ent[:B], eng.f_last_pos[:B] + 1)
        if self.algo == "mtp":
            self.f_phid[:hidden.shape[0]] = hidden

    def prefill_extend(self, b):
        eng, model, s = self.eng, self.eng.model, b.ring
        n, B = b.n_tokens, b.size
        N = pad_rows(n)
        nxt = eng.f_ids.new_zeros(N)
        start = 0
        toks = eng.o_tokens[b.ring % 2]
        ids = eng.f_ids[:n]
        for g, ps in enumerate(b.positions):
            c = len(ps)
            nxt[start:start + c - 1] = ids[start + 1:start + c]
            nxt[start + c - 1] = toks[g]  # the token the prefill just sampled
            start += c
        pos = eng.b_pos[s][:N].clone()
        loc = eng.f_loc[:N].clone()
        pos[n:], loc[n:] = 0, 0
        groups = eng._groups(b)
        g_all, logits = draft_head_forward(model, nxt, self.f_phid[:N], pos, loc, groups, eng.f_kvidx[:B],
                                           self.dk, self.dv)
        M = pad_rows(B)
        last = eng.b_last[s][:M].clone()
        ent = eng.b_entries[s][:M].clone()
        last[B:], ent[B:] = 0, 0  # padded rows: entry 0
        eng.relay.draft.index_copy_(0, ent, torch.argmax(logits[last], dim=-1))
        eng.relay.hidden.index_copy_(0, ent, g_all[last])

    # -- the CPU side -------------------------------------------------------------------------
    def drafts_for(self, b) -> list[list[int]]:
        """NGRAM: the CPU looks up each request's drafts from its tokens, bonus token included."""
        peek = {}
        if "ngram_no_wait" in self.faults:
            # the defect: read the in-flight step's accepted tokens without waiting for their copy
            for q in self.eng.queue:
                r = q.ring % 2
                self.eng.dev.host_access(f"host[{r}].window_tokens", self.h_tok[r][:q.size])
                rows = self.h_tok[r][:q.size].tolist()
                peek.update({id(req): rows[i][:1] for i, req in enumerate(q.reqs)})
        return [self.index.lookup(r.prompt_ids + r.output_ids + peek.get(id(r), []), self.k) for r in b.reqs]

    def results(self, b):
        r = b.ring % 2
        dev = self.eng.dev
        dev.host_access(f"host[{r}].window_tokens", self.h_tok[r][:b.size])
        dev.host_access(f"host[{r}].accept_len", self.h_acc[r][:b.size])
        dev.host_access(f"host[{r}].seq_lens", self.h_len[r][:b.size])
        return (self.h_tok[r][:b.size].tolist(), self.h_acc[r][:b.size].tolist(),
                self.h_len[r][:b.size].tolist())
