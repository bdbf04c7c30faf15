"""KV slot pool (pages of slots), the slot table's row allocator, and the prefix cache.

All of this is CPU bookkeeping; the device-side slot table `req_to_token` is only
ever written by ops on the schedule stream (see loop.py). Every page is in
exactly one place: the free list, the prefix cache, or one request's private
list, so `free + cached + private == total` after every step.

Each allocator remembers who took each unit off its free list (`holder`) until it comes
back, so a unit that is nowhere else names the request that kept it. The invariants are
stated on each class and checked at every step and at idle (harness/engine/books.py, the
oracle harness/oracles/conservation.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field


class PoolFull(Exception):
    pass


class KVPool:
    """Pages of `page_size` slots; page 0 is the padding page (padded rows write there).

    Conservation: each page 1..total is in exactly one place: this free list, the prefix
    cache (one node's page), or the private pages of one running request (those past its
    cached prefix). So free + cached + in use == total after every step; at idle no request
    holds a page and every cached page is evictable. Page 0 is never handed out."""

    def __init__(self, num_slots: int, page_size: int):
        if num_slots < 2 * page_size:
            raise ValueError("pool must hold at least two pages")
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        # LIFO: a page freed now is the next handed out, which is the case that needs the fence.
        self._free = list(range(self.num_pages - 1, 0, -1))
        self.holder: list[str | None] = [None] * self.num_pages  # [pages] who took it off the free list

    @property
    def total(self) -> int:
        return self.num_pages - 1

    @property
    def free(self) -> int:
        return len(self._free)

    def alloc(self, n: int, owner: str | None = None) -> list[int]:
        if n > len(self._free):
            raise PoolFull(n)
        out = [self._free.pop() for _ in range(n)]
        for p in out:
            self.holder[p] = owner
        return out

    def release(self, pages: list[int]) -> None:
        for p in reversed(pages):
            self._free.append(p)
            self.holder[p] = None

    def free_pages(self) -> list[int]:
        return list(self._free)

    def slots(self, pages: list[int], start: int, end: int) -> list[int]:
        """Slot numbers of positions [start, end) of a row whose pages are `pages`."""
        ps = self.page_size
        return [pages[i // ps] * ps + i % ps for i in range(start, end)]


class Rows:
    """A LIFO free list of small integers 1..n (rows of req_to_token, relay entries); 0 is padding.
    first=0 is the fault `live_entry_zero`: 0 is handed out (first) like any other.

    Conservation: each number is free or is the row (the entry) of exactly one running
    request, so free + running == total after every step and free == total at idle; 0 is
    never handed out (padded rows read and write there)."""

    def __init__(self, n: int, first: int = 1):
        self.n, self.first = n, first
        self._free = list(range(n, first - 1, -1))
        self.holder: dict[int, str | None] = {}  # number -> who took it off the free list

    def alloc(self, owner: str | None = None) -> int | None:
        if not self._free:
            return None
        i = self._free.pop()
        self.holder[i] = owner
        return i

    def release(self, i: int) -> None:
        self._free.append(i)
        self.holder.pop(i, None)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def total(self) -> int:
        return self.n - self.first + 1

    def free_list(self) -> list[int]:
        return list(self._free)


@dataclass
class _Node:
    page: int
    parent: "_Node | None"
    key: tuple
    children: dict = field(default_factory=dict)
    refs: int = 0
    last_use: int = 0


class PrefixCache:
    """A trie over full pages of tokens: cached prompts share slots between requests.

    Conservation: `pages` counts the nodes (each holds one page the pool counts as cached);
    a node's `refs` is the number of running requests that lock it (hold it in
    `cached_nodes`), so `locks` (the sum of refs) equals the running requests' cached pages;
    a request's first `n_cached_pages` pages are its nodes' pages, in order. At idle no node
    is locked: every cached page is evictable."""

    def __init__(self, pool: KVPool, enabled: bool = True, lookahead: int = 0, faults=frozenset()):
        self.pool = pool
        self.enabled = enabled
        # the fault `dedup_first_page_kept`: the dedup test reads `i > have` (one character), so a
        # request whose first computed page another request cached first keeps its own copy
        self.first_dup = 1 if "dedup_first_page_kept" in faults else 0
        # MTP's draft KV at a position depends on the token after it (the draft head's input), so
        # a page is shared only between sequences that also agree on the next `lookahead` tokens
        self.lookahead = lookahead
        self.root = _Node(page=-1, parent=None, key=())
        self.pages = 0
        self.locks = 0  # the sum of every node's refs
        self._tick = 0
        # the nodes without children, by id: evict() reads them instead of walking the whole trie
        # (a walk per eviction was most of a few-shot GSM8K run's CPU: thousands of cached pages)
        self._leaves: dict[int, _Node] = {}

    def _chunks(self, tokens: list[int]):
        ps, la = self.pool.page_size, self.lookahead
        for i in range(max(0, len(tokens) - la) // ps):
            yield tuple(tokens[i * ps:(i + 1) * ps + la])

    def match(self, tokens: list[int]) -> list[_Node]:
        """Longest cached prefix of whole pages, leaving at least one token to compute."""
        if not self.enabled:
            return []
        nodes, node = [], self.root
        limit = (len(tokens) - 1) // self.pool.page_size
        for key in self._chunks(tokens):
            if len(nodes) >= limit or key not in node.children:
                break
            node = node.children[key]
            nodes.append(node)
        return nodes

    def lock(self, nodes: list[_Node]) -> None:
        self._tick += 1
        for n in nodes:
            n.refs += 1
            n.last_use = self._tick
        self.locks += len(nodes)

    def unlock(self, nodes: list[_Node]) -> None:
        for n in nodes:
            n.refs -= 1
            assert n.refs >= 0
        self.locks -= len(nodes)

    def insert(self, tokens: list[int], pages: list[int], have: int) -> tuple[list[_Node], list[tuple[int, int]]]:
        """Cache the full pages of `tokens` (whose first `have` pages are already cached nodes).

        `pages` are the request's pages for those positions. Returns the nodes now
        covering the prefix and (index, cached_page) for each page that another
        request cached first: the caller frees its own duplicate and rewrites its
        row to the cached page.
        """
        if not self.enabled:
            return [], []
        node, nodes, dup = self.root, [], []
        for i, key in enumerate(self._chunks(tokens)):
            child = node.children.get(key)
            if child is None:
                child = _Node(page=pages[i], parent=node, key=key)
                node.children[key] = child
                self._leaves.pop(id(node), None)
                self._leaves[id(child)] = child
                self.pages += 1
            elif i >= have + self.first_dup and child.page != pages[i]:
                dup.append((i, child.page))
            nodes.append(child)
            node = child
        return nodes, dup

    def evict(self, want: int) -> int:
        """Free up to `want` pages of cached prompts no request uses, least recently used first."""
        freed = 0
        while freed < want:
            # a parent left childless here is a leaf of the next round, as in a walk per round
            leaves = [n for n in self._leaves.values() if n.refs == 0]
            if not leaves:
                break
            leaves.sort(key=lambda n: (n.last_use, n.page))  # pages are unique: one order
            for n in leaves:
                if freed >= want:
                    break
                del n.parent.children[n.key]
                del self._leaves[id(n)]
                if n.parent is not self.root and not n.parent.children:
                    self._leaves[id(n.parent)] = n.parent
                self.pool.release([n.page])
                self.pages -= 1
                freed += 1
        return freed

    def evictable(self) -> int:
        """Pages that evict() could free (nodes no request locks, whose subtree is unlocked too).
        Iterative: with one-slot pages a long prompt is a chain as deep as it is long."""
        free: dict[int, bool] = {}
        for n in reversed(list(self._walk())):  # the walk yields parents first: children come first here
            free[id(n)] = n.refs == 0 and all(free[id(c)] for c in n.children.values())
        return sum(free.values())

    def nodes(self) -> list[_Node]:
        return list(self._walk())

    def _walk(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())
