"""FP8 GEMMs through explicit Q/DQ (engines/qdq.py, calib/act_scales.py): the pass, the
calibration, the ONNX Runtime twin against fp32 and against a torch simulation, the refusals;
and TensorRT's optimization profiles as the commands derive them."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")

from calib.act_scales import ProbeBackend, act_amax  # noqa: E402
from engines.backend import (
    PREFILL_PROFILE,
    BackendOptions,
    default_cache_dir,
    make_backend,  # noqa: E402
    profile_tokens,
    spec_width,
)
from engines.qdq import QDQ_OPSET, SKIP, Fp8Scales, export_all, insert_qdq, projection_shapes  # noqa: E402
from engines.segments import DenseView, example_inputs, export_graph, graph_plan  # noqa: E402
from engines.selftest import THRESHOLDS, check_segments  # noqa: E402
from tests.helpers.tiny import CORPUS  # noqa: E402
from thor_app.cli import build_parser, main  # noqa: E402
from thor_runtime.errors import ThorError  # noqa: E402

# The self-test's fp8 bounds: cosine >= 0.99, norm ratio in [0.95, 1.05], max abs <= 0.1 + 0.1
# max|ref|.
FP8 = THRESHOLDS["fp8"]


@pytest.fixture(scope="module")
def calibrated(tiny_llama):
    """Scales from the tiny model's own text (the first corpus lines as prompts)."""
    tok = tiny_llama.tokenizer
    amax, shapes = act_amax(tiny_llama.model, [tok.encode(t) for t in CORPUS[:5]])
    return Fp8Scales.from_amax(amax, shapes, meta={"model": "tiny-llama"})


@pytest.fixture(scope="module")
def scales_file(calibrated, tmp_path_factory):
    p = tmp_path_factory.mktemp("fp8") / "fp8_scales.json"
    calibrated.save(p)
    return p


# ---- calibration ----------------------------------------------------------------------------
def test_calibration_records_the_input_of_each_projection(tiny_llama, calibrated):
    from thor_runtime.cache.kv_cache import KVCache
    from thor_runtime.models.dense import rms_norm

    m, cfg = tiny_llama.model, tiny_llama.cfg
    L = cfg.num_layers
    assert set(calibrated.scales) == {
        f"layers.{i}.{w}" for i in range(L) for w in ("wqkv", "wo", "w_gate_up", "w_down")
    } | {"head_w"}
    assert calibrated.shapes["layers.0.wqkv"] == (
        (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim,
        cfg.hidden_size,
    )
    # Recomputed from the reference forward: wqkv of layer 0 multiplies the normed embedding,
    # the head multiplies the normed last hidden state.
    want0 = want_head = 0.0
    for text in CORPUS[:5]:
        ids = torch.tensor(tiny_llama.tokenizer.encode(text))
        out = m.forward(ids, KVCache(cfg, len(ids), "fp32", m.dtype), taps=(L - 1,))
        want0 = max(
            want0, float(rms_norm(m.embed(ids), m.layers[0].attn_norm, cfg.rms_eps).abs().max())
        )
        want_head = max(
            want_head, float(rms_norm(out.taps[L - 1], m.final_norm, cfg.rms_eps).abs().max())
        )
    assert calibrated.amax["layers.0.wqkv"] == pytest.approx(want0, rel=1e-5)
    assert calibrated.amax["head_w"] == pytest.approx(want_head, rel=1e-5)
    assert calibrated.scales["head_w"] == pytest.approx(want_head / 448, rel=1e-5)


def test_thor_calib_fp8_scales_writes_a_file_the_backends_take(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "fp8.json"
    argv = [
        "calib",
        "fp8-scales",
        "--target",
        str(tiny_dirs["llama"]),
        "--n",
        "2",
        "--eval-n",
        "1",
        "--quiet",
    ]
    assert main(argv + ["--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    scales = Fp8Scales.load(out)
    assert (
        doc["projections"] == len(scales.scales) == 13 and scales.meta["calibration_prompts"] == 2
    )
    rep = doc["report"]
    assert rep["prompts"] == 1 and rep["skipped"] == ["head_w"] and 0 < rep["top1_agreement"] <= 1
    assert rep["mean_logits_cosine"] > 0.9
    assert json.loads((tmp_path / "fp8.report.json").read_text()) == {
        k: v for k, v in doc.items() if k != "report_file"
    }
    assert main(argv + ["--out", str(tmp_path)]) == 2  # a directory is not a file


def test_scales_file_round_trips_and_bad_files_are_refused(calibrated, scales_file, tmp_path):
    back = Fp8Scales.load(scales_file)
    assert (
        back.scales == calibrated.scales
        and back.shapes == calibrated.shapes
        and back.sha256 == calibrated.sha256
    )
    assert calibrated.times(2).sha256 != calibrated.sha256
    doc = json.loads(scales_file.read_text())
    cases = [
        ({**doc, "format": "x"}, "expected format"),
        ({**doc, "projections": {"head_w": {"shape": [2, 2], "scale": -1.0}}}, "finite positive"),
        ({**doc, "projections": {"head_w": {"scale": 1.0}}}, "'shape'"),
    ]
    for bad, words in cases:
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(ThorError, match=words):
            Fp8Scales.load(p)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ThorError, match="not valid JSON"):
        Fp8Scales.load(tmp_path / "bad.json")


# ---- the pass -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "segment, layer, gemms",
    [("pre_attn", 0, 1), ("post_attn", 1, 3), ("post_pre", 0, 4), ("head", None, 0)],
)
def test_every_projection_gets_fp8_qdq_on_both_operands(
    tiny_llama, calibrated, segment, layer, gemms
):
    import onnx
    from onnx import TensorProto

    view = DenseView(tiny_llama.model)
    model = export_graph(view, segment, layer)
    assert insert_qdq(model, calibrated.scales) == gemms
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [QDQ_OPSET]
    made = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    quantized = 0
    for mm in (n for n in model.graph.node if n.op_type == "MatMul"):
        x, w = (made[i] for i in mm.input)
        if x.op_type != "DequantizeLinear":  # the head (SKIP) stays in the graph's precision
            assert "head" in segment and SKIP == ("head_w",)
            continue
        quantized += 1
        assert w.op_type == "DequantizeLinear" and [
            a.i for a in w.attribute if a.name == "axis"
        ] == [1]
        for dq, per_channel in ((x, False), (w, True)):
            q = made[dq.input[0]]
            assert q.op_type == "QuantizeLinear" and q.input[1:] == dq.input[1:]
            scale, zero = inits[dq.input[1]], inits[dq.input[2]]
            assert (
                zero.data_type == TensorProto.FLOAT8E4M3FN and scale.data_type == TensorProto.FLOAT
            )
            assert (len(scale.dims) == 1) == per_channel
        weight = made[made[w.input[0]].input[0]]  # Q <- Transpose <- the weight initializer
        assert weight.op_type == "Transpose" and weight.input[0] in calibrated.scales
    assert quantized == gemms


def test_a_projection_without_a_scale_is_refused(tiny_llama, calibrated):
    view = DenseView(tiny_llama.model)
    scales = {k: v for k, v in calibrated.scales.items() if k != "layers.1.wo"}
    with pytest.raises(ThorError, match="layers.1.wo"):
        insert_qdq(export_graph(view, "post_attn", 1), scales)


# ---- the onnxruntime twin -------------------------------------------------------------------
def test_twin_matches_the_torch_simulation_and_fp32_within_fp8_bounds(
    tiny_llama, scales_file, calibrated, tmp_path
):
    m = tiny_llama.model
    b = make_backend(
        "onnxruntime", m, BackendOptions(cache_dir=str(tmp_path), fp8_scales=str(scales_file))
    )
    fields = b.entry.manifest["fields"]
    assert fields["precision"] == "fp8" and fields["fp8_qdq"]["scales_sha256"] == calibrated.sha256
    assert sum(g["fp8_gemms"] for g in b.entry.graphs) == 4 * tiny_llama.cfg.num_layers
    plain = make_backend("onnxruntime", m, BackendOptions(cache_dir=str(tmp_path)))
    assert plain.entry.key != b.entry.key
    # Same arithmetic as the torch simulation of Q/DQ (e4m3 rounding of both operands) ...
    sim = ProbeBackend(m, calibrated)
    for n, (segment, layer) in enumerate(b.plan):
        xs = example_inputs(m, segment, layer, T=5, start=7, seed=n)
        for got, want in zip(b.run(segment, layer, *xs), sim.run(segment, layer, *xs)):
            assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max()), (
                segment,
                layer,
            )
    # ... and close to the fp32 graphs: the self-test's fp8 bounds on every segment.
    checks = check_segments(m, b, FP8)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    worst = min(c.figures["cosine"] for c in checks)
    assert 0.99 <= worst < 0.99999  # quantized, but close
    assert all(0.95 <= c.figures["norm_ratio"] <= 1.05 for c in checks)


def test_wrong_scales_fail_the_segment_check(tiny_llama, calibrated, tmp_path):
    """Too small a scale saturates at ±448·s (the norm collapses); a scale far too large
    rounds everything to zero. x100 too large still passes: e4m3's subnormals reach 2^-9, so a
    100x smaller range only costs precision."""
    m = tiny_llama.model
    for k, fails in ((0.01, True), (1e6, True), (100.0, False)):
        p = tmp_path / f"x{k}.json"
        calibrated.times(k).save(p)
        b = make_backend(
            "onnxruntime", m, BackendOptions(cache_dir=str(tmp_path), fp8_scales=str(p))
        )
        bad = [c for c in check_segments(m, b, FP8) if not c.passed]
        if not fails:
            assert not bad, bad
            continue
        assert any(c.name == "segment pre_attn.0" and "norm_ratio" in c.failed for c in bad), bad
        assert all(c.name.startswith("segment ") and "head" not in c.name for c in bad)


def test_selftest_cli_on_the_twin_passes_and_fails_on_a_wrong_file(
    tiny_dirs, scales_file, calibrated, tmp_path, capsys
):
    base = [
        "selftest",
        "--model",
        str(tiny_dirs["llama"]),
        "--backend",
        "onnxruntime",
        "--quick",
        "--no-plan",
        "--json",
        "--engine-cache",
        str(tmp_path),
    ]
    assert main(base + ["--fp8-scales", str(scales_file)]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["passed"] and rep["precision"] == "fp8"
    assert rep["checks"][0]["thresholds"]["cosine_min"] == 0.99
    wrong = tmp_path / "wrong.json"
    calibrated.times(0.01).save(wrong)
    assert main(base + ["--fp8-scales", str(wrong)]) == 1
    rep = json.loads(capsys.readouterr().out)
    failed = [c for c in rep["checks"] if not c["passed"]]
    assert any(c["name"] == "segment pre_attn.0" and "norm_ratio" in c["failed"] for c in failed)


# ---- refusals -------------------------------------------------------------------------------
def test_fp8_without_scales_is_refused_before_tensorrt_is_imported(tiny_dirs, monkeypatch, capsys):
    import engines.tensorrt as trt_mod

    def imported():
        raise AssertionError("TensorRT was imported")

    monkeypatch.setattr(trt_mod, "import_trt", imported)
    with pytest.raises(ThorError, match="--fp8-scales FILE"):
        BackendOptions(precision="fp8")
    with pytest.raises(ThorError, match="drop one"):
        BackendOptions(precision="bf16", fp8_scales="s.json")
    rc = main(
        [
            "engines",
            "build",
            "--backend",
            "tensorrt",
            "--trt-precision",
            "fp8",
            "--model",
            str(tiny_dirs["llama"]),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--fp8-scales FILE" in err and "TensorRT was imported" not in err


def test_scales_of_another_model_are_refused_by_both_backends(
    tiny_qwen3, scales_file, tmp_path, monkeypatch
):
    import engines.tensorrt as trt_mod

    monkeypatch.setattr(trt_mod, "import_trt", lambda: pytest.fail("TensorRT was imported"))
    opts = BackendOptions(cache_dir=str(tmp_path), fp8_scales=str(scales_file))
    for name in ("onnxruntime", "tensorrt"):
        with pytest.raises(ThorError, match="calibrated for another model"):
            make_backend(name, tiny_qwen3.model, opts)
    assert not any(tmp_path.iterdir())


def test_export_all_writes_qdq_graphs_onnxruntime_loads(tiny_llama, calibrated, tmp_path):
    import onnx

    view = DenseView(tiny_llama.model)
    plan = graph_plan(tiny_llama.cfg, "fused")
    assert set(projection_shapes(view, plan)) == set(calibrated.scales)
    graphs = export_all(view, plan, tmp_path, calibrated)
    assert [g["fp8_gemms"] for g in graphs] == [0, 1, 4, 4, 3, 0]
    loaded = onnx.load(str(tmp_path / graphs[2]["onnx"]))
    assert sum(n.op_type == "QuantizeLinear" for n in loaded.graph.node) == 8


# ---- TensorRT optimization profiles ---------------------------------------------------------
def test_profile_tokens_follow_k_and_the_prefill_chunk():
    from engines.tensorrt import profile_ranges

    assert profile_tokens(0, 0) == (1, 1, PREFILL_PROFILE)  # plain decoding, one-pass prefill
    assert profile_tokens(15, 0) == (1, 16, PREFILL_PROFILE)
    assert profile_tokens(4, 64) == (1, 5, 64)
    assert profile_tokens(8, 4) == (1, 9, 9)  # a chunk narrower than a verify
    assert profile_ranges(profile_tokens(4, 64)) == [(1, 1, 1), (2, 5, 5), (6, 64, 64)]
    assert profile_ranges(profile_tokens(0, 0)) == [
        (1, 1, 1),
        (2, PREFILL_PROFILE, PREFILL_PROFILE),
    ]
    with pytest.raises(ThorError):
        profile_tokens(-1, 0)


def test_commands_derive_profiles_from_their_runtime(tiny_llama):
    from thor_app.assembly import backend_options
    from thor_app.assembly import build_speculation as assembled_speculation
    from thor_app.flags import config_from_args
    from thor_app.server.config import ServeConfig
    from thor_runtime.speculative import PLAIN, SpecOptions, Speculation, build_speculation

    def runtime_profiles(config):
        return backend_options(
            config, spec_width(assembled_speculation(config, tiny_llama))
        ).profiles

    def profiles(argv):
        return runtime_profiles(config_from_args(build_parser().parse_args(argv)))

    tiny = ["--model", "x", "--backend", "tensorrt"]
    assert profiles(
        ["engines", "build", *tiny, "--spec", "ngram", "--ngram-k", "6", "--prefill-chunk", "64"]
    ) == (1, 7, 64)
    assert profiles(["generate", "hi", *tiny, "--prefill-chunk", "32"]) == (1, 1, 32)  # --spec none
    assert profiles(["selftest", *tiny, "--spec", "ngram", "--ngram-k", "3"]) == (
        1,
        4,
        PREFILL_PROFILE,
    )
    # `thor engines build` with no flags builds what `thor serve` with the default config loads.
    served = ServeConfig().runtime
    assert (
        profiles(["engines", "build", *tiny])
        == runtime_profiles(served)
        == profile_tokens(
            spec_width(assembled_speculation(served, tiny_llama)), served.model.prefill_chunk
        )
    )
    assert spec_width(PLAIN) == 0
    lookup = build_speculation(SpecOptions("ngram", ngram_k=5), tiny_llama.model)
    assert spec_width(Speculation(lookup.proposer, 2, free_text=lookup)) == 5


def test_default_cache_dir_honours_thor_engine_cache_then_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("THOR_ENGINE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "thor" / "engines"
    monkeypatch.setenv("THOR_ENGINE_CACHE", str(tmp_path / "e"))
    assert default_cache_dir() == tmp_path / "e"
