"""Qwen2 (q/k/v biases, no q/k norm) and the quantized GGUF types: parity with transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.oracle import hf_greedy, hf_oracle
from tests.helpers.pulled import QWEN_05B, pulled_or_skip
from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError

PROMPTS = [
    "pick up the red cup and place it on the table",
    "move the gripper to the shelf, then open the drawer",
]


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]  # [T, V]


def _gguf_model(path):
    from thor_runtime.loading.gguf_weights import gguf_config, gguf_weights, open_reader
    from thor_runtime.models.dense import TargetModel

    r = open_reader(path)
    cfg = gguf_config(r, path)
    return TargetModel(cfg, gguf_weights(r, cfg, path))


def test_tiny_qwen2_has_biases_and_matches_transformers(tiny_qwen2, tiny_qwen2_dir):
    cfg, model = tiny_qwen2.cfg, tiny_qwen2.model
    assert cfg.arch == "qwen2" and cfg.qkv_bias and not cfg.qk_norm
    L = model.layers[0]
    assert L.q_norm is None and L.bqkv.shape == (
        (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim,
    )
    assert L.bqkv.abs().min() > 0  # the biases are really loaded, not zero-filled
    hf = hf_oracle(tiny_qwen2_dir)
    for prompt in PROMPTS:
        ids = tiny_qwen2.tokenizer.encode(prompt)
        ours = model.forward(torch.tensor(ids), KVCache(cfg, 256)).logits
        assert (ours - _hf_logits(hf, ids)).abs().max() < 1e-4
        res = Runtime(model, tiny_qwen2.tokenizer).generate(
            ids, SamplingParams(max_tokens=32, ignore_eos=True)
        )
        assert res.token_ids == hf_greedy(hf, ids, 32)


def test_qwen2_bias_changes_the_output(tiny_qwen2):
    """Dropping the bias must change the logits, so the parity above really covers it."""
    model, cfg = tiny_qwen2.model, tiny_qwen2.cfg
    ids = torch.tensor(tiny_qwen2.tokenizer.encode(PROMPTS[0]))
    a = model.forward(ids, KVCache(cfg, 64)).logits
    saved = [L.bqkv for L in model.layers]
    try:
        for L in model.layers:
            L.bqkv = None
        b = model.forward(ids, KVCache(cfg, 64)).logits
    finally:
        for L, bias in zip(model.layers, saved):
            L.bqkv = bias
    assert (a - b).abs().max() > 1e-2


def test_qwen2_missing_bias_is_refused(tiny_qwen2_dir):
    from thor_runtime.loading.hf_weights import hf_config, hf_weights
    from thor_runtime.models.dense import TargetModel

    w = hf_weights(Path(tiny_qwen2_dir))
    del w["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(ThorError, match="missing tensor model.layers.1.self_attn.k_proj.bias"):
        TargetModel(hf_config(Path(tiny_qwen2_dir)), w)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1"])
def test_qwen2_gguf_round_trip(qtype, tiny_qwen2, tmp_path):
    """Write the tiny Qwen2 as GGUF (biases as F32, weights as ``qtype``) and load it back:
    F32 equals the HF load; quantized types match transformers reading the same file."""
    from tests.helpers.gguf_writer import write_tiny_gguf
    from thor_runtime.loading.hf_weights import hf_weights

    path = tmp_path / f"q2-{qtype}.gguf"
    write_tiny_gguf(path, tiny_qwen2.cfg, hf_weights(Path(tiny_qwen2.source)), qtype, arch="qwen2")
    model = _gguf_model(path)
    assert model.cfg.arch == "qwen2"
    ids = tiny_qwen2.tokenizer.encode(PROMPTS[0])
    ours = model.forward(torch.tensor(ids), KVCache(model.cfg, 64)).logits
    if qtype == "F32":
        ref = tiny_qwen2.model.forward(torch.tensor(ids), KVCache(tiny_qwen2.cfg, 64)).logits
        assert (ours - ref).abs().max() < 1e-5
    else:
        assert (ours - _hf_logits(hf_oracle(tmp_path, path.name), ids)).abs().max() < 1e-4


K_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def test_qwen2_gguf_k_quants_match_transformers(tmp_path):
    """Every 2-D weight of a 256-wide Qwen2 stored as a K-quant (the five types in turn)."""
    import gguf

    from tests.helpers.gguf_writer import random_kquant, write_tiny_gguf
    from thor_runtime.models.config import ModelConfig
    from thor_runtime.models.dense import _expected_shapes

    cfg = ModelConfig(
        arch="qwen2",
        vocab_size=300,
        hidden_size=256,
        intermediate_size=512,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        rope_theta=1e6,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    )
    g = torch.Generator().manual_seed(0)
    weights = {}
    for name, shape in _expected_shapes(cfg).items():
        weights[name] = (
            (1.0 + 0.1 * torch.randn(shape, generator=g))
            if "norm" in name
            else 0.05 * torch.randn(shape, generator=g)
        )
    override, gguf_names = {}, []
    for i, (name, t) in enumerate(n for n in weights.items() if n[1].ndim == 2):
        qtype = K_TYPES[i % len(K_TYPES)]
        gname = _gguf_name(name)
        override[gname] = (random_kquant(*t.shape, qtype, seed=i), gguf.GGMLQuantizationType[qtype])
        gguf_names.append((gname, qtype))
    path = tmp_path / "kq.gguf"
    write_tiny_gguf(path, cfg, weights, override=override, arch="qwen2")
    from thor_runtime.loading.gguf_weights import open_reader

    types = {t.name: t.tensor_type.name for t in open_reader(path).tensors}
    assert {types[n] for n, _ in gguf_names} == set(K_TYPES)
    model = _gguf_model(path)
    ids = list(range(5, 45))
    ours = model.forward(torch.tensor(ids), KVCache(cfg, 64)).logits
    ref = _hf_logits(hf_oracle(tmp_path, path.name), ids)
    assert ours.abs().max() > 1e-2  # non-trivial logits
    assert (ours - ref).abs().max() < 1e-4


def _gguf_name(hf_name: str) -> str:
    from tests.helpers.gguf_writer import _NAMES

    glob = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight"}
    if hf_name in glob:
        return glob[hf_name]
    parts = hf_name.split(".")
    return f"blk.{parts[2]}.{_NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"


def test_gguf_type_without_dequantizer_is_refused(tiny_qwen2, tmp_path):
    import gguf

    from tests.helpers.gguf_writer import write_tiny_gguf
    from thor_runtime.loading.gguf_weights import gguf_config, gguf_weights, open_reader
    from thor_runtime.loading.hf_weights import hf_weights

    cfg = tiny_qwen2.cfg
    bs, nb = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_K]
    raw = np.zeros(
        (cfg.hidden_size, 256 // bs * nb), dtype=np.uint8
    )  # any shape: the type is refused first
    path = tmp_path / "q8k.gguf"
    write_tiny_gguf(
        path,
        cfg,
        hf_weights(Path(tiny_qwen2.source)),
        arch="qwen2",
        override={"blk.0.ffn_up.weight": (raw, gguf.GGMLQuantizationType.Q8_K)},
    )
    r = open_reader(path)
    with pytest.raises(ThorError, match="blk.0.ffn_up.weight has unsupported GGUF type Q8_K"):
        gguf_weights(r, gguf_config(r, path), path)


def test_real_qwen2_05b_greedy_matches_transformers():
    """The pulled Qwen2.5-Coder-0.5B GGUF (Q5_0/Q8_0/Q4_K/Q6_K tensors), loaded by name: same chat
    token ids as transformers' GGUF tokenizer, logits close, and the same 16 greedy tokens."""
    pulled_or_skip(QWEN_05B)
    from transformers import AutoTokenizer

    from thor_runtime.loading import load

    ours = load(QWEN_05B)
    assert ours.cfg.arch == "qwen2" and ours.cfg.num_layers == 24 and ours.cfg.hidden_size == 896
    path = Path(ours.source)
    msgs = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    ids = ours.tokenizer.encode_chat(msgs)
    ref_ids = AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name
    ).apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]
    assert ids == list(ref_ids)
    hf = hf_oracle(path.parent, path.name)
    logits = ours.model.forward(
        torch.tensor(ids), KVCache(ours.cfg, 128), logits_rows="last"
    ).logits[0]
    assert (logits - _hf_logits(hf, ids)[-1]).abs().max() < 1e-3
    res = Runtime(ours.model, ours.tokenizer).generate(
        ids, SamplingParams(max_tokens=16, ignore_eos=True)
    )
    assert res.token_ids == hf_greedy(hf, ids, 16)


@pytest.mark.skipif(
    not __import__("thor_runtime.kernels.lowbit", fromlist=["Int4Weight"]).Int4Weight.available(),
    reason="this torch has no CPU int4 kernel",
)
def test_qwen2_int4_weight_cache_entry_keeps_the_biases(tiny_qwen2, tmp_path):
    """What an int4 weight-cache entry stores (prepared_tensors) and how a hit rebuilds the
    model from it (weights_from_prepared): the q/k/v biases must survive, and the rebuilt model
    must compute exactly what the one built from the GGUF did."""
    from tests.helpers.gguf_writer import write_tiny_gguf
    from thor_runtime.engine.runner import attach
    from thor_runtime.loading.gguf_lowbit import gguf_weights_int4
    from thor_runtime.loading.gguf_weights import gguf_config, open_reader
    from thor_runtime.loading.hf_weights import hf_weights
    from thor_runtime.loading.weight_cache import prepared_tensors, weights_from_prepared
    from thor_runtime.models.dense import TargetModel

    path = tmp_path / "q2-q4.gguf"
    write_tiny_gguf(path, tiny_qwen2.cfg, hf_weights(Path(tiny_qwen2.source)), "Q4_0", arch="qwen2")
    r = open_reader(path)
    cfg = gguf_config(r, path)
    built = attach(TargetModel(cfg, gguf_weights_int4(r, cfg, path), torch.bfloat16, quant="int4"))
    tensors = prepared_tensors(built)
    assert all(f"{i}.bqkv" in tensors for i in range(cfg.num_layers))
    hit = attach(
        TargetModel(
            cfg,
            weights_from_prepared(cfg, tensors),
            torch.bfloat16,
            quant="int4",
            row_verdicts=dict(built.row_verdicts),
        )
    )
    for a, b in zip(built.layers, hit.layers):
        assert a.bqkv is not None and torch.equal(a.bqkv, b.bqkv)
    ids = torch.tensor(tiny_qwen2.tokenizer.encode(PROMPTS[0]))
    logits = [m.forward(ids, KVCache(cfg, 64, "fp32", m.dtype)).logits for m in (built, hit)]
    assert torch.equal(*logits)
