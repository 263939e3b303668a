"""Pages of memory-mapped weights that ORT has copied are handed back (mapped_pages.py): a
weight cache hit keeps no resident copy of a MatMulNBits weight whose bytes a session or a
fused graph holds, and every path that reads those weights again still gets the same bytes."""

from __future__ import annotations

import mmap
import struct
import sys

import numpy as np
import pytest
import torch

from thor_runtime.kernels.lowbit_ort import NBitsWeight
from thor_runtime.kernels.mapped_pages import file_mappings, release_pages

linux = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="page residency is read from Linux's /proc"
)
PAGE = mmap.PAGESIZE


def resident_pages(t: torch.Tensor) -> tuple[int, int]:
    """(resident, total) whole pages inside ``t``, from /proc/self/pagemap's present bit."""
    a, b = t.data_ptr(), t.data_ptr() + t.nbytes
    lo, hi = -(-a // PAGE), b // PAGE
    if hi <= lo:
        return 0, 0
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(lo * 8)
        raw = f.read((hi - lo) * 8)
    return sum(v >> 63 for v in struct.unpack(f"<{hi - lo}Q", raw)), hi - lo


@linux
def test_file_pages_released_and_still_readable(tmp_path):
    data = np.arange(64 * PAGE // 4, dtype=np.float32)
    f = tmp_path / "w.bin"
    data.tofile(f)
    t = torch.from_numpy(
        np.memmap(f, dtype=np.float32, mode="c")
    )  # copy-on-write, as safetensors maps
    ref = t.clone()
    assert resident_pages(t) == (64, 64)
    assert release_pages([t]) == 64 * PAGE
    assert resident_pages(t) == (0, 64)
    assert torch.equal(t, ref)  # faulted in again from the file


@linux
def test_heap_and_partial_pages_untouched(tmp_path):
    heap = torch.arange(16 * PAGE, dtype=torch.float32)  # anonymous memory: never advised
    assert release_pages([heap]) == 0 and torch.equal(
        heap, torch.arange(16 * PAGE, dtype=torch.float32)
    )
    f = tmp_path / "w.bin"
    np.zeros(8 * PAGE, np.uint8).tofile(f)
    m = torch.from_numpy(np.memmap(f, dtype=np.uint8, mode="c"))
    m[PAGE // 2] = 7  # a written byte on a page the released tensor shares
    released = m[PAGE // 2 + 1 : 7 * PAGE + 1]
    assert release_pages([released]) == 6 * PAGE  # pages 1..6 only
    assert int(m[PAGE // 2]) == 7 and int(m.sum()) == 7
    assert file_mappings() and all(a < b for a, b in file_mappings())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """-> (kept, cold, hit, graph): without a cache (the weights stay in memory), the first
    start that writes the cache, the start that maps it, and a start that maps it with no
    compiler for the row kernel (ONNX Runtime runs every row)."""
    if not NBitsWeight.available():
        pytest.skip("onnxruntime (the onnx extra) is not installed")
    import os

    from thor_runtime.loading import load

    cache = str(tmp_path_factory.mktemp("wcache"))
    kept = load("default", "int4", cache_dir="", int4_kernel="ort")
    cold = load("default", "int4", cache_dir=cache, int4_kernel="ort")
    hit = load("default", "int4", cache_dir=cache, int4_kernel="ort")
    cc = os.environ.get("CC")
    os.environ["CC"] = str(tmp_path_factory.mktemp("no-cc") / "cc")
    try:
        graph = load("default", "int4", cache_dir=cache, int4_kernel="ort")
    finally:
        os.environ.pop("CC") if cc is None else os.environ.__setitem__("CC", cc)
    assert (
        cold.model.cache_hit is False
        and hit.model.cache_hit is True
        and graph.model.runner.rows is None
    )
    return kept.model, cold.model, hit.model, graph.model


def _nbits(model) -> dict[str, NBitsWeight]:
    out = {"head": model.head_w}
    for i, L in enumerate(model.layers):
        out.update({f"{i}.{f}": getattr(L, f) for f in ("wqkv", "wo", "w_gate_up", "w_down")})
    return {k: w for k, w in out.items() if isinstance(w, NBitsWeight)}


def _resident(weights, parts=None) -> tuple[int, int]:
    return tuple(
        map(
            sum,
            zip(
                *(
                    resident_pages(t)
                    for w in weights
                    for k, t in w.tensors().items()
                    if parts is None or k in parts
                )
            ),
        )
    )


@linux
@pytest.mark.slow
def test_cached_starts_hold_no_copy_of_ort_weights(models):
    """A cache hit, and a first start (which runs on the entry it has just written), keep no
    resident copy of what only ORT reads: every weight when ORT runs every row; the Q4_1
    corrections when the row kernel runs the steps (it reads the blobs and scales in place:
    those pages are its weights, not a copy). A regrouping row kernel builds no ORT graph
    until asked and hands back the pages it copied. Without a cache the weights stay in memory."""
    from thor_runtime.kernels.lowbit_fused import ort_weights

    kept, cold, hit, graph = models
    for m in (cold, hit, graph):
        weights = _nbits(m)
        if m.runner.rows is not None and m.runner.rows.group:
            # a regrouping row kernel runs every fp32 row: no ORT copy at all until one is asked
            # for, and the mapped pages it regrouped from handed back
            assert m.runner.built_step is None and ort_weights(m, m.runner) == []
            res, total = _resident(weights.values())
            assert total * PAGE > 100e6 and res <= total // 100, (res, total)
        assert len(weights) == 4 * m.cfg.num_layers + 1 and m.runner.step is not None  # built now
        held = ort_weights(m, m.runner)
        assert {id(w) for w in held} == {id(w) for w in weights.values()}  # every one is in ORT
        res, total = _resident(held, None if m.runner.rows is None else {"corr"})
        assert total * PAGE > (100e6 if m.runner.rows is None else 5e6) and res <= total // 100, (
            res,
            total,
        )
    assert cold.runner.rows is not None and hit.runner.rows is not None
    assert kept.runner.step is not None
    res, total = _resident(ort_weights(kept, kept.runner))
    assert total and res == total


@linux
@pytest.mark.slow
def test_released_weights_serve_the_rare_paths(models):
    """dequantize(), a session built on first use (a fused layer's projection), the weight
    cache's view and the logits read the released bytes again: the same as the model that
    kept them in memory."""
    from thor_runtime.cache.kv_cache import KVCache
    from thor_runtime.loading.weight_cache import prepared_tensors

    kept, cold, hit, _ = models
    a, b = _nbits(kept), _nbits(hit)
    assert b["5.wo"]._session is None  # in a fused graph only
    x = torch.randn(3, hit.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.equal(b["5.wo"](x), a["5.wo"](x))
    for k in ("head", "0.wqkv", "7.w_gate_up", f"{hit.cfg.num_layers - 1}.w_down"):
        assert torch.equal(b[k].dequantize(), a[k].dequantize())
    pa, pb = prepared_tensors(kept), prepared_tensors(hit)
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    ids = torch.arange(100, 140)
    for m in (cold, hit):  # one prefill kernel for all three (prefill_choice.py)
        m.runner.prefill_on_rows = kept.runner.prefill_on_rows
    logits = [m.forward(ids, KVCache(m.cfg, 41, "fp32", m.dtype)).logits for m in (kept, cold, hit)]
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])
