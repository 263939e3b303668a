"""Mixture-of-experts MLP blocks on hybrid targets (Qwen3-Next, Qwen3.5-MoE): transformers'
layer rules and logits, both checkpoint forms of the experts, verify rows bit-for-bit 1-row
steps, speculative output equal to plain, refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.proposers import Steered
from tests.helpers.tiny import edited_copy
from tests.helpers.tiny_hybrid import HYBRID_CONFIGS, hf_model, make_hybrid_dir
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.loading import load
from thor_runtime.models.hybrid.config import hybrid_config_from_hf
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer

ARCHS = ("qwen3_next_moe", "qwen3_5_moe")
TOL = 1e-4  # fp32 logits vs transformers


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {a: make_hybrid_dir(root / a, a, seed=10 + i) for i, a in enumerate(ARCHS)}


@pytest.fixture(scope="module")
def loaded(dirs):
    return {a: load(str(d)) for a, d in dirs.items()}


def _fused_copy(src: Path, dst: Path, prefix: str = "model.") -> Path:
    """The checkpoint with each MoE layer's experts in the fused 3-D form (gate rows, then up
    rows, per expert), as Qwen3.5-MoE's published files keep them, under ``prefix``."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    w = load_file(str(src / "model.safetensors"))
    out = {}
    for k, v in sorted(w.items()):
        head, sep, tail = k.partition(".mlp.experts.")
        if not sep:
            out[k.replace("model.", prefix, 1)] = v
        elif tail.startswith("0.gate_proj"):
            m = head.replace("model.", prefix, 1) + ".mlp.experts."
            E = sum(
                1
                for n in w
                if n.startswith(head + ".mlp.experts.") and n.endswith("down_proj.weight")
            )
            per = {
                n: torch.stack([w[f"{head}.mlp.experts.{e}.{n}.weight"] for e in range(E)])
                for n in ("gate_proj", "up_proj", "down_proj")
            }
            out[m + "gate_up_proj"] = torch.cat(
                [per["gate_proj"], per["up_proj"]], dim=1
            )  # [E, 2 I, D]
            out[m + "down_proj"] = per["down_proj"]  # [E, D, I]
    save_file(out, str(dst / "model.safetensors"))
    return dst


def _ids(vocab: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


# ---- config: transformers' layer rules ----------------------------------------------------------
@pytest.mark.parametrize(
    "arch,over",
    [
        ("qwen3_next_moe", {}),
        ("qwen3_next_moe", dict(decoder_sparse_step=2, mlp_only_layers=[])),
        (
            "qwen3_next_moe",
            dict(decoder_sparse_step=1, mlp_only_layers=[0, 3], norm_topk_prob=True),
        ),
        ("qwen3_next_moe", dict(num_experts=0)),
        ("qwen3_5_moe", {}),
    ],
)
def test_moe_layers_follow_transformers(arch, over):
    """Which layers get a MoE block, read from the config as transformers builds the model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(HYBRID_CONFIGS[arch], **over)
    archs, model_type = kw.pop("architectures"), kw.pop("model_type")
    hf_cfg = AutoConfig.for_model(model_type, vocab_size=300, **kw)
    want = tuple(
        i
        for i, L in enumerate(AutoModelForCausalLM.from_config(hf_cfg).model.layers)
        if hasattr(L.mlp, "experts")
    )
    cfg = hybrid_config_from_hf(hf_cfg.to_dict(), archs[0], "config.json", "tiny")
    assert cfg.moe_layers == want
    if want:
        assert (cfg.num_experts, cfg.num_experts_per_tok) == (
            hf_cfg.num_experts,
            hf_cfg.num_experts_per_tok,
        )
        assert cfg.norm_topk_prob == (arch == "qwen3_5_moe" or hf_cfg.norm_topk_prob)


# ---- parity with transformers -------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(arch, dirs, loaded):
    m = loaded[arch].model
    assert m.cfg.moe_layers == {"qwen3_next_moe": (0, 1, 3), "qwen3_5_moe": (0, 1, 2, 3)}[arch]
    ids = _ids(m.cfg.vocab_size, 150, 0)
    with torch.no_grad():
        ref = hf_model(dirs[arch])(ids[None]).logits[0]  # [150, V]
    one = m.new_cache(200)  # one-pass prefill, all rows
    assert (m.forward(ids, one, chunked=True).logits - ref).abs().max() <= TOL
    for chunk in (0, 16, 50):  # 16: token-by-token experts in prefill; 0, 50: grouped by expert
        c = m.new_cache(200)
        assert (m.prefill(ids[:100], c, chunk).logits[0] - ref[99]).abs().max() <= TOL
        for t in range(100, 106):  # step decode
            assert (m.forward(ids[t : t + 1], c).logits[0] - ref[t]).abs().max() <= TOL
        assert (m.verify(ids[106:122], c).logits - ref[106:122]).abs().max() <= TOL


def test_fused_and_per_expert_checkpoints_agree(dirs, loaded, tmp_path):
    """The fused form (Qwen3.5-MoE's files) and the per-expert form (Qwen3-Next's) of the same
    weights: transformers reads both alike, and so do we, bit for bit."""
    src = dirs["qwen3_next_moe"]
    fused = _fused_copy(src, tmp_path / "fused")
    assert "model.layers.0.mlp.experts.gate_up_proj" in load_file(str(fused / "model.safetensors"))
    ids = _ids(300, 40, 1)
    with torch.no_grad():
        assert torch.allclose(
            hf_model(fused)(ids[None]).logits, hf_model(src)(ids[None]).logits, atol=1e-6
        )
    m, f = loaded["qwen3_next_moe"].model, load(str(fused)).model
    assert torch.equal(
        f.forward(ids, f.new_cache(64)).logits, m.forward(ids, m.new_cache(64)).logits
    )


def test_multimodal_moe_text_part_loads(dirs, loaded, tmp_path):
    """A Qwen3_5MoeForConditionalGeneration directory as published: the language model under
    model.language_model., fused experts, a vision tower that is not read."""
    vl = _fused_copy(dirs["qwen3_5_moe"], tmp_path / "vl", prefix="model.language_model.")
    text = json.loads((vl / "config.json").read_text())
    (vl / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3_5MoeForConditionalGeneration"],
                "model_type": "qwen3_5_moe",
                "text_config": text,
                "vision_config": {},
                "tie_word_embeddings": False,
            }
        )
    )
    w = load_file(str(vl / "model.safetensors"))
    save_file(
        dict(w, **{"model.visual.patch_embed.proj.weight": torch.zeros(2, 2)}),
        str(vl / "model.safetensors"),
    )
    got, want = load(str(vl)).model, loaded["qwen3_5_moe"].model
    assert got.cfg.moe_layers == want.cfg.moe_layers
    ids = torch.arange(9)
    assert torch.equal(
        got.forward(ids, got.new_cache(16)).logits, want.forward(ids, want.new_cache(16)).logits
    )


# ---- exactness: verify rows are 1-row steps ---------------------------------------------------
@pytest.mark.parametrize(
    "dtype,layout", [("fp32", "auto"), ("fp32", "dense"), ("bf16", "auto"), ("int8", "auto")]
)
def test_verify_rows_are_one_row_steps(dtype, layout, dirs):
    """A K+1-row verify gives every row the very logits 1-row steps give it, and after a partial
    accept of n drafts the next step's logits equal plain decoding's, bit for bit."""
    L = load(str(dirs["qwen3_next_moe"]), dtype=dtype, layout=layout)
    m, K, P = L.model, 7, 30
    ids = _ids(m.cfg.vocab_size, P + K + 2, 2)
    routed = set()  # the experts each verify/step row picks: they must differ

    def spy(orig):
        def route(logits):
            w, idx = orig(logits)
            if idx.dim() == 1:
                routed.add(tuple(idx.tolist()))
            return w, idx

        return route

    for layer in m.layers:
        if layer.moe is not None:
            layer.moe._route = spy(layer.moe._route)
    for n in (0, 3, K):
        spec, plain = m.new_cache(64), m.new_cache(64)
        m.prefill(ids[:P], spec)
        m.prefill(ids[:P], plain)
        rows = m.verify(ids[P : P + K + 1], spec).logits  # [K + 1, V]
        steps = torch.cat([m.verify(ids[t : t + 1], plain).logits for t in range(P, P + n + 1)])
        assert torch.equal(rows[: n + 1], steps), (dtype, layout, n)
        spec.crop(P + n + 1)
        nxt = ids[P + n + 1 : P + n + 2]
        assert torch.equal(m.verify(nxt, spec).logits, m.verify(nxt, plain).logits), (
            dtype,
            layout,
            n,
        )
    assert len(routed) > 4


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_equals_plain(arch, loaded):
    L = loaded[arch]
    tok = L.tokenizer
    ids = tok.encode(
        "pick up the red cup and place it on the table. pick up the red cup and place it"
    )
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    want = Runtime(L.model, tok).generate(ids, params).token_ids
    rt = Runtime(L.model, tok, prefill_chunk=8)
    ngram = rt.generate(
        ids, params, speculation=Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget())
    )
    assert ngram.token_ids == want
    steered = rt.generate(ids, params, speculation=Speculation(Steered(ids + want, 5), 7))
    assert steered.token_ids == want and steered.stats.cycles < len(want)  # drafts were accepted


# ---- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "form,name",
    [
        ("per_expert", "model.layers.3.mlp.experts.5.up_proj.weight"),
        ("per_expert", "model.layers.0.mlp.gate.weight"),
        ("per_expert", "model.layers.1.mlp.shared_expert_gate.weight"),
        ("fused", "model.layers.1.mlp.experts.gate_up_proj"),
        ("fused", "model.layers.3.mlp.experts.down_proj"),
    ],
)
def test_bad_expert_tensor_is_refused(form, name, dirs, tmp_path):
    src = (
        dirs["qwen3_next_moe"]
        if form == "per_expert"
        else _fused_copy(dirs["qwen3_5_moe"], tmp_path / "f")
    )
    missing = edited_copy(src, tmp_path / "missing", lambda w: w.pop(name))
    with pytest.raises(ThorError, match=f"missing tensor {name}"):
        load(str(missing))
    bent = edited_copy(
        src, tmp_path / "bent", lambda w: w.__setitem__(name, w[name][..., :-1].contiguous())
    )
    with pytest.raises(ThorError, match=f"tensor {name} has shape"):
        load(str(bent))
    if name.endswith(
        "experts.5.up_proj.weight"
    ):  # once through the CLI: exit 2, the name, no traceback
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        r = subprocess.run(
            [sys.executable, "-m", "thor_app.cli", "generate", "hi", "--model", str(bent)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 2 and name in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "edit,match",
    [
        (dict(num_experts_per_tok=9), "num_experts_per_tok 9 exceeds num_experts 8"),
        (dict(decoder_sparse_step=0), "decoder_sparse_step must be positive"),
        (dict(moe_intermediate_size=None), "lacks required key 'moe_intermediate_size'"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    ],
)
def test_bad_moe_config_is_refused(edit, match, dirs):
    c = json.loads((dirs["qwen3_next_moe"] / "config.json").read_text())
    c = {k: v for k, v in dict(c, **edit).items() if v is not None}
    with pytest.raises(ThorError, match=match):
        hybrid_config_from_hf(c, "Qwen3NextForCausalLM", "config.json", "tiny")
