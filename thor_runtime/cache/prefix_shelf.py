"""World starts on disk: the K/V, and the drafter's taps, of the prompt start that every task in
one world shares, kept across processes, the most recently used ``keep`` of them.

Why. The persistent prefix (prefix_store.py) holds what every world on a skill library shares,
so a new process prefills the world and the task. A robot plans many tasks in one world, and
each new `thor plan` prefilled that world again: 120-320 of a plan's ~950 prompt tokens, a
third to a half of its latency on a 2-core CPU with the planner model, the same for every
proposer. The first plan in a world stores its start here; later processes restore it as the
prefix cache restores a recent prompt (prefix_cache.py: the same bytes a chunked prefill with
that start as its first chunk leaves), and prefill only the task.

A file is keyed like the persistent prefix (the model, dtypes, kernels, prefill chunk and the
exact token ids: prefix_store.prefix_key), so a changed world is another file; the oldest past
``keep`` are deleted. ``keep`` queues the write and ``flush`` does it, after the plan is out.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from thor_runtime.cache.prefix_cache import tap_rows
from thor_runtime.cache.prefix_store import prefix_key, prefix_path, read, save

KEEP = 16  # world starts kept on disk (~23 MB each for the planner model in fp32)


class PrefixShelf:
    def __init__(self, directory: str | Path, keep: int = KEEP):
        if keep < 1:
            raise ValueError(f"a prefix shelf keeps at least one start, got {keep}")
        self.dir, self.limit = Path(directory), keep
        self._pending: list[tuple] = []
        self._rows: dict[Path, int] = {}  # files this shelf read or wrote: the taps rows they hold
        self._queue = threading.Lock()  # requests of a service keep and flush at once
        self._write = threading.Lock()

    @staticmethod
    def usable(runtime) -> bool:
        m = getattr(runtime, "model", None)
        return (
            getattr(runtime, "prefixes", None) is not None
            and m is not None
            and m.device.type == "cpu"
            and bool(getattr(m, "source", ""))
        )

    def _key(self, runtime, ids) -> dict:
        scales = runtime.kv_scales or _unit(runtime.model.cfg)
        return prefix_key(runtime.model, runtime.kv_dtype, scales, ids, runtime.prefill_chunk)

    @staticmethod
    def _read(runtime, path: Path, key: dict, ids):
        m = runtime.model
        return read(
            path, key, ids, m.cfg, runtime.kv_dtype, m.dtype, runtime.kv_scales or _unit(m.cfg)
        )

    def fetch(self, runtime, ids) -> bool:
        """Before a prompt that starts with ``ids``: the stored start into the runtime's recent
        prompts, unless one of them (or a pinned start) already covers it. -> whether it came."""
        if not self.usable(runtime) or len(ids) < runtime.prefixes.min_tokens:
            return False
        lock = getattr(runtime, "_shared", None) or contextlib.nullcontext()
        with lock:
            if runtime.prefixes.covers(ids):
                return False
        key = self._key(runtime, ids)
        path = prefix_path(self.dir, key)
        got = self._read(runtime, path, key, ids)
        if got is None:
            return False
        self._rows[path] = tap_rows(got[1])
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to go
        with lock:
            runtime.prefixes.add(ids, *got)
        return True

    def keep(self, runtime, ids) -> None:
        """After a prompt that started with ``ids`` ran: its start (from the runtime's recent
        prompts) queued for ``flush``, unless stored already with at least these taps."""
        if not self.usable(runtime) or len(ids) < runtime.prefixes.min_tokens:
            return
        lock = getattr(runtime, "_shared", None) or contextlib.nullcontext()
        with lock:
            got = runtime.prefixes.start_of(ids)
        if got is None:
            return
        key = self._key(runtime, ids)
        path = prefix_path(self.dir, key)
        if path not in self._rows and path.exists():  # another process's: read once
            old = self._read(runtime, path, key, ids)
            if old is not None:
                self._rows[path] = tap_rows(old[1])
        if self._rows.get(path, -1) >= tap_rows(got[1]):
            return
        with self._queue:
            if all(p != path for p, *_ in self._pending):
                self._pending.append((path, got[0], tuple(ids), key, got[1]))

    def flush(self) -> list[str]:
        """Write the queued starts (atomically), then delete the least recently used files past
        the limit. An unwritable directory loses only the files: -> what went wrong, if anything."""
        with self._queue:
            pending, self._pending = self._pending, []
        with self._write:
            return self._write_out(pending)

    def _write_out(self, pending: list) -> list[str]:
        problems = []
        for path, cache, ids, key, taps in pending:
            try:
                save(path, cache, ids, key, taps)
                self._rows[path] = tap_rows(taps)
            except OSError as e:
                problems.append(f"{path.name}: {e.strerror or e}")
        try:
            files = sorted(
                self.dir.glob("*.safetensors"), key=lambda p: p.stat().st_mtime_ns, reverse=True
            )
            for old in files[self.limit :]:
                old.unlink(missing_ok=True)
                self._rows.pop(old, None)
        except OSError as e:
            problems.append(f"{self.dir}: {e.strerror or e}")
        return problems


def _unit(cfg):
    from thor_runtime.cache.kv_cache import KVScales

    return KVScales.unit(cfg)
