"""Keys and values of recent prompts, so a prompt that starts like one of them prefills only the
rest.

A robot plans in one world with one skill library: every request's prompt opens with the same
system text (the world and the skills, several hundred tokens), and a repair repeats the whole
first exchange. The runtime keeps the K/V of the last few prompts; a new prompt takes the
longest common start from one of them and prefills the remainder against it, which is exactly
a chunked prefill whose first chunk is that start (the same rows run the same kernels, so the
guarantees of `--prefill-chunk` hold: see docs/performance.md, "KV cache").

A drafter's window is seeded with the taps (hidden states at a few layers) of the prompt's last
rows. An entry keeps those of its own prompt, so a hit whose shared start reaches into that tail
takes them too, and only the rows after the shared start run: a plan in a world the cache holds
prefills its task, not the last 128 rows. The taps of a shared row are those of the same tokens
at the same positions: the same values a prefill would give (and drafts only guess: the
target's verify decides every token).

Entries are copies, never shared with a running sequence, so a generation's rollbacks cannot
touch them; least recently used goes first. Pinned entries (a shared start restored from disk,
prefix_store.py) are never evicted and not counted in ``entries``.
"""

from __future__ import annotations

from dataclasses import dataclass

from thor_runtime.cache.kv_cache import KVCache


@dataclass
class _Entry:
    ids: tuple[int, ...]
    cache: KVCache
    taps: dict | None = None  # layer -> [T, D]: the taps of the prompt's last T rows
    tap_start: int = 0  # the position of their first row
    stored: bool = False  # read from disk (a world start: prefix_shelf.py)

    def taps_cover(self, start: int, end: int) -> bool:
        return self.taps is not None and self.tap_start <= start and end <= len(self.ids)

    def taps_between(self, start: int, end: int) -> dict:
        """The taps of rows start..end-1 (inside what ``taps_cover`` allowed)."""
        return {i: t[start - self.tap_start : end - self.tap_start] for i, t in self.taps.items()}


def tap_rows(taps: dict | None) -> int:
    """T of taps {layer: [T, D]} (the same for every layer); 0 for none."""
    return next(iter(taps.values())).shape[0] if taps else 0


def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """At most ``entries`` prompts' K/V; a hit must share at least ``min_tokens`` tokens (shorter
    starts are cheaper to prefill than to copy)."""

    def __init__(self, entries: int = 2, min_tokens: int = 32):
        if entries < 1 or min_tokens < 1:
            raise ValueError("a prefix cache needs entries >= 1 and min_tokens >= 1")
        self.entries, self.min_tokens = entries, min_tokens
        self._items: list[_Entry] = []  # most recently used last
        self._pinned: list[_Entry] = []
        self.hits = self.tokens_reused = 0
        self.last_from_disk = False  # the last restore came from a pinned or stored start

    def __len__(self) -> int:
        return len(self._items)

    def nbytes(self) -> int:
        return sum(e.cache.nbytes() for e in self._items)

    def pin(self, ids, cache: KVCache) -> None:
        """Keep ``cache`` (holding exactly the K/V of ``ids``) for good: the same ids replace it."""
        ids = tuple(ids)
        self._pinned = [e for e in self._pinned if e.ids != ids] + [_Entry(ids, cache)]

    def forget(self) -> None:
        """Drop the recent prompts, keep the pinned starts: what a new process that restored
        them from disk holds."""
        self._items.clear()

    def sibling(self) -> "PrefixCache":
        """An empty cache of the same size sharing this one's pinned starts (read-only, so shared
        safely): another service's memory on the same stored prefixes."""
        other = PrefixCache(self.entries, self.min_tokens)
        other._pinned = list(self._pinned)
        return other

    def pinned(self) -> list[tuple[int, ...]]:
        return [e.ids for e in self._pinned]

    def restore(self, ids, cache: KVCache, limit: int) -> int:
        """Fill the empty ``cache`` with the longest start of ``ids`` (at most ``limit`` tokens)
        that an entry holds; returns how many positions it now has (0: none was good enough)."""
        return self.restore_seeded(ids, cache, limit)[0]

    def restore_seeded(
        self,
        ids,
        cache: KVCache,
        limit: int,
        taps_from: int | None = None,
        keep_from: int | None = None,
    ) -> tuple[int, dict]:
        """``restore`` for a caller that needs the taps of rows ``taps_from``.. of the prompt: a
        start past ``taps_from`` comes only from an entry holding the taps of its rows from
        there, returned as {layer: [n - s, D]}, s = ``taps_from``, or as far back as
        ``keep_from`` where the entry has them (a caller that keeps a margin of taps for the
        next prompt, whose seed may start earlier); otherwise the start stops at ``taps_from``.
        -> (positions restored, taps)."""
        best, n = None, 0
        for e in self._pinned + self._items:  # on a tie the earlier (pinned: memory-mapped) wins
            m = min(common_prefix(e.ids, ids), limit)
            if taps_from is not None and m > taps_from and not e.taps_cover(taps_from, m):
                m = taps_from
            if m > n:
                best, n = e, m
        self.last_from_disk = False
        if best is None or n < self.min_tokens:
            return 0, {}
        first = (
            taps_from if keep_from is None else max(min(keep_from, taps_from or 0), best.tap_start)
        )
        taps = best.taps_between(first, n) if taps_from is not None and n > taps_from else {}
        self.last_from_disk = best in self._pinned or best.stored
        cache.load_prefix(best.cache, n)
        if best in self._items:
            self._items.remove(best)
            self._items.append(best)
        self.hits += 1
        self.tokens_reused += n
        return n, taps

    def covers(self, ids) -> bool:
        """Whether an entry (pinned or recent) starts with all of ``ids``."""
        ids = tuple(ids)
        return any(e.ids[: len(ids)] == ids for e in self._pinned + self._items)

    def start_of(self, ids) -> tuple[KVCache, dict] | None:
        """The K/V of ``ids`` from a recent prompt that starts with them (a view of its copy: the
        first len(ids) positions) and its taps of those rows ({} when it kept none there);
        None when no recent prompt does."""
        ids = tuple(ids)
        e = next((e for e in reversed(self._items) if e.ids[: len(ids)] == ids), None)
        if e is None:
            return None
        taps = (
            e.taps_between(e.tap_start, len(ids))
            if e.taps is not None and e.tap_start < len(ids)
            else {}
        )
        return e.cache, taps

    def add(self, ids, cache: KVCache, taps: dict | None = None) -> None:
        """``cache`` (holding the K/V of exactly ``ids``, a stored start) as the most recent
        prompt, with ``taps`` {layer: [T, D]} of its last T rows; not copied (restores copy)."""
        ids = tuple(ids)
        rows = tap_rows(taps)
        self._items = [e for e in self._items if e.ids != ids]
        self._items.append(
            _Entry(ids, cache, dict(taps) if rows else None, len(ids) - rows, stored=True)
        )
        del self._items[: -self.entries]

    def store(self, ids, cache: KVCache, taps: dict | None = None) -> None:
        """Keep a copy of the first ``len(ids)`` positions of ``cache`` (the prompt's), and the
        taps of its last rows ({layer: [T, D]}, T the same for every layer) when given."""
        ids = tuple(ids)
        rows = tap_rows(taps)
        same = next((e for e in self._items if e.ids == ids), None)
        if same is not None:  # the same prompt again: its copy is already here
            self._items.remove(same)
            self._items.append(same)
            if rows > (len(ids) - same.tap_start if same.taps else 0):
                same.taps, same.tap_start = dict(taps), len(ids) - rows
            return
        self._items = [e for e in self._items if ids[: len(e.ids)] != e.ids]
        self._items.append(
            _Entry(ids, cache.snapshot(len(ids)), dict(taps) if rows else None, len(ids) - rows)
        )
        del self._items[: -self.entries]
