"""engines/ on mixture-of-experts hybrids: the graphs cover each MoE layer's dense part up to
the block's input (``pre_moe``), the MoE block itself stays eager in torch; per-segment parity,
greedy and speculative output equal to torch's on ONNX Runtime, verify rows bit for bit 1-row
steps."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.tiny_hybrid import make_hybrid_dir

pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")

from engines.backend import BackendOptions, RowWiseGraphs, TorchBackend, make_backend, using
from engines.segments import graph_plan
from engines.selftest import THRESHOLDS, check_segments
from thor_app.cli import main
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.loading import load
from thor_runtime.speculative import PLAIN, SpecOptions, build_speculation

ARCHS = ("qwen3_next_moe", "qwen3_5_moe")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_engines")
    return {a: make_hybrid_dir(root / a, a, seed=20 + i) for i, a in enumerate(ARCHS)}


@pytest.fixture(scope="module")
def loaded(dirs):
    return {a: load(str(d)) for a, d in dirs.items()}


@pytest.fixture(scope="module")
def ort(loaded, tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_engine_cache")
    return {
        a: make_backend("onnxruntime", m.model, BackendOptions(cache_dir=str(root)))
        for a, m in loaded.items()
    }


def _greedy(model, tok, ids, n, spec=PLAIN):
    return (
        Runtime(model, tok)
        .generate(ids, SamplingParams(max_tokens=n, ignore_eos=True), spec)
        .token_ids
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_moe_layers_export_their_dense_part_and_keep_the_block_eager(arch, loaded, ort):
    cfg = loaded[arch].cfg
    plan = graph_plan(cfg, "segments")
    moe = list(cfg.moe_layers)
    assert moe and [i for s, i in plan if s == "pre_moe"] == moe
    # the dense MLP's graph only where the layer has a dense MLP (Qwen3-Next: layer 2)
    assert [i for s, i in plan if s == "post_attn"] == [
        i for i in range(cfg.num_layers) if i not in moe
    ]
    assert [i for s, i in plan if s == "post_gdn"] == list(cfg.gdn_layers)
    assert ort[arch].plan == plan
    # a MoE layer's graph holds its out projection and norm only: the router, the experts and
    # the shared expert (w_gate_up / w_down) stay in torch
    import onnx

    b = ort[arch]
    for g in b.entry.graphs:
        if g["segment"] == "pre_moe":
            i = g["layer"]
            names = {
                t.name for t in onnx.load_from_string(b.entry.read(g["onnx"])).graph.initializer
            }
            assert names == {f"layers.{i}.w_out", f"layers.{i}.mlp_norm"}, names


@pytest.mark.parametrize("arch", ARCHS)
def test_moe_segments_match_torch_and_generate_identically(arch, loaded, ort, monkeypatch):
    m, tok, b = loaded[arch].model, loaded[arch].tokenizer, ort[arch]
    calls = []
    run = b.run
    monkeypatch.setattr(
        b,
        "run",
        lambda segment, layer, *xs: calls.append((segment, layer)) or run(segment, layer, *xs),
    )
    checks = check_segments(m, b, THRESHOLDS["fp32"])
    assert len(checks) == len(b.plan) and all(c.passed for c in checks), [
        c for c in checks if not c.passed
    ]
    assert any(c.name.startswith("segment pre_moe.") for c in checks)
    # the graph's h_out and x against the model's own segment, on the same inputs
    i = m.cfg.moe_layers[0]
    h, o = (
        torch.randn(4, m.cfg.hidden_size),
        0.5
        * torch.randn(
            4, m.cfg.value_dim if i in m.cfg.gdn_layers else m.cfg.num_heads * m.cfg.head_dim
        ),
    )
    for want, got in zip(TorchBackend(m).run("pre_moe", i, h, o), b.run("pre_moe", i, h, o)):
        assert torch.allclose(want, got, atol=1e-5)
    ids = tok.encode("pick up the red cup and put it on the shelf")
    ref = _greedy(m, tok, ids, 16)
    with using(m, b):
        got = _greedy(m, tok, ids, 16)
        spec = _greedy(
            m,
            tok,
            ids,
            16,
            build_speculation(SpecOptions(method="ngram", ngram_k=4, fixed_k=True), m),
        )
        logits = m.prefill(torch.tensor(ids), m.new_cache(64)).logits
    assert got == ref and spec == got
    assert {i for s, i in calls if s == "pre_moe"} == set(m.cfg.moe_layers)  # the graphs did run
    assert torch.allclose(logits, m.prefill(torch.tensor(ids), m.new_cache(64)).logits, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_moe_verify_on_onnxruntime_is_bitwise_one_row_steps(arch, loaded, ort):
    """16 verify rows through the graphs and the eager MoE block: each row's logits, K/V and
    recurrent state are a 1-row step's bit for bit (the kernels probed at attach, including
    pre_moe, else run row by row)."""
    m, tok, b = loaded[arch].model, loaded[arch].tokenizer, ort[arch]
    ids = torch.tensor(
        tok.encode(
            "The robot picks up the red mug and places it in the dish rack, then it goes back"
        )
    )
    runs = []
    with using(m, b):
        assert m.backend is b and (
            m.backend_exact is b or isinstance(m.backend_exact, RowWiseGraphs)
        )
        for one_row in (True, False):
            cache = m.new_cache(32)
            m.prefill(ids[:9], cache)
            if one_row:
                logits = torch.cat([m.verify(ids[j : j + 1], cache).logits for j in range(9, 25)])
            else:
                logits = m.verify(ids[9:25], cache).logits  # [16, V]
            state = [t for j in range(len(m.cfg.attn_layers)) for t in cache.kv.view(j)]
            state += [cache.rec.current(j) for j in range(len(m.cfg.gdn_layers))]
            runs.append((logits, state))
    (la, sa), (lb, sb) = runs
    assert torch.equal(la, lb)
    assert all(torch.equal(x, y) for x, y in zip(sa, sb))


def test_selftest_cli_onnxruntime_passes_on_a_moe_hybrid(dirs, tmp_path, capsys):
    rc = main(
        [
            "selftest",
            "--backend",
            "onnxruntime",
            "--model",
            str(dirs["qwen3_next_moe"]),
            "--json",
            "--engine-cache",
            str(tmp_path),
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["passed"], [c for c in rep["checks"] if not c["passed"]]
    names = {c["name"] for c in rep["checks"]}
    # Qwen3-Next: layer 2 keeps a dense MLP, the others end at their MoE block
    assert {
        "segment pre_moe.0",
        "segment pre_moe.1",
        "segment post_attn.2",
        "segment pre_moe.3",
    } <= names
    assert "speculative (ngram, K=4) vs plain on onnxruntime" in names
