"""engines/: ONNX export parity, the onnxruntime backend end to end, the engine cache's
refusals, the self-test (and that it catches a scale bug cosine would miss)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")

from engines.backend import BACKENDS, BackendOptions, TorchBackend, make_backend, using  # noqa: E402
from engines.selftest import THRESHOLDS, check_segments, run_selftest  # noqa: E402
from tests.helpers.paths import ROOT  # noqa: E402
from thor_app.cli import main  # noqa: E402
from thor_runtime.engine.generate import Runtime  # noqa: E402
from thor_runtime.engine.sampling import SamplingParams  # noqa: E402
from thor_runtime.speculative import SpecOptions, build_speculation  # noqa: E402


def _greedy(model, tok, ids, n, spec=None):
    from thor_runtime.speculative import PLAIN

    return (
        Runtime(model, tok)
        .generate(ids, SamplingParams(max_tokens=n, ignore_eos=True), spec or PLAIN)
        .token_ids
    )


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="session")
def default_ort(default_model, engine_dir):
    return make_backend(
        "onnxruntime", default_model.model, BackendOptions(cache_dir=str(engine_dir))
    )


TINY = [(a, f) for a in ("llama", "qwen2", "qwen3") for f in ("segments", "fused")]
HYBRIDS = ("qwen3_5", "qwen3_next")


@pytest.mark.parametrize("arch,form", TINY + [(a, "segments") for a in HYBRIDS])
def test_tiny_graphs_match_torch_and_generate_identically(arch, form, tiny_dirs, tmp_path, request):
    loaded = request.getfixturevalue(f"tiny_{arch}")
    m, tok = loaded.model, loaded.tokenizer
    b = make_backend("onnxruntime", m, BackendOptions(form=form, cache_dir=str(tmp_path)))
    cfg, n = loaded.cfg, loaded.cfg.num_layers
    gdn = len(
        getattr(cfg, "gdn_layers", ())
    )  # a GDN layer has three graphs: pre_gdn, post_gdn, post_attn
    assert len(b.plan) == (2 + 2 * n + gdn if form == "segments" else 3 + n)
    if arch == "qwen2":  # the q/k/v biases are weights of the graph that opens layer 0
        import onnx

        g = next(g for g in b.entry.graphs if g["layer"] == 0 and g["segment"] == "pre_attn")
        assert "layers.0.bqkv" in {
            t.name for t in onnx.load_from_string(b.entry.read(g["onnx"])).graph.initializer
        }
    checks = check_segments(m, b, THRESHOLDS["fp32"])
    assert len(checks) == len(b.plan) and all(c.passed for c in checks), [
        c for c in checks if not c.passed
    ]
    ids = tok.encode("pick up the red cup")
    ref = _greedy(m, tok, ids, 12)
    with using(m, b):
        got = _greedy(m, tok, ids, 12)
        spec = _greedy(
            m,
            tok,
            ids,
            12,
            build_speculation(SpecOptions(method="ngram", ngram_k=4, fixed_k=True), m),
        )
        # positions are a graph input: a later chunk (start > 0) must see its own positions
        cache = Runtime(m, tok).new_cache(40)
        chunked = m.prefill(torch.tensor(ids * 3), cache, chunk=4).logits
    assert got == ref and spec == got
    whole = m.prefill(torch.tensor(ids * 3), Runtime(m, tok).new_cache(40)).logits
    assert torch.allclose(chunked, whole, atol=1e-4)


@pytest.mark.parametrize("arch", HYBRIDS)
def test_hybrid_export_keeps_the_mixers_eager_and_refuses_what_it_cannot_cover(
    arch, request, tmp_path
):
    """The GDN conv + delta rule and attention stay in torch (no graph holds their state); no
    fused form for hybrids; a mixture-of-experts layer's graph stops at the MoE block's input
    (``pre_moe``), the block stays in torch too."""
    import dataclasses

    from engines.segments import graph_plan
    from thor_runtime.errors import ThorError

    loaded = request.getfixturevalue(f"tiny_{arch}")
    cfg = loaded.cfg
    plan = graph_plan(cfg, "segments")
    assert {s for s, _ in plan} == {
        "embed",
        "pre_gdn",
        "post_gdn",
        "pre_gattn",
        "post_attn",
        "head",
    }
    assert [i for s, i in plan if s == "pre_gdn"] == list(cfg.gdn_layers)
    assert [i for s, i in plan if s == "pre_gattn"] == list(cfg.attn_layers)
    with pytest.raises(ThorError, match="fused form is not available"):
        make_backend(
            "onnxruntime", loaded.model, BackendOptions(form="fused", cache_dir=str(tmp_path))
        )
    assert not any(tmp_path.iterdir())  # refused before anything was built
    moe = dataclasses.replace(
        cfg,
        moe_layers=(1,),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    )
    moe_plan = graph_plan(moe, "segments")
    assert ("pre_moe", 1) in moe_plan and ("post_attn", 1) not in moe_plan
    assert [p for p in moe_plan if p[1] != 1] == [p for p in plan if p[1] != 1]
    with pytest.raises(ThorError, match="fused form is not available"):
        graph_plan(moe, "fused")


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_verify_on_onnxruntime_is_bitwise_one_row_steps(tiny_llama, tmp_path, kv):
    """The exactness of ``verify`` holds on a backend too: its kernels are probed at attach and
    run row by row (RowWise) unless they are row-invariant; either way the verify's logits and
    stored K/V equal 1-row steps bit for bit, so speculation stays exact on ONNX Runtime."""
    from tests.helpers.exactness import PROMPT, assert_same, steps_vs_verify
    from thor_runtime.models.dense import RowWise

    m = tiny_llama.model
    b = make_backend("onnxruntime", m, BackendOptions(cache_dir=str(tmp_path)))
    with using(m, b):
        assert m.backend is b and m.backend_exact in (b,) or isinstance(m.backend_exact, RowWise)
        ids = torch.tensor(tiny_llama.tokenizer.encode(PROMPT))[:26]
        assert_same(*steps_vs_verify(m, ids, 9, kv))
    assert m.backend is None and m.backend_exact is None


class _RowCountBackend(TorchBackend):
    """Right for one row, off for several: a backend whose kernels depend on the row count
    (exaggerated, so any verify row that is not computed alone shows)."""

    name = "rowcount"

    def run(self, segment, layer, *xs):
        out = super().run(segment, layer, *xs)
        return out if segment == "embed" or xs[0].shape[0] == 1 else tuple(o + 1e-3 for o in out)


@pytest.mark.parametrize("arch", HYBRIDS)
@pytest.mark.parametrize("which", ["onnxruntime", "rowcount"])
def test_hybrid_verify_on_a_backend_is_bitwise_one_row_steps(arch, which, request, tmp_path):
    """A hybrid's verify on a backend: each of its 16 rows gets a 1-row step's logits, K/V and
    recurrent state bit for bit (the kernels probed at attach, else run row by row)."""
    from engines.backend import RowWiseGraphs

    loaded = request.getfixturevalue(f"tiny_{arch}")
    m, tok = loaded.model, loaded.tokenizer
    b = (
        make_backend("onnxruntime", m, BackendOptions(cache_dir=str(tmp_path)))
        if which == "onnxruntime"
        else _RowCountBackend(m)
    )
    ids = torch.tensor(
        tok.encode(
            "The robot picks up the red mug and places it in the dish rack, then it goes back"
        )
    )
    assert len(ids) >= 25
    runs = []
    with using(m, b):
        assert m.backend is b and (
            m.backend_exact is b or isinstance(m.backend_exact, RowWiseGraphs)
        )
        if which == "rowcount":
            assert isinstance(m.backend_exact, RowWiseGraphs)
        for one_row in (True, False):
            cache = m.new_cache(32)
            m.prefill(ids[:9], cache)
            if one_row:
                logits = torch.cat([m.verify(ids[j : j + 1], cache).logits for j in range(9, 25)])
            else:
                logits = m.verify(ids[9:25], cache).logits  # [16, V]
            state = [cache.kv.view(j) for j in range(len(m.cfg.attn_layers))]
            state += [cache.rec.current(j) for j in range(len(m.cfg.gdn_layers))]
            runs.append((logits, state))
    assert m.backend is None and m.backend_exact is None
    (la, sa), (lb, sb) = runs
    assert torch.equal(la, lb)
    for x, y in zip(sa, sb):
        assert (
            all(torch.equal(p, q) for p, q in zip(x, y))
            if isinstance(x, tuple)
            else torch.equal(x, y)
        )


def test_rowwise_backend_is_the_backend_row_by_row(tiny_llama):
    """RowWise over the torch segments: the same values as one batched call (to rounding), in the
    same layout, and each row exactly the backend's 1-row call."""
    from thor_runtime.models.dense import RowWise

    m, cfg = tiny_llama.model, tiny_llama.cfg
    g = torch.Generator().manual_seed(3)
    h, o = (
        torch.randn(5, cfg.hidden_size, generator=g),
        torch.randn(5, cfg.num_heads * cfg.head_dim, generator=g),
    )
    pos = torch.arange(7, 12)
    rw = RowWise(m)
    for got, want in zip(rw.post_pre(0, h, o, pos), m.post_pre(0, h, o, pos)):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    q1 = m.pre_attn(0, h[3:4], pos[3:4])[0]
    assert torch.equal(rw.pre_attn(0, h, pos)[0][:, 3:4], q1)


def test_default_model_segments_match_torch(default_model, default_ort):
    checks = check_segments(default_model.model, default_ort, THRESHOLDS["fp32"])
    assert len(checks) == 2 + 2 * default_model.cfg.num_layers
    assert all(c.passed for c in checks), [c.name for c in checks if not c.passed]


def test_default_model_greedy_and_speculative_on_onnxruntime(default_model, default_ort):
    m, tok = default_model.model, default_model.tokenizer
    ids = tok.encode_chat(
        [{"role": "user", "content": "Move the blue box to shelf A3 and report back."}]
    )
    ref = _greedy(m, tok, ids, 16)
    with using(m, default_ort):
        plain = _greedy(m, tok, ids, 16)
        spec = _greedy(
            m,
            tok,
            ids,
            16,
            build_speculation(SpecOptions(method="ngram", ngram_k=4, fixed_k=True), m),
        )
    assert plain == ref  # fp32: identical to torch
    assert spec == plain  # speculative on onnxruntime == plain on onnxruntime


def test_selftest_cli_onnxruntime_passes(default_ort, engine_dir, capsys):
    # default_ort built the entry: the command loads it from the cache (hashes checked)
    rc = main(
        [
            "selftest",
            "--backend",
            "onnxruntime",
            "--quick",
            "--json",
            "--engine-cache",
            str(engine_dir),
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["passed"], [c for c in rep["checks"] if not c["passed"]]
    names = [c["name"] for c in rep["checks"]]
    assert any(n.startswith("constrained plan") for n in names)
    assert {"device", "versions", "checks"} <= set(rep) and "onnxruntime" in rep["versions"]


class _ScaledBackend(TorchBackend):
    """A broken backend: right direction, 1% too large on one graph."""

    name = "broken"
    target = ("post_attn", 1)

    def run(self, segment, layer, *xs):
        out = super().run(segment, layer, *xs)
        return tuple(o * 1.01 for o in out) if (segment, layer) == self.target else out


def test_selftest_names_a_scaled_segment_by_its_norm_ratio(tiny_dirs, monkeypatch, capsys):
    # the flag takes the configured backend names: a broken one stands in under one of them
    monkeypatch.setitem(
        BACKENDS, "onnxruntime", lambda model, opts, progress: _ScaledBackend(model)
    )
    rc = main(
        [
            "selftest",
            "--backend",
            "onnxruntime",
            "--model",
            str(tiny_dirs["llama"]),
            "--no-plan",
            "--json",
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1 and not rep["passed"]
    bad = [c for c in rep["checks"] if c["name"].startswith("segment") and not c["passed"]]
    assert [c["name"] for c in bad] == ["segment post_attn.1"]
    assert (
        "norm_ratio" in bad[0]["failed"] and "cosine" not in bad[0]["failed"]
    )  # cosine alone would pass
    assert bad[0]["figures"]["norm_ratio"] == pytest.approx(1.01, abs=1e-4)


@pytest.mark.parametrize("arch", HYBRIDS)
def test_selftest_cli_onnxruntime_passes_on_a_hybrid(arch, tiny_hybrid_dirs, tmp_path, capsys):
    rc = main(
        [
            "selftest",
            "--backend",
            "onnxruntime",
            "--model",
            str(tiny_hybrid_dirs[arch]),
            "--json",
            "--engine-cache",
            str(tmp_path),
        ]
    )
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["passed"], [c for c in rep["checks"] if not c["passed"]]
    by = {c["name"]: c for c in rep["checks"]}
    segs = {n.split()[1].split(".")[0] for n in by if n.startswith("segment ")}
    assert segs == {"embed", "pre_gdn", "post_gdn", "pre_gattn", "post_attn", "head"}
    state = by["KV cache and recurrent state after prefill"]
    assert state["passed"] and state["applicable"] and state["figures"]["cosine"] > 0.9999
    # the tiny model's 1024-token context cannot hold the planner's prompt: said, not failed
    plan = by["constrained plan on the kitchen world"]
    assert not plan["applicable"] and plan["detail"].startswith("not applicable")
    assert (
        plan["figures"]["prompt_tokens"] + plan["figures"]["plan_budget"]
        > plan["figures"]["context"]
    )
    assert all(c["applicable"] for c in rep["checks"] if c is not plan)


class _VerifyFlipBackend(TorchBackend):
    """Multi-row head calls (a verify) give each row's runner-up token a 0.01-logit lead: a
    backend whose verify is not row-exact, with a probe that missed it."""

    name = "flip"

    def run(self, segment, layer, *xs):
        out = super().run(segment, layer, *xs)
        if segment != "head" or xs[0].shape[0] == 1:
            return out
        top = out[0].topk(2, dim=-1)  # [R, 2]
        return (out[0].scatter(1, top.indices[:, 1:], top.values[:, :1] + 0.01),)


def test_speculative_vs_plain_must_be_identical_at_every_precision(tiny_llama, monkeypatch):
    """Greedy tokens vs torch may differ by a judged tie outside fp32 (strict=False), but plain
    vs speculative decoding on one backend must be identical at every precision: a verify is
    exact by construction on every backend, so any divergence there is a bug."""
    import thor_runtime.models.dense as tm
    from engines.selftest import check_generation
    from thor_runtime.speculative import lossless

    m, tok = tiny_llama.model, tiny_llama.tokenizer
    prompt = tok.encode("pick up the red cup and place it on the table. pick up the red cup")
    vs_torch, spec = check_generation(m, tok, _RowCountBackend(m), prompt, 12, strict=False)
    assert (
        spec.passed
        and spec.figures["status"] == "identical"
        and spec.thresholds == {"identical": True}
    )
    assert "tie_tol_logits" in vs_torch.thresholds  # that one keeps the precision's rule
    monkeypatch.setattr(tm, "backend_for_verify", lambda model, backend: backend)
    monkeypatch.setattr(
        lossless, "DEFAULT_TIE_TOL", 100.0
    )  # the gate forgives any divergence as a tie
    _, spec = check_generation(m, tok, _VerifyFlipBackend(m), prompt, 12, strict=False)
    assert spec.figures["status"] == "tie" and spec.figures["first_divergence"] >= 1
    assert not spec.passed and spec.failed == ("tokens",)


def test_library_selftest_torch_reference_passes(tiny_llama):
    rep = run_selftest(tiny_llama, "torch", quick=True)
    assert rep.passed and "PASS" in rep.summary() and rep.to_dict()["backend"] == "torch"


def _build(model_dir, cache) -> int:
    return main(
        [
            "engines",
            "build",
            "--backend",
            "onnxruntime",
            "--model",
            str(model_dir),
            "--engine-cache",
            str(cache),
        ]
    )


def test_tampered_engine_file_is_refused_with_exit_2(tiny_dirs, tmp_path, capsys):
    assert _build(tiny_dirs["qwen3"], tmp_path) == 0
    entry = next(p for p in tmp_path.iterdir() if (p / "manifest.json").is_file())
    victim = entry / "post_attn.0.onnx.data"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    capsys.readouterr()
    rc = main(
        [
            "generate",
            "hi",
            "--model",
            str(tiny_dirs["qwen3"]),
            "--backend",
            "onnxruntime",
            "--engine-cache",
            str(tmp_path),
            "--max-tokens",
            "2",
        ]
    )
    err = capsys.readouterr().err
    assert (
        rc == 2
        and "post_attn.0.onnx.data does not match its manifest hash" in err
        and "Traceback" not in err
    )
    assert main(["engines", "verify", "--engine-cache", str(tmp_path)]) == 2
    assert "sha256 mismatch" in capsys.readouterr().out
    assert main(["engines", "prune", "--engine-cache", str(tmp_path)]) == 0
    assert not entry.exists()


KILL_MIDWAY = """
import os, signal, sys
from thor_runtime.loading import load
from engines.backend import BackendOptions, make_backend
loaded = load(sys.argv[1], layout="dense")
def progress(label, done, total):
    if done == 3:
        os.kill(os.getpid(), signal.SIGKILL)
make_backend("onnxruntime", loaded.model, BackendOptions(cache_dir=sys.argv[2]), progress)
"""


def test_build_killed_midway_leaves_nothing_usable(tiny_dirs, tmp_path, capsys):
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run(
        [sys.executable, "-c", KILL_MIDWAY, str(tiny_dirs["llama"]), str(tmp_path)],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    assert main(["engines", "list", "--json", "--engine-cache", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)["entries"]
    assert rows and all(
        r["status"] == "partial" for r in rows
    )  # something was on disk, none usable
    assert main(["engines", "prune", "--engine-cache", str(tmp_path)]) == 0
    assert not any(tmp_path.iterdir())


def test_tensorrt_profiles_and_missing_tensorrt(tiny_dirs, capsys):
    from engines.tensorrt import profile_ranges

    assert profile_ranges((1, 9, 256)) == [(1, 1, 1), (2, 9, 9), (10, 256, 256)]
    assert profile_ranges((1, 1, 1)) == [(1, 1, 1)]
    try:
        import tensorrt  # noqa: F401

        if torch.cuda.is_available():
            pytest.skip(
                "TensorRT and a GPU are present: the missing-TensorRT error cannot be shown here"
            )
    except ImportError:
        pass
    rc = main(
        [
            "generate",
            "hi",
            "--model",
            str(tiny_dirs["llama"]),
            "--backend",
            "tensorrt",
            "--max-tokens",
            "2",
        ]
    )
    assert rc == 2 and "tensorrt backend needs" in capsys.readouterr().err


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU and TensorRT 10 (neither exists here)"
)
def test_tensorrt_selftest_on_device(tiny_llama, tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT 10 is not installed")
    from thor_runtime.loading import load

    loaded = load(str(Path(tiny_llama.source)), "fp32", device="cuda", layout="dense")
    rep = run_selftest(
        loaded, "tensorrt", quick=True, options=BackendOptions(cache_dir=str(tmp_path))
    )
    assert rep.passed, rep.summary()
