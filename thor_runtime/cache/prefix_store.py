"""The K/V of a shared prompt start, kept on disk across processes (the persistent prefix).

Every planning prompt on one skill library opens with the same text (instructions, examples,
the skills with their needs and effects): several hundred tokens, most of a cold plan's
prefill. Their keys and values are computed once, written here, and memory-mapped by every
later process, which then prefills only the world and the task. A restored prefix is exactly
the in-memory prefix cache's hit (prefix_cache.py): the same bytes a chunked prefill with
that start as its first chunk would leave in the cache.

The file is safetensors: ``k`` and ``v`` [L, Hkv, n, Dh] in the cache's storage dtype, ``ids``
[n] int64, the key in the metadata and, for a world's start (``PrefixShelf``), ``tap.<layer>``
[T, D]: the drafter taps of its last T rows. The key covers what the bytes depend on: the model's
weights file (path, size, mtime), weights dtype and form, KV dtype and scales, torch and the CPU
kernels it dispatches to, the kernel that runs prompt rows (and the row kernel's build), the
prefill chunk, and the exact token ids. A file whose key, ids, shapes or length do
not match is refused (the caller rebuilds it); it is written to a temporary name, flushed and
renamed, so a reader finds the whole file or none, whatever kills the writer.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
from pathlib import Path

import torch

from thor_runtime.cache.kv_cache import KV_DTYPES, KVCache
from thor_runtime.errors import ThorError

FORMAT = "thor-prefix/1"
# safetensors dtype names of the cache's storage dtypes (and the token ids)
_ST = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    getattr(torch, "float8_e4m3fn", None): "F8_E4M3",
}
_TORCH = {v: k for k, v in _ST.items() if k is not None}


def _source_identity(source) -> dict:
    """The checkpoint's path, size and mtime. A model with no file behind it has no identity a
    file could be matched to: refused, never keyed by whatever an empty path resolves to."""
    if not source:
        raise ThorError("a persistent prefix needs the model's checkpoint path (model.source)")
    p = Path(str(source))
    try:
        # a checkpoint directory: its files (replacing a weight file leaves the directory's mtime)
        files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
        stats = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        return {
            "source": str(p.resolve()),
            "files": hashlib.sha256(repr(stats).encode()).hexdigest(),
        }
    except OSError:
        return {"source": str(source)}


def prefix_key(model, kv_dtype: str, scales, ids, prefill_chunk: int = 0) -> dict:
    """What the stored K/V depend on (see the module docstring), as strings. The prefill chunk
    too: kernels over other row counts may round otherwise."""
    ids_digest = hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).hexdigest()
    scales_digest = hashlib.sha256(
        scales.k.numpy().tobytes() + scales.v.numpy().tobytes()
    ).hexdigest()
    key = {
        "format": FORMAT,
        **_source_identity(getattr(model, "source", "")),
        "dtype": str(model.dtype),
        "quant": str(getattr(model, "quant", None)),
        "layout": str(getattr(model, "layout", None)),
        "segments": _segments_identity(model),
        "kv_dtype": kv_dtype,
        "kv_scales": scales_digest,
        "prefill_chunk": prefill_chunk,
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "prefill_kernel": _prefill_identity(model),
        "tokens": str(len(ids)),
        "ids_sha256": ids_digest,
    }
    return {k: str(v) for k, v in key.items()}


def _prefill_identity(model) -> str:
    """What runs the prompt rows (runner.py): the row kernel's are its build's bits."""
    kernel = str(getattr(model, "prefill_kernel", "torch"))
    return f"{kernel}:{getattr(model, 'kernel_build', '')}" if kernel == "rowstep" else kernel


def _segments_identity(model) -> str:
    """What runs the dense segments: torch, or a graph backend and the engine cache entry its
    graphs came from (another backend, form or precision rounds otherwise)."""
    b = getattr(model, "backend", None)
    if b is None:
        return "torch"
    entry = getattr(b, "entry", None)
    return f"{b.name}:{'fused' if b.fused else 'segments'}:{getattr(entry, 'key', '')}"


def prefix_path(directory: str | Path, key: dict) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return Path(directory) / f"{name}.safetensors"


def save(path: str | Path, cache: KVCache, ids, key: dict, taps: dict | None = None) -> None:
    """The first ``len(ids)`` positions of ``cache`` (and ``taps`` {layer: [T, D]}, those of the
    last T of them), written atomically to ``path``."""
    from safetensors.torch import save_file

    n = len(ids)
    if cache.length < n:
        raise ValueError(f"the cache holds {cache.length} positions, not the prefix's {n}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        "k": cache.k[:, :, :n].contiguous(),
        "v": cache.v[:, :, :n].contiguous(),
        "ids": torch.tensor(list(ids), dtype=torch.int64),
        **{f"tap.{i}": t.float().contiguous() for i, t in (taps or {}).items()},
    }
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=key)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_header(mm) -> tuple[dict, int]:
    if len(mm) < 8:
        raise ValueError("shorter than a header")
    (hlen,) = struct.unpack("<Q", mm[:8])
    if hlen > len(mm) - 8:
        raise ValueError("header runs past the end")
    return json.loads(bytes(mm[8 : 8 + hlen])), 8 + hlen


def load(
    path: str | Path, key: dict, ids, cfg, kv_dtype: str, compute_dtype, scales
) -> KVCache | None:
    """The stored prefix as a read-only cache over the memory-mapped file, or None when there is
    none or it does not match ``key``, ``ids`` and the model's shapes (the caller rebuilds it)."""
    got = read(path, key, ids, cfg, kv_dtype, compute_dtype, scales)
    return got[0] if got is not None else None


def read(
    path: str | Path, key: dict, ids, cfg, kv_dtype: str, compute_dtype, scales
) -> tuple[KVCache, dict] | None:
    """``load``, with the stored taps ({layer: [T, D]} of the last T rows; {} without any)."""
    try:
        with open(path, "rb") as f:
            # a private mapping: torch wants a writable buffer, and nothing is ever written back
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None
    try:
        header, base = _read_header(mm)
        meta = header.pop("__metadata__", {})
        taps = {n for n in header if n.startswith("tap.") and n[4:].isdigit()}
        if meta != key or set(header) - taps != {"k", "v", "ids"}:
            return None
        if base + max(h["data_offsets"][1] for h in header.values()) != len(mm):
            return None  # truncated, or trailing bytes
        t = {name: _view(mm, base, h) for name, h in header.items()}
    except (ValueError, KeyError, TypeError, struct.error):
        return None
    n = len(ids)
    shape = (cfg.num_layers, cfg.num_kv_heads, n, cfg.head_dim)
    store = KV_DTYPES[kv_dtype]
    if t["ids"].tolist() != list(ids) or any(
        t[x].shape != shape or t[x].dtype != store for x in "kv"
    ):
        return None
    tap = {int(name[4:]): t[name] for name in taps}
    if len({x.shape for x in tap.values()}) > 1 or any(
        x.dim() != 2 or x.shape[0] > n or x.shape[1] != cfg.hidden_size or x.dtype != torch.float32
        for x in tap.values()
    ):
        return None  # taps of one row count, [T <= n, D]
    cache = KVCache(cfg, 0, kv_dtype, compute_dtype, scales)  # 1 slot; its tensors replaced below
    cache.k, cache.v, cache.max_len, cache.lengths = t["k"], t["v"], n, [n] * cfg.num_layers
    cache.mapped = mm  # the views need the mapping alive
    return cache, tap


def _view(mm, base: int, h: dict) -> torch.Tensor:
    dtype = _TORCH[h["dtype"]]
    lo, hi = h["data_offsets"]
    shape = tuple(h["shape"])
    size = torch.empty(0, dtype=dtype).element_size()
    count = 1
    for s in shape:
        count *= s
    if hi - lo != count * size or lo < 0:
        raise ValueError("a tensor's bytes do not match its shape")
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(mm, dtype=torch.uint8, count=hi - lo, offset=base + lo)
    return raw.view(dtype).view(shape)
