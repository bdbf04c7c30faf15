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



def _evict_by_walking(c: PrefixCache, want: int) -> int:
    """The eviction rule stated over the whole trie (every round: every unlocked node without
    children, least recently used first, then by page), as evict() did before it kept its leaves."""
    freed = 0
    while freed < want:
        leaves = sorted((n for n in c.nodes() if not n.children and n.refs == 0), key=lambda n: (n.last_use, n.page))
        if not leaves:
            break
        for n in leaves[: want - freed]:
            del n.parent.children[n.key]
            c.pool.release([n.page])
            c.pages -= 1
            freed += 1
    return freed


@pytest.mark.parametrize("seed", range(6))
def test_evict_frees_the_pages_the_whole_tries_rule_names(seed):
    """evict() reads the leaves it keeps instead of walking the trie: on random prompts sharing
    prefixes, with locks, unlocks and evictions of random sizes, it frees the same pages in the
    same order as the rule applied to the whole trie (a twin cache given the same calls)."""
    import random
    rng = random.Random(seed)
    ours, twin = PrefixCache(KVPool(4096, 2)), PrefixCache(KVPool(4096, 2))
    locked: list[tuple[list, list]] = []
    evicted = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.5:  # a prompt: cached, maybe kept locked by a request that still runs
            toks = rng.choice([[], [1, 2, 3, 4], [1, 2, 5, 6, 7, 8], [9] * 6]) + \
                [rng.randrange(1, 4) for _ in range(rng.randrange(1, 10))]
            keep = rng.random() < 0.3
            got = []
            for c in (ours, twin):
                have = c.match(toks)
                pages = [n.page for n in have] + c.pool.alloc((len(toks) + 1) // 2 - len(have))
                nodes, dup = c.insert(toks, pages, len(have))
                c.pool.release([pages[i] for i, _ in dup] + pages[len(nodes):])  # its own copies go back
                if keep:
                    c.lock(nodes)
                got.append(nodes)
            if keep:
                locked.append((got[0], got[1]))
        elif op < 0.7 and locked:  # a request finishes
            a, b = locked.pop(rng.randrange(len(locked)))
            ours.unlock(a)
            twin.unlock(b)
        else:
            want = rng.randrange(1, 8)
            n = ours.evict(want)
            assert n == _evict_by_walking(twin, want)
            evicted += n
        assert ours.pool.free_pages() == twin.pool.free_pages() and ours.pages == twin.pages
    assert evicted > 50 and ours.evictable() == twin.evictable()
