import pytest

from harness.engine.memory import KVPool, PoolFull, PrefixCache, Rows


def test_pool_pages_lifo_and_full():
    p = KVPool(16, 4)  # 4 pages, page 0 is padding
    assert p.total == 3 and p.free == 3
    a = p.alloc(2)
    p.release(a[1:])
    assert p.alloc(1) == a[1:]  # a page freed now is handed out next
    with pytest.raises(PoolFull):
        p.alloc(5)
    assert p.slots([2, 1], 3, 6) == [11, 4, 5]


def test_rows_lifo():
    r = Rows(3)
    a, b = r.alloc(), r.alloc()
    r.release(a)
    assert r.alloc() == a and b not in (0, a)


def test_prefix_cache_match_insert_dup_evict():
    pool = KVPool(64, 2)
    c = PrefixCache(pool)
    toks = [1, 2, 3, 4, 5, 6, 7]
    assert c.match(toks) == []
    pages = pool.alloc(4)
    nodes, dup = c.insert(toks, pages, 0)
    assert [n.page for n in nodes] == pages[:3] and dup == [] and c.pages == 3
    # a second request with the same prompt matches all but the last token's page
    m = c.match(toks)
    assert [n.page for n in m] == pages[:3]
    assert len(c.match([1, 2, 3, 4, 5, 6])) == 2  # at least one token is left to compute
    # a request that computed the same prefix itself gets the cached pages back as duplicates
    other = pool.alloc(3)
    _, dup = c.insert([1, 2, 3, 4, 9, 9], other, 0)
    assert dup == [(0, pages[0]), (1, pages[1])]
    c.lock(m)
    assert c.evict(10) == 1  # only the unshared [9, 9] page is free to go
    c.unlock(m)
    assert c.evictable() == 3 and c.evict(10) == 3 and c.pages == 0


def test_disabled_cache_never_matches():
    pool = KVPool(64, 1)
    c = PrefixCache(pool, enabled=False)
    assert c.insert([1, 2, 3], pool.alloc(3), 0) == ([], [])
    assert c.match([1, 2, 3, 4]) == []


def test_a_prompt_longer_than_the_recursion_limit_is_one_chain_the_books_can_count():
    """One-slot pages make a long prompt a chain as deep as it is long (a 5-shot GSM8K prompt is
    about 1000 tokens): counting and evicting it must not recurse once per node."""
    import sys
    n = sys.getrecursionlimit() + 500
    pool = KVPool(2 * n + 4, 1)
    c = PrefixCache(pool)
    toks = list(range(1, n + 1))
    nodes, _ = c.insert(toks, pool.alloc(n), 0)
    assert c.pages == n and c.evictable() == n
    c.lock(nodes[: n // 2])  # a request still reading the first half keeps it
    assert c.evictable() == n - n // 2
    c.unlock(nodes[: n // 2])
    assert c.evict(n) == n and c.pages == 0 and c.evictable() == 0
