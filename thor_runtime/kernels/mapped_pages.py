"""Hand back the resident pages of memory-mapped weights that ONNX Runtime has copied.

A weight cache hit maps its safetensors file (copy-on-write, never written) and the model's
MatMulNBits weights are views into that mapping. Building a session reads every byte of them
once (MLAS packs its own copy), and the pages read stay resident and count in the process's
RSS for its whole life (~106 MB for SmolLM2-135M: the int4 projections and the 8-bit head),
though ORT never reads them again. ``madvise(MADV_DONTNEED)`` drops those pages from this
process; the mapping, and so every tensor view and every buffer handed to ORT, stays valid:
a later read (a lazily built session, ``dequantize()``, saving the weights) faults the bytes
in again from the file. The kernel keeps an unlinked file's data while it is mapped, so an
entry the cache replaces or removes stays readable.

Only whole pages inside the given tensors are dropped, and only in file-backed mappings:
on anonymous memory (the heap) the same call would zero the data, and a page shared with
another tensor may hold bytes someone wrote (a private mapping forgets them). Elsewhere than
Linux (no /proc/self/maps) nothing is released.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

_MADV_DONTNEED = 4  # the same value on every Linux architecture


def file_mappings(maps: str = "/proc/self/maps") -> list[tuple[int, int]]:
    """[start, end) of this process's mappings of regular files (not the heap, stacks,
    anonymous memory or devices)."""
    out = []
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or parts[4] == "0":  # inode 0: anonymous
            continue
        path = parts[5].removesuffix(" (deleted)")
        if not path.startswith("/") or path.startswith(("/dev/", "/memfd:")):
            continue
        a, b = (int(x, 16) for x in parts[0].split("-"))
        out.append((a, b))
    return out


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Byte ranges with touching or overlapping ones joined (adjacent tensors share no page
    boundary, so a page spanning two of them is dropped only when both are released)."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def release_pages(tensors: list[torch.Tensor]) -> int:
    """Drop this process's resident pages of ``tensors`` where they lie in a file mapping
    (see the module docstring); the tensors stay usable. -> bytes of address range released."""
    if not tensors:
        return 0
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    maps = file_mappings()
    page = mmap.PAGESIZE
    released = 0
    ranges = [
        (t.data_ptr(), t.data_ptr() + t.nbytes)
        for t in tensors
        if t.device.type == "cpu" and t.is_contiguous() and t.numel()
    ]
    for a, b in _merged(ranges):
        lo, hi = -(-a // page) * page, b // page * page  # whole pages inside only
        if hi <= lo or not any(s <= lo and hi <= e for s, e in maps):
            continue
        if libc.madvise(lo, hi - lo, _MADV_DONTNEED) == 0:  # refused (locked pages): they stay
            released += hi - lo
    return released
