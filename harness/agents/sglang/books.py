"""SGLang's own books at idle, read from its objects (what harness.oracles.books holds to "nothing
leaks"): its invariant checker's check of the request pool at full idle (point `books_idle`: the
rows back) and every leak its checks report (point `books_leak`).
"""
from __future__ import annotations


def books_idle(agent, orig):
    facts = agent.facts

    def _check_req_pool(self, *a, **kw):
        # SGLang's own check at full idle: the rows back, and every leak its checks reported
        pool = self.req_to_token_pool
        total = int(getattr(pool, "size", 0)) + int(getattr(pool, "pre_alloc_size", 0) or 0)
        facts.add("books_idle_checks")
        facts.set(books={"req_rows_total": total, "req_rows_free": len(pool.free_slots),
                         "pool_leaks": facts.data.get("pool_leaks", 0),
                         "first_leak": facts.data.get("first_leak", "")})
        facts.write()
        return orig(self, *a, **kw)
    return _check_req_pool


def books_leak(agent, orig):
    facts = agent.facts

    def _report_leak(self, pool_name, token_msg, *a, **kw):
        facts.add("pool_leaks")
        if not facts.data.get("first_leak"):
            facts.set(first_leak=f"{pool_name}: {str(token_msg)[:300]}")
        facts.write(True)
        return orig(self, pool_name, token_msg, *a, **kw)
    return _report_leak
