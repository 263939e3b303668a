"""The runner (thor_runtime/engine/runner.py): both target classes are one interface, and the kernel
registry is tried in order — per runtime for who owns decode, per forward for the rest."""

from __future__ import annotations

import torch

from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.runner import DECODE, FORWARD, DecodeAsk, pick_decode
from thor_runtime.models.target import Target


def test_dense_and_hybrid_targets_are_one_interface(tiny_llama, tiny_qwen3_5):
    dense, hybrid = tiny_llama.model, tiny_qwen3_5.model
    assert isinstance(dense, Target) and isinstance(hybrid, Target)
    assert not dense.is_hybrid and hybrid.is_hybrid
    assert dense.new_cache(8, "fp8").kv_dtype == "fp8"
    assert hybrid.new_cache(8).length == 0


def test_registry_order():
    assert [k.name for k in FORWARD] == [
        "rowstep",
        "ort-step-graph",
        "fused-graphs",
        "engine",
        "torch",
    ]
    assert [o.name for o in DECODE] == ["fixed-shape", "padded-verify", "model"]


def test_decode_owner_fits_model_and_device(tiny_llama, tiny_qwen3_5):
    dense, hybrid = tiny_llama.model, tiny_qwen3_5.model
    assert pick_decode(DecodeAsk(dense)).name == "model"  # CPU: row-invariant kernels
    assert pick_decode(DecodeAsk(dense, fixed_shape=True, step_rows=4)).name == "fixed-shape"
    assert pick_decode(DecodeAsk(hybrid, fixed_shape=True, step_rows=4)).name == "padded-verify"
    assert pick_decode(DecodeAsk(hybrid)).name == "model"
    rt = Runtime(dense, tiny_llama.tokenizer, fixed_shape=True, step_rows=4)
    assert rt.decode.name == "fixed-shape" and rt.verify == rt.decoder.verify


def test_forward_kernels_fit_cache_and_backend(tiny_llama):
    from engines.backend import TorchBackend, using

    m = tiny_llama.model
    r = m.runner
    cache = m.new_cache(8)
    assert r is not None and r.pick(cache, 1, True).name == "torch" and m.decode_kernel == "torch"
    with using(m, TorchBackend(m)):  # the reference backend attaches as "no backend"
        assert r.pick(cache, 1, True).name == "torch"
    m.backend = m.backend_exact = object()
    try:
        assert r.pick(cache, 3, True).name == "engine"
    finally:
        m.backend = m.backend_exact = None


def test_bare_model_runs_the_layer_path_as_the_runner_does(tiny_llama):
    m = tiny_llama.model
    ids = torch.tensor(tiny_llama.tokenizer.encode("a robot picks the red cup"))
    with_runner = m.prefill(ids, m.new_cache(len(ids))).logits
    r, m.runner = m.runner, None
    try:
        bare = m.prefill(ids, m.new_cache(len(ids))).logits
    finally:
        m.runner = r
    assert torch.equal(with_runner, bare)
