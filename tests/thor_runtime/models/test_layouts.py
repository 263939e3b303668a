"""Weight layouts (dense / packed / dual): same model, different memory layout, same logits."""

from __future__ import annotations

import pytest
import torch

from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.errors import ThorError
from thor_runtime.models.dense import DENSE_MAX_ROWS, PackedWeight, TargetModel

needs_onednn = pytest.mark.skipif(
    not PackedWeight.available(torch.float32, torch.device("cpu")),
    reason="this torch build has no oneDNN weight packing",
)


def _weights(loaded):
    from pathlib import Path

    from thor_runtime.loading.hf_weights import hf_weights

    return hf_weights(Path(loaded.source))


def _logits(model, ids, rows):
    cache = KVCache(model.cfg, 64, "fp32", model.dtype)
    model.prefill(ids[:-rows], cache)
    return model.forward(ids[-rows:], cache).logits  # [rows, V]


@needs_onednn
def test_layouts_agree(tiny_llama):
    w, cfg = _weights(tiny_llama), tiny_llama.cfg
    models = {lay: TargetModel(cfg, w, layout=lay) for lay in ("dense", "packed", "dual")}
    assert {lay: m.layout for lay, m in models.items()} == {
        "dense": "dense",
        "packed": "packed",
        "dual": "dual",
    }
    assert TargetModel(cfg, w).layout == "packed"  # auto on a CPU with oneDNN
    # bf16 packing needs avx512bw/vl/dq or avx_ne_convert: auto follows what this CPU can do
    bf16_pack = PackedWeight.available(torch.bfloat16, torch.device("cpu"))
    assert TargetModel(cfg, w, torch.bfloat16).layout == ("packed" if bf16_pack else "dense")
    ids = torch.arange(3, 40)
    for rows in (1, DENSE_MAX_ROWS, 8):
        ref = _logits(models["dense"], ids, rows)
        for lay in ("packed", "dual"):
            assert torch.allclose(_logits(models[lay], ids, rows), ref, atol=1e-4), (lay, rows)
    # dual serves few rows from the dense copy: bit-identical to dense there
    assert torch.equal(_logits(models["dual"], ids, 1), _logits(models["dense"], ids, 1))


def test_layout_refusals(tiny_llama):
    w, cfg = _weights(tiny_llama), tiny_llama.cfg
    with pytest.raises(ThorError, match="unknown weight layout"):
        TargetModel(cfg, w, layout="tiled")
    with pytest.raises(ThorError, match="needs a CPU torch with oneDNN"):
        TargetModel(cfg, w, layout="packed", quant="int8")
    assert TargetModel(cfg, w, quant="int8").layout == "dense"
