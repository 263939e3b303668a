"""Sharded safetensors checkpoints: two shards and their index read back as every tensor of the
model, and an index that names a missing shard or a tensor its shard lacks is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from thor_runtime.errors import ThorError
from thor_runtime.loading.hf_weights import hf_weights, read_safetensors


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(8, 4, generator=g),  # [V, D]
        "model.layers.0.self_attn.q_proj.weight": torch.randn(4, 4, generator=g).bfloat16(),
        "model.layers.0.mlp.up_proj.weight": torch.randn(6, 4, generator=g).half(),
        "model.layers.1.input_layernorm.weight": torch.randn(4, generator=g),  # [D]
        "model.norm.weight": torch.arange(4, dtype=torch.float32),
    }


def _write_sharded(
    d: Path, tensors: dict[str, torch.Tensor], drop: str | None = None
) -> dict[str, str]:
    """Two shards (the first three tensors, the rest) and their index; ``drop`` stays in the
    index but is left out of its shard."""
    names = list(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:3],
        "model-00002-of-00002.safetensors": names[3:],
    }
    weight_map = {}
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part if n != drop}, str(d / file))
        weight_map.update({n: file for n in part})
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return weight_map


def test_sharded_reads_every_tensor(tmp_path):
    want = _tensors()
    _write_sharded(tmp_path, want)
    got = read_safetensors(tmp_path)
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    as_fp32 = hf_weights(tmp_path)
    assert all(
        v.dtype == torch.float32 and torch.equal(v, want[k].float()) for k, v in as_fp32.items()
    )


def test_sharded_missing_shard_refused(tmp_path):
    weight_map = _write_sharded(tmp_path, _tensors())
    gone = weight_map["model.norm.weight"]
    (tmp_path / gone).unlink()
    with pytest.raises(ThorError, match=f"shard {gone} named in the index is missing"):
        read_safetensors(tmp_path)


def test_sharded_tensor_absent_from_its_shard_refused(tmp_path):
    drop = "model.layers.0.mlp.up_proj.weight"
    _write_sharded(tmp_path, _tensors(), drop=drop)
    with pytest.raises(
        ThorError, match=rf"model-00001-of-00002\.safetensors: tensor '{drop}'.*not in it"
    ):
        read_safetensors(tmp_path, "drafter weights")


def test_index_without_weight_map_refused(tmp_path):
    _write_sharded(tmp_path, _tensors())
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ThorError, match="no weight_map"):
        read_safetensors(tmp_path)
