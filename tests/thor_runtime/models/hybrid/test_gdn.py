"""Hybrid Gated-DeltaNet targets: parity with transformers, the two GDN forms, constant-time
rollback from checkpoint slots, speculative exactness, refusals, drafter distillation.
Mixture-of-experts blocks: test_moe.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.proposers import Steered
from tests.helpers.tiny import edited_copy, proposer_and_k, random_drafter
from tests.helpers.tiny_hybrid import hf_model, make_hybrid_dir
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.loading import load
from thor_runtime.models.hybrid import gdn as G
from thor_runtime.speculative import SpecOptions, Speculation
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer

ARCHS = ("qwen3_5", "qwen3_next")
TOL = 1e-4  # fp32 logits vs transformers
FP8_TOL = 0.1  # fp8 e4m3 K/V (unit scales) in the attention layers vs transformers' fp32


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    return {a: make_hybrid_dir(root / a, a, seed=i) for i, a in enumerate(ARCHS)}


@pytest.fixture(scope="module")
def loaded(dirs):
    return {a: load(str(d)) for a, d in dirs.items()}


@pytest.fixture(scope="module")
def ref_logits(dirs, loaded):
    """Transformers' logits for one 150-token sequence per arch (crosses a 64-row chunk)."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for a, d in dirs.items():
        ids = torch.randint(0, loaded[a].cfg.vocab_size, (150,), generator=g)
        with torch.no_grad():
            out[a] = ids, hf_model(d)(ids[None]).logits[0]
    return out


# ---- parity with transformers ----------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kv,tol", [("fp32", TOL), ("fp8", FP8_TOL)])
def test_logits_match_transformers(arch, kv, tol, loaded, ref_logits):
    m = loaded[arch].model
    ids, ref = ref_logits[arch]
    assert m.cfg.gdn_layers == (0, 1, 2) and m.cfg.attn_layers == (3,) and m.cfg.rotary_dim == 4
    one = m.new_cache(200, kv)  # one-pass prefill, all rows
    assert (m.forward(ids, one, chunked=True).logits - ref).abs().max() <= tol
    for chunk in (0, 16, 50):  # chunked prefill, then decode
        c = m.new_cache(200, kv)
        last = m.prefill(ids[:100], c, chunk).logits
        assert (last[0] - ref[99]).abs().max() <= tol
        for t in range(100, 106):  # step decode (recurrent form)
            assert (m.forward(ids[t : t + 1], c).logits[0] - ref[t]).abs().max() <= tol
        verify = m.forward(ids[106:122], c).logits  # a 16-row verify
        assert (verify - ref[106:122]).abs().max() <= tol


@pytest.mark.parametrize("arch", ARCHS)
def test_taps_are_the_layers_hidden_states(arch, dirs, loaded, ref_logits):
    """What the DFlash drafter reads on a hybrid (its taps) is each layer's output, as
    transformers computes it, in a one-pass prefill and in step decode: token identity of a
    speculative run alone would not notice wrong taps."""
    m = loaded[arch].model
    ids = ref_logits[arch][0][:40]
    taps = tuple(range(m.cfg.num_layers - 1))  # transformers' last entry is after the final norm
    with torch.no_grad():
        ref = hf_model(dirs[arch])(ids[None], output_hidden_states=True).hidden_states
    got = m.forward(ids, m.new_cache(64), taps, chunked=True).taps
    c = m.new_cache(64)
    m.prefill(ids[:30], c)
    steps = [m.forward(ids[t : t + 1], c, taps).taps for t in range(30, 40)]
    for i in taps:
        assert (got[i] - ref[i + 1][0]).abs().max() <= TOL
        assert (torch.cat([s[i] for s in steps]) - ref[i + 1][0, 30:40]).abs().max() <= TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_int8_weights_run_and_verify_rows_are_steps(arch, dirs, loaded):
    """--dtype int8 on a hybrid: close to fp32, and a verify's rows are 1-row steps bit for bit
    (it failed before on the gated attention output, a non-contiguous view)."""
    m = load(str(dirs[arch]), dtype="int8").model
    ids = torch.randint(0, m.cfg.vocab_size, (38,), generator=torch.Generator().manual_seed(4))
    ref = loaded[arch].model.forward(ids, loaded[arch].model.new_cache(64)).logits
    spec, plain = m.new_cache(64), m.new_cache(64)
    m.prefill(ids[:30], spec)
    m.prefill(ids[:30], plain)
    rows = m.verify(ids[30:], spec).logits  # [8, V]
    steps = torch.cat([m.verify(ids[t : t + 1], plain).logits for t in range(30, 38)])
    assert torch.equal(rows, steps)
    assert torch.nn.functional.cosine_similarity(rows.float(), ref[30:], dim=-1).min() > 0.99


def test_chunked_and_recurrent_forms_agree():
    """The parallel form (prefill) and the row-by-row form (decode/verify) on random inputs."""
    g = torch.Generator().manual_seed(1)
    Hk, Hv, dk, dv, k, T = 2, 4, 8, 6, 4, 150
    C = 2 * Hk * dk + Hv * dv
    w = G.GDNWeights(
        torch.randn(C, k, generator=g) * 0.5,
        -torch.rand(Hv, generator=g) * 4 - 0.1,
        torch.randn(Hv, generator=g),
        Hk,
        Hv,
        dk,
        dv,
    )
    win = torch.randn(k - 1 + T, C, generator=g)
    b, a, s0 = (
        torch.randn(T, Hv, generator=g),
        torch.randn(T, Hv, generator=g),
        torch.randn(Hv, dk, dv, generator=g),
    )
    o_c, s_c = G.chunked(w, win, b, a, s0)
    s, outs = s0.clone(), []
    for t in range(T):
        outs.append(G.step(w, win[t : t + k], b[t], a[t], s, s))
    assert torch.allclose(torch.stack(outs), o_c, atol=1e-4) and torch.allclose(s, s_c, atol=1e-4)


# ---- constant-time rollback --------------------------------------------------------------------
def _spy_mixer_inputs(model, fn):
    """Run fn() and return each GDN layer's mixer inputs (qkv, z, b, a) of its last forward."""
    seen, orig = {}, model.pre_gdn

    def spy(i, h):
        out = orig(i, h)
        seen[i] = [t.clone() for t in out]
        return out

    model.pre_gdn = spy
    try:
        fn()
    finally:
        del model.pre_gdn
    return seen


def _mixer(model, i, cache, qkv, b, a):
    """Run only layer i's GDN mixer on ``cache`` (recurrent form), as one forward of len(qkv)
    rows."""
    cache.begin(torch.zeros(qkv.shape[0], dtype=torch.long), recurrent=True)
    model.gdn(i, qkv, b, a, cache)
    cache.end()


@pytest.mark.parametrize("arch", ARCHS)
def test_partial_accept_state_equals_plain_decode_and_replay(arch, loaded):
    """Verify K+1 rows, accept n drafts (crop): for every n in 0..K the current state IS the state
    after row n, bit for bit the state 1-row decode steps of the committed rows produce and the
    state the replay path (snapshot -> restore -> re-run the accepted rows) produces."""
    m = loaded[arch].model
    K, P = 7, 30
    ids = torch.randint(
        0, m.cfg.vocab_size, (P + K + 1,), generator=torch.Generator().manual_seed(2)
    )
    for n in range(K + 1):
        a = m.new_cache(64)
        m.prefill(ids[:P], a)
        inputs = _spy_mixer_inputs(m, lambda: m.forward(ids[P:], a))
        slots_before = [s.data_ptr() for s in a.rec.ssm]
        a.crop(P + n + 1)
        assert a.length == a.kv.length == P + n + 1 and a.rec.cur == n
        assert [s.data_ptr() for s in a.rec.ssm] == slots_before  # an index, no copy
        for i, (qkv, _z, b, g) in inputs.items():
            j = m.gdn_index[i]
            plain = m.new_cache(64)  # 1-row decode steps
            m.prefill(ids[:P], plain)
            for t in range(n + 1):
                _mixer(m, i, plain, qkv[t : t + 1], b[t : t + 1], g[t : t + 1])
            naive = m.new_cache(64, naive=True)  # snapshot/restore/replay
            m.prefill(ids[:P], naive)
            naive.reforward = lambda rows: _mixer(
                m, i, naive, qkv[: len(rows)], b[: len(rows)], g[: len(rows)]
            )
            naive.length = P
            naive.begin(ids[P:], recurrent=True)
            m.gdn(i, qkv, b, g, naive)
            naive.end()
            naive.crop(P + n + 1)
            for other in (plain, naive):
                assert torch.equal(a.rec.current(j), other.rec.current(j))
                assert torch.equal(a.rec.conv_state(j), other.rec.conv_state(j))
        # Whole model: verify rows are bit-for-bit 1-row steps (TargetModel.verify), so after the
        # rollback every layer's state, the KV bytes and the next step's logits equal plain
        # decoding's and the replay path's exactly.
        caches = {}
        for how in ("slots", "naive", "plain"):
            c = m.new_cache(64, naive=how == "naive")
            m.prefill(ids[:P], c)
            if how == "plain":
                for t in range(P, P + n + 1):
                    m.verify(ids[t : t + 1], c)
            else:
                m.verify(ids[P:], c)
                c.crop(P + n + 1)
            caches[how] = c
        ref = caches["plain"]
        for how in ("slots", "naive"):
            c = caches[how]
            for j in range(len(m.cfg.gdn_layers)):
                assert torch.equal(c.rec.current(j), ref.rec.current(j)), (how, n, j)
                assert torch.equal(c.rec.conv_state(j), ref.rec.conv_state(j)), (how, n, j)
            L = ref.kv.length
            assert torch.equal(c.kv.k[:, :, :L], ref.kv.k[:, :, :L]) and torch.equal(
                c.kv.v[:, :, :L], ref.kv.v[:, :, :L]
            )
        nxt = ids[P + n : P + n + 1]
        la, ln, lp = (m.verify(nxt, caches[h]).logits for h in ("slots", "naive", "plain"))
        assert torch.equal(la, lp) and torch.equal(ln, lp)


def test_rollback_outside_the_checkpoints_is_refused(loaded):
    m = loaded["qwen3_5"].model
    c = m.new_cache(64)
    m.prefill(torch.arange(20), c)  # chunked form: no per-row checkpoints
    with pytest.raises(ThorError, match="cannot roll the recurrent state back"):
        c.crop(10)


# ---- speculative decoding on a hybrid: token-identical to plain --------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "kv,chunk,naive", [("fp32", 0, False), ("fp8", 5, False), ("fp32", 7, True)]
)
def test_speculative_equals_plain(arch, kv, chunk, naive, loaded):
    L = loaded[arch]
    tok = L.tokenizer
    ids = tok.encode(
        "pick up the red cup and place it on the table. pick up the red cup and place it"
    )
    opts = {"naive": True} if naive else None
    rt = Runtime(L.model, tok, kv_dtype=kv, prefill_chunk=chunk, cache_options=opts)
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    want = Runtime(L.model, tok, kv_dtype=kv).generate(ids, params).token_ids
    runs = {
        "ngram": Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget()),
        "dflash": Speculation(
            DFlashProposer(
                random_drafter(L.cfg, num_layers=1, block_size=8, seed=3), L.model, window=16
            ),
            7,
        ),
        "steered": Speculation(Steered(ids + want, 4), 7),
    }
    for name, spec in runs.items():
        got = rt.generate(ids, params, speculation=spec)
        assert got.token_ids == want, name
    assert got.stats.cycles < len(want)  # the steered run accepted drafts


def test_combined_proposer_and_plan_grammar(loaded, tmp_path):
    """The combined proposer (DFlash + lookup; auto's choice) on a hybrid model, under the
    planner's own plan grammar."""
    from calib.datagen import PlanGreedy
    from calib.prompts import robot_requests
    from thor_runtime.speculative import dflash_io as io

    L = loaded["qwen3_5"]
    tok, model = L.tokenizer, L.model
    io.save_drafter(random_drafter(L.cfg, block_size=6, num_taps=2, seed=1), tmp_path)
    p, k = proposer_and_k(SpecOptions(method="combined", drafter=str(tmp_path)), model)
    req = robot_requests("heldout", 1, 0)[0]
    ids = tok.encode(
        "plan: pick up the red cup and place it on the table"
    )  # tiny context: a short prompt
    grammar = PlanGreedy(model, tok, 64, spec="none").constraint
    rt = Runtime(model, tok)
    params = SamplingParams(max_tokens=64)
    want = rt.generate(ids, params, constraint=grammar(req)).token_ids
    got = rt.generate(
        ids, params, speculation=Speculation(p, k, DraftBudget()), constraint=grammar(req)
    )
    assert got.token_ids == want and got.stats.cycles < len(
        want
    )  # forced grammar tokens ride along


# ---- loading and refusals ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arch,name",
    [
        ("qwen3_5", "model.layers.1.linear_attn.in_proj_a.weight"),
        ("qwen3_next", "model.layers.0.linear_attn.in_proj_qkvz.weight"),
    ],
)
def test_bad_gdn_tensor_is_refused(arch, name, dirs, tmp_path):
    missing = edited_copy(dirs[arch], tmp_path / "missing", lambda w: w.pop(name))
    with pytest.raises(ThorError, match=f"missing tensor {name}"):
        load(str(missing))
    bent = edited_copy(dirs[arch], tmp_path / "bent", lambda w: w.__setitem__(name, w[name][:-1]))
    with pytest.raises(ThorError, match=f"tensor {name} has shape"):
        load(str(bent))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(
        [sys.executable, "-m", "thor_app.cli", "generate", "hi", "--model", str(bent)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2 and name in r.stderr and "Traceback" not in r.stderr


def test_multimodal_text_part_loads(dirs, loaded, tmp_path):
    src = dirs["qwen3_5"]
    vl = tmp_path / "vl"
    vl.mkdir()
    for f in src.iterdir():
        if f.suffix not in (".safetensors", ".json") or f.name != "config.json":
            (vl / f.name).write_bytes(f.read_bytes())
    text = json.loads((src / "config.json").read_text())
    cfg = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {},
        "tie_word_embeddings": False,
    }
    (vl / "config.json").write_text(json.dumps(cfg))
    w = load_file(str(src / "model.safetensors"))
    w = {
        (k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
        for k, v in w.items()
    }
    w["model.visual.patch_embed.proj.weight"] = torch.zeros(2, 2)
    save_file(w, str(vl / "model.safetensors"))
    got = load(str(vl)).model.forward(torch.arange(9), load(str(vl)).model.new_cache(16)).logits
    want = (
        loaded["qwen3_5"]
        .model.forward(torch.arange(9), loaded["qwen3_5"].model.new_cache(16))
        .logits
    )
    assert torch.equal(got, want)


# ---- calibration: a drafter distils on a hybrid target ----------------------------------------
def test_distill_runs_on_hybrid(loaded, tmp_path):
    from calib.datagen import GenConfig, generate_dataset
    from calib.distill import DistillConfig, run_distill
    from calib.prompts import PromptSpec
    from thor_runtime.speculative.dflash_io import load_drafter

    L = loaded["qwen3_next"]
    data = tmp_path / "data"
    generate_dataset(
        L.model,
        L.tokenizer,
        PromptSpec("train", 3, 0, general_frac=1.0),
        GenConfig(12, 3),
        data,
        progress=False,
    )
    cfg = DistillConfig(
        out=str(tmp_path / "d"),
        data=str(data),
        block_size=4,
        blocks=2,
        batch=2,
        window=8,
        steps=4,
        warmup=1,
        lr=3e-3,
        ckpt_every=2,
        eval_n=0,
        taps="0,3",
    )
    assert run_distill(L, cfg, progress=False)["finished"]
    d = load_drafter(tmp_path / "d", L.cfg)
    out = Runtime(L.model, L.tokenizer).generate(
        L.tokenizer.encode("pick up"),
        SamplingParams(max_tokens=12),
        speculation=Speculation(DFlashProposer(d, L.model), 3),
    )
    plain = Runtime(L.model, L.tokenizer).generate(
        L.tokenizer.encode("pick up"), SamplingParams(max_tokens=12)
    )
    assert out.token_ids == plain.token_ids
