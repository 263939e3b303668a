"""GGUF hybrids (llama.cpp's qwen35 / qwen3next): a tiny random checkpoint written as the converter
writes it (gguf_writer.converted_hybrid) loads into the same model as its safetensors, bit for bit;
quantized files match their dequantized values; bad files are refused naming the tensor.
Mixture-of-experts files (qwen3next with experts, qwen35moe) likewise."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.gguf_writer import tile_value_heads, write_hybrid_gguf
from tests.helpers.tiny_hybrid import hf_model, make_hybrid_dir
from thor_runtime.errors import ThorError
from thor_runtime.loading import load

ARCHS = ("qwen3_5", "qwen3_next")
GGUF_ARCH = {"qwen3_5": "qwen35", "qwen3_next": "qwen3next"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_src")
    return {a: make_hybrid_dir(root / a, a, seed=10 + i) for i, a in enumerate(ARCHS)}


@pytest.fixture(scope="module")
def ggufs(dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_gguf")
    out = {}
    for a, d in dirs.items():
        out[a] = root / f"{a}.gguf"
        write_hybrid_gguf(out[a], d)
    return out


@pytest.fixture(scope="module")
def ids():
    return torch.randint(
        0, 320, (150,), generator=torch.Generator().manual_seed(1)
    )  # crosses a 64-row chunk


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-m", "thor_app.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _logits(model, ids, steps=3):
    """Prefill (chunked GDN form) of all but ``steps`` tokens, then that many 1-token decode
    steps."""
    cache = model.new_cache(256)
    rows = [model.forward(ids[:-steps], cache).logits]
    for t in ids[-steps:]:
        rows.append(model.forward(t[None], cache).logits)
    return torch.cat(rows)


# ---- parity -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_logits_equal_safetensors_and_transformers(arch, dirs, ggufs, ids):
    g, h = load(str(ggufs[arch])), load(str(dirs[arch]))
    assert g.cfg.arch == arch and dataclasses.replace(g.cfg, name=h.cfg.name) == h.cfg
    ours = _logits(g.model, ids)
    assert torch.equal(ours, _logits(h.model, ids))
    with torch.no_grad():
        ref = hf_model(dirs[arch])(ids[None]).logits[0]
    assert (ours - ref).abs().max() < 1e-4 and ref.abs().max() > 1e-2
    assert g.tokenizer.encode("pick up the red cup") == h.tokenizer.encode("pick up the red cup")


@pytest.mark.parametrize("arch", ARCHS)
def test_every_converter_rewrite_is_undone(arch, dirs, ggufs):
    """Each HF tensor comes back exactly, or (A_log, shifted norms) as the value the model computes
    from it: -exp(A_log) and 1 + w are what the file stores, and what HybridModel uses."""
    from thor_runtime.loading.gguf_weights import gguf_config, gguf_weights, open_reader

    r = open_reader(ggufs[arch])
    got = gguf_weights(r, gguf_config(r, ggufs[arch]), ggufs[arch])
    want = {k: v.float() for k, v in load_file(str(dirs[arch] / "model.safetensors")).items()}
    assert set(got) == set(want)
    for k, w in want.items():
        if k.endswith("A_log"):
            assert torch.equal(-got[k].exp(), -w.exp()), k
        elif k.endswith("norm.weight") and ".linear_attn." not in k:
            assert torch.equal(got[k] + 1.0, w + 1.0), k
        else:
            assert torch.equal(got[k], w), k


def test_value_heads_are_tiled_as_llama_cpp_documents():
    """Grouped by key head [G0v0, G0v1, G1v0, G1v1] -> tiled [G0v0, G1v0, G0v1, G1v1] (Hk = 2,
    r = 2), per row block of head_dim; and the loader's untile is its inverse."""
    from thor_runtime.loading.gguf_hybrid import untile

    assert tile_value_heads(torch.arange(4), 0, 2, 2, 1).tolist() == [0, 2, 1, 3]
    assert tile_value_heads(torch.arange(8), 0, 2, 2, 2).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    x = torch.randn(5, 3 * 4 * 6)
    assert torch.equal(untile(tile_value_heads(x, 1, 3, 4, 6), 1, 3, 4, 6), x)
    assert not torch.equal(tile_value_heads(x, 1, 3, 4, 6), x)


def test_a_log_comes_back_bit_exact():
    """log(-ssm_a) rounded to fp32 sometimes gives an A_log whose -exp is an ulp off the file's
    value; the loader searches the neighbouring fp32 values for one that reproduces it exactly."""
    from thor_runtime.loading.gguf_hybrid import _preimage

    stored = (
        -torch.empty(200_000)
        .uniform_(0.5, 8.0, generator=torch.Generator().manual_seed(0))
        .log()
        .exp()
    )
    guess = torch.log(-stored.double()).float()
    assert not torch.equal(-guess.exp(), stored)  # the plain inverse is not enough
    assert torch.equal(-_preimage(stored, lambda a: -a.exp(), guess).exp(), stored)


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_target_matches_safetensors(arch, dirs, ggufs, ids):
    g, h = load(str(ggufs[arch]), dtype="bf16"), load(str(dirs[arch]), dtype="bf16")
    assert torch.equal(_logits(g.model, ids[:40]), _logits(h.model, ids[:40]))


@pytest.mark.parametrize("arch,qtype", [("qwen3_5", "Q8_0"), ("qwen3_next", "Q4_1")])
def test_quantized_gguf_equals_its_dequantized_values(arch, qtype, dirs, tmp_path, ids):
    """Quantized 2-D weights dequantize on load: the same logits as a file holding those dequantized
    values as F32 (Qwen3.5's tiled value heads are put back after dequantization). Qwen3-Next's
    converter only moves whole rows, so there the file's blocks are the HF rows' own: the logits
    equal the model built from the HF weights quantized and dequantized by gguf."""
    import gguf
    import numpy as np

    from thor_runtime.loading.gguf_weights import open_reader
    from thor_runtime.models.hybrid.model import HybridModel

    q, f = tmp_path / "q.gguf", tmp_path / "f.gguf"
    write_hybrid_gguf(q, dirs[arch], qtype)
    write_hybrid_gguf(f, dirs[arch], qtype, store_dequantized=True)
    assert {t.tensor_type.name for t in open_reader(q).tensors} >= {qtype, "F32"}
    g = load(str(q))
    ours = _logits(g.model, ids[:70])
    assert torch.equal(ours, _logits(load(str(f)).model, ids[:70]))
    if arch == "qwen3_next":
        qt = gguf.GGMLQuantizationType[qtype]
        w = {k: v.float() for k, v in load_file(str(dirs[arch] / "model.safetensors")).items()}
        w = {
            k: torch.from_numpy(
                gguf.quants.dequantize(gguf.quants.quantize(v.numpy(), qt), qt)
                .reshape(v.shape)
                .astype(np.float32)
            )
            if v.ndim == 2
            else v
            for k, v in w.items()
        }
        assert torch.equal(ours, _logits(HybridModel(g.cfg, w), ids[:70]))


def test_int4_is_refused_and_auto_dequantizes(dirs, tmp_path):
    q = tmp_path / "q8.gguf"
    write_hybrid_gguf(q, dirs["qwen3_5"], "Q8_0")
    with pytest.raises(ThorError, match="int4 is not supported for hybrid"):
        load(str(q), dtype="int4")
    auto, fp32 = load(str(q), dtype="auto"), load(str(q))
    assert auto.model.quant is None and auto.model.dtype == torch.float32
    assert torch.equal(_logits(auto.model, torch.arange(9)), _logits(fp32.model, torch.arange(9)))


def test_mtp_blocks_are_skipped(dirs, ggufs, tmp_path, ids):
    p = tmp_path / "mtp.gguf"
    write_hybrid_gguf(p, dirs["qwen3_5"], mtp_blocks=1)
    g = load(str(p))
    assert g.cfg.num_layers == 4
    assert torch.equal(
        _logits(g.model, ids[:20]), _logits(load(str(ggufs["qwen3_5"])).model, ids[:20])
    )


# ---- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arch,name",
    [
        ("qwen3_5", "blk.1.ssm_a"),
        ("qwen3_5", "blk.0.ssm_conv1d.weight"),
        ("qwen3_next", "blk.2.ssm_ba.weight"),
        ("qwen3_next", "blk.0.attn_gate.weight"),
    ],
)
def test_bad_ssm_tensor_is_refused(arch, name, dirs, tmp_path):
    missing, bent = tmp_path / "missing.gguf", tmp_path / "bent.gguf"
    write_hybrid_gguf(missing, dirs[arch], edit=lambda t: t.pop(name))
    with pytest.raises(ThorError, match=f"missing tensor {name}$"):
        load(str(missing))
    write_hybrid_gguf(bent, dirs[arch], edit=lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(ThorError, match=f"tensor {name} has shape"):
        load(str(bent))
    r = _cli("generate", "hi", "--model", str(bent if "ssm" in name else missing))
    assert r.returncode == 2 and name in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_cli_generates_from_a_hybrid_gguf(ggufs, dirs):
    from thor_runtime.engine.generate import Runtime
    from thor_runtime.engine.sampling import SamplingParams

    r = _cli(
        "generate", "pick up", "--max-tokens", "6", "--json", "--model", str(ggufs["qwen3_next"])
    )
    assert r.returncode == 0, r.stderr
    h = load(str(dirs["qwen3_next"]))
    want = Runtime(h.model, h.tokenizer).generate(
        h.tokenizer.encode("pick up"), SamplingParams(max_tokens=6)
    )
    assert json.loads(r.stdout)["token_ids"] == want.token_ids and len(want.token_ids) == 6


def test_positive_ssm_a_is_refused(dirs, tmp_path):
    p = tmp_path / "a.gguf"
    write_hybrid_gguf(
        p, dirs["qwen3_5"], edit=lambda t: t.__setitem__("blk.0.ssm_a", -t["blk.0.ssm_a"])
    )
    with pytest.raises(ThorError, match="blk.0.ssm_a has positive values"):
        load(str(p))


# ---- mixture of experts ------------------------------------------------------------------------
MOE_ARCHS = ("qwen3_next_moe", "qwen3_5_moe")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """{arch: (HF dir, GGUF)}: Qwen3-Next keeps one tensor per expert and a dense layer 2 with an
    un-renormalised router; Qwen3.5-MoE fused 3-D experts in every layer."""
    root = tmp_path_factory.mktemp("moe_gguf")
    out = {}
    for i, a in enumerate(MOE_ARCHS):
        d = make_hybrid_dir(root / a, a, seed=20 + i)
        write_hybrid_gguf(root / f"{a}.gguf", d)
        out[a] = (d, root / f"{a}.gguf")
    return out


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_moe_gguf_logits_equal_safetensors_and_transformers(arch, moe, ids):
    from thor_runtime.loading.gguf_weights import open_reader

    d, p = moe[arch]
    assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate_inp_shexp.weight"} <= {
        t.name for t in open_reader(p).tensors
    }
    g, h = load(str(p)), load(str(d))
    assert dataclasses.replace(g.cfg, name=h.cfg.name) == h.cfg
    assert g.cfg.moe_layers == ((0, 1, 3) if arch == "qwen3_next_moe" else (0, 1, 2, 3))
    assert g.cfg.norm_topk_prob == (arch == "qwen3_5_moe")
    ours = _logits(g.model, ids)
    assert torch.equal(ours, _logits(h.model, ids))  # fp32 file: bit for bit
    with torch.no_grad():
        ref = hf_model(d)(ids[None]).logits[0]
    assert (ours - ref).abs().max() < 1e-4 and ref.abs().max() > 1e-2


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_expert_tensors_come_back_fused(arch, moe):
    """The converter's stacking (and, for fused checkpoints, its gate / up split) is undone into
    the fused form: gate_up [E, 2 I, D] (gate rows first), down [E, D, I], router and shared
    expert as saved."""
    from thor_runtime.loading.gguf_weights import gguf_config, gguf_weights, open_reader
    from thor_runtime.models.hybrid.weights import canonical

    d, p = moe[arch]
    r = open_reader(p)
    cfg = gguf_config(r, p)
    got = gguf_weights(r, cfg, p)
    want = canonical(
        cfg, {k: v.float() for k, v in load_file(str(d / "model.safetensors")).items()}
    )
    for i in cfg.moe_layers:
        m = f"model.layers.{i}.mlp."
        for k in (
            "experts.gate_up_proj",
            "experts.down_proj",
            "gate.weight",
            "shared_expert_gate.weight",
            "shared_expert.gate_proj.weight",
            "shared_expert.up_proj.weight",
            "shared_expert.down_proj.weight",
        ):
            assert torch.equal(got[m + k], want[m + k]), m + k
    assert got["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 64)


def test_quantized_moe_gguf_equals_its_dequantized_values(moe, tmp_path, ids):
    """Stacked 3-D expert tensors quantize per row like 2-D ones and dequantize on load."""
    from thor_runtime.loading.gguf_weights import open_reader

    d = moe["qwen3_5_moe"][0]
    q, f = tmp_path / "q.gguf", tmp_path / "f.gguf"
    write_hybrid_gguf(q, d, "Q8_0")
    write_hybrid_gguf(f, d, "Q8_0", store_dequantized=True)
    assert (
        next(
            t for t in open_reader(q).tensors if t.name == "blk.0.ffn_up_exps.weight"
        ).tensor_type.name
        == "Q8_0"
    )
    assert torch.equal(_logits(load(str(q)).model, ids[:40]), _logits(load(str(f)).model, ids[:40]))


def test_shared_expert_gate_stored_as_a_vector_loads(moe, tmp_path, ids):
    """Quantizing tools may keep the shared expert's one-row gate as [D]; it reads as [1, D]."""
    d, p = moe["qwen3_next_moe"]
    v = tmp_path / "vec.gguf"
    write_hybrid_gguf(
        v, d, edit=lambda t: t.update({k: t[k].reshape(-1) for k in t if "ffn_gate_inp_shexp" in k})
    )
    assert torch.equal(_logits(load(str(v)).model, ids[:30]), _logits(load(str(p)).model, ids[:30]))


def test_router_renormalises_unless_the_file_says_not(moe, tmp_path):
    """The converter writes no norm_topk_prob: without expert_weights_norm the router renormalises
    (the published checkpoints' setting); the tiny Qwen3-Next file says false and is read so."""
    from thor_runtime.loading.gguf_weights import field_value, gguf_config, open_reader

    p = moe["qwen3_next_moe"][1]
    r = open_reader(p)
    assert (
        field_value(r, "qwen3next.expert_weights_norm") is False
        and not gguf_config(r, p).norm_topk_prob
    )
    d2 = make_hybrid_dir(tmp_path / "norm", "qwen3_next_moe", seed=3, norm_topk_prob=True)
    p2 = tmp_path / "norm.gguf"
    write_hybrid_gguf(p2, d2)
    r2 = open_reader(p2)
    assert field_value(r2, "qwen3next.expert_weights_norm") is None
    assert gguf_config(r2, p2).norm_topk_prob and load(str(d2)).cfg.norm_topk_prob


@pytest.mark.parametrize(
    "arch,name",
    [
        ("qwen3_next_moe", "blk.1.ffn_down_exps.weight"),
        ("qwen3_next_moe", "blk.3.ffn_gate_inp_shexp.weight"),
        ("qwen3_5_moe", "blk.0.ffn_gate_inp.weight"),
        ("qwen3_5_moe", "blk.2.ffn_up_exps.weight"),
    ],
)
def test_bad_expert_tensor_is_refused(arch, name, moe, tmp_path):
    d = moe[arch][0]
    missing, bent = tmp_path / "missing.gguf", tmp_path / "bent.gguf"
    write_hybrid_gguf(missing, d, edit=lambda t: t.pop(name))
    with pytest.raises(ThorError, match=f"missing tensor {name}$"):
        load(str(missing))
    write_hybrid_gguf(bent, d, edit=lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(ThorError, match=f"tensor {name} has shape"):
        load(str(bent))
    if "down_exps" in name:
        r = _cli("generate", "hi", "--model", str(bent))
        assert r.returncode == 2 and name in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_expert_tensors_without_expert_count_are_refused(dirs, tmp_path):
    p = tmp_path / "router.gguf"
    write_hybrid_gguf(
        p,
        dirs["qwen3_next"],
        edit=lambda t: t.__setitem__("blk.0.ffn_gate_inp.weight", torch.zeros(4, 64)),
    )
    with pytest.raises(
        ThorError, match="layer 0 has mixture-of-experts tensors but qwen3next.expert_count is 0"
    ):
        load(str(p))


def test_architecture_read_from_the_header_alone(ggufs, tmp_path):
    """The hybrid check reads general.architecture from the header, not through gguf's
    reader (which parses the whole vocabulary: ~3 s of a warm start on the default model);
    a file it cannot read that way answers None and the reader decides."""
    from thor_runtime.loading import resolve
    from thor_runtime.loading.gguf_weights import field_value, gguf_architecture, open_reader

    for path in [*ggufs.values(), resolve("default")]:
        assert gguf_architecture(path) == field_value(open_reader(path), "general.architecture")
    assert gguf_architecture(ggufs["qwen3_5"]) == "qwen35"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(8))
    assert gguf_architecture(bad) is None
