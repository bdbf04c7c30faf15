"""Entry 0: the entry that belongs to no request, so that the padded rows of a graph batch read
and write something harmless (the article's relay entry 0). In SGLang 0.5.23 it is req-pool row 0
(the relay, FutureMap, is indexed by req-pool row: `future_indices = batch.req_pool_indices`) and
KV slot 0; the allocators never hand either out, and the graph runners point padded rows at both.
The agent calls `padded` after every CPU graph replay's prepare_replay (point `graph_pad`)."""
from __future__ import annotations


def padded(facts, last_step, raw, prepared) -> None:
    """A decode step replayed on a captured graph (SGLang's CPU graph runner, prepare_replay):
    when its batch of raw_bs rows was padded up to the captured size, every padded row must
    read and write entry 0, which belongs to no request (req_to_token row 0, which is also
    the relay's entry 0: FutureMap is indexed by req-pool row, and KV slot 0, which the
    allocators never hand out), and no request may hold entry 0 itself. Counted: padded
    rows on entry 0 (path_relay_entry0); anything else is a violation (pad_rows_off_entry0),
    the first one described, since a padded row that points at a live request's row or KV
    slot writes its garbage K/V there (or a request holding slot 0 gets the padding's)."""
    try:
        raw_bs, bs = int(raw.batch_size), int(prepared.batch_size)
        facts.add("graph_steps")
        live_rows = [int(x) for x in raw.req_pool_indices.tolist()]
        live_locs = [int(x) for x in raw.out_cache_loc.tolist()]
        bad = []
        if 0 in live_rows or 0 in live_locs:
            bad.append(f"a request of the batch holds entry 0 (req rows {live_rows[:8]}, KV slots {live_locs[:8]})")
        if bs > raw_bs:
            facts.add("graph_padded_steps")
            rows = [int(x) for x in prepared.req_pool_indices[raw_bs:bs].tolist()]
            width = max(1, len(prepared.out_cache_loc) // bs)  # tokens a row (1 for plain decode)
            locs = [int(x) for x in prepared.out_cache_loc[raw_bs * width:bs * width].tolist()]
            on0 = sum(1 for i, r in enumerate(rows) if r == 0 and all(v == 0 for v in locs[i * width:(i + 1) * width]))
            facts.add("path_relay_entry0", on0)
            if on0 < len(rows):
                bad.append(f"padded rows {raw_bs}..{bs - 1} of a {raw_bs}-row batch point at req rows {rows} "
                           f"(live {sorted(set(rows) & set(live_rows))}) and KV slots {locs} "
                           f"(live {sorted(set(locs) & set(live_locs))}), not entry 0")
        if bad:
            facts.add("pad_rows_off_entry0")
            if not facts.data.get("first_entry0_violation"):
                facts.set(first_entry0_violation=f"step {last_step}: {bad[0]}"[:400])
    except (AttributeError, TypeError, ValueError, RuntimeError) as e:
        if not facts.data.get("first_entry0_violation"):
            facts.set(graph_pad_unread=str(e)[:200])


def graph_pad(agent, orig):
    def prepare_replay(self, forward_batch, *a, **kw):
        out = orig(self, forward_batch, *a, **kw)
        padded(agent.facts, agent.last_step, forward_batch, out)
        return out
    return prepare_replay
