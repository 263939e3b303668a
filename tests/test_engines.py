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
from thor_app.cli import main  # noqa: E402
from thor_runtime.generate import Runtime  # noqa: E402
from thor_runtime.sampling import SamplingParams  # noqa: E402
from thor_runtime.speculative import SpecOptions, build_speculation  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _greedy(model, tok, ids, n, spec=None):
    from thor_runtime.speculative import PLAIN

    return Runtime(model, tok).generate(ids, SamplingParams(max_tokens=n, ignore_eos=True), spec or PLAIN).token_ids


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="session")
def default_ort(default_model, engine_dir):
    return make_backend("onnxruntime", default_model.model, BackendOptions(cache_dir=str(engine_dir)))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("form", ["segments", "fused"])
def test_tiny_graphs_match_torch_and_generate_identically(arch, form, tiny_dirs, tmp_path, request):
    loaded = request.getfixturevalue(f"tiny_{arch}")
    b = make_backend("onnxruntime", loaded.model, BackendOptions(form=form, cache_dir=str(tmp_path)))
    n = loaded.cfg.num_layers
    assert len(b.plan) == (2 + 2 * n if form == "segments" else 3 + n)
    checks = check_segments(loaded.model, b, THRESHOLDS["fp32"])
    assert checks and all(c.passed for c in checks), [c for c in checks if not c.passed]
    ids = loaded.tokenizer.encode("pick up the red cup")
    ref = _greedy(loaded.model, loaded.tokenizer, ids, 12)
    with using(loaded.model, b):
        got = _greedy(loaded.model, loaded.tokenizer, ids, 12)
        # positions are a graph input: a later chunk (start > 0) must see its own positions
        cache = Runtime(loaded.model, loaded.tokenizer).new_cache(40)
        loaded.model.prefill(torch.tensor(ids * 3), cache, chunk=4)
    assert got == ref


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_verify_on_onnxruntime_is_bitwise_one_row_steps(tiny_llama, tmp_path, kv):
    """The exactness of ``verify`` holds on a backend too: its kernels are probed at attach and
    run row by row (RowWise) unless they are row-invariant; either way the verify's logits and
    stored K/V equal 1-row steps bit for bit, so speculation stays exact on ONNX Runtime."""
    from test_exact import PROMPT, _assert_same, _steps_vs_verify

    from thor_runtime.model import RowWise

    m = tiny_llama.model
    b = make_backend("onnxruntime", m, BackendOptions(cache_dir=str(tmp_path)))
    with using(m, b):
        assert m.backend is b and m.backend_exact in (b,) or isinstance(m.backend_exact, RowWise)
        ids = torch.tensor(tiny_llama.tokenizer.encode(PROMPT))[:26]
        _assert_same(*_steps_vs_verify(m, ids, 9, kv))
    assert m.backend is None and m.backend_exact is None


def test_rowwise_backend_is_the_backend_row_by_row(tiny_llama):
    """RowWise over the torch segments: the same values as one batched call (to rounding), in the
    same layout, and each row exactly the backend's 1-row call."""
    from thor_runtime.model import RowWise

    m, cfg = tiny_llama.model, tiny_llama.cfg
    g = torch.Generator().manual_seed(3)
    h, o = torch.randn(5, cfg.hidden_size, generator=g), torch.randn(5, cfg.num_heads * cfg.head_dim, generator=g)
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
    ids = tok.encode_chat([{"role": "user", "content": "Move the blue box to shelf A3 and report back."}])
    ref = _greedy(m, tok, ids, 16)
    with using(m, default_ort):
        plain = _greedy(m, tok, ids, 16)
        spec = _greedy(m, tok, ids, 16, build_speculation(SpecOptions(method="ngram", ngram_k=4, fixed_k=True), m))
    assert plain == ref        # fp32: identical to torch
    assert spec == plain       # speculative on onnxruntime == plain on onnxruntime


def test_selftest_cli_onnxruntime_passes(default_ort, engine_dir, capsys):
    # default_ort built the entry: the command loads it from the cache (hashes checked)
    rc = main(["selftest", "--backend", "onnxruntime", "--quick", "--json", "--engine-cache", str(engine_dir)])
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
    monkeypatch.setitem(BACKENDS, "broken", lambda model, opts, progress: _ScaledBackend(model))
    rc = main(["selftest", "--backend", "broken", "--model", str(tiny_dirs["llama"]), "--no-plan", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1 and not rep["passed"]
    bad = [c for c in rep["checks"] if c["name"].startswith("segment") and not c["passed"]]
    assert [c["name"] for c in bad] == ["segment post_attn.1"]
    assert "norm_ratio" in bad[0]["failed"] and "cosine" not in bad[0]["failed"]   # cosine alone would pass
    assert bad[0]["figures"]["norm_ratio"] == pytest.approx(1.01, abs=1e-4)


def test_library_selftest_torch_reference_passes(tiny_llama):
    rep = run_selftest(tiny_llama, "torch", quick=True)
    assert rep.passed and "PASS" in rep.summary() and rep.to_dict()["backend"] == "torch"


def _build(model_dir, cache) -> int:
    return main(["engines", "build", "--backend", "onnxruntime", "--model", str(model_dir), "--engine-cache", str(cache)])


def test_tampered_engine_file_is_refused_with_exit_2(tiny_dirs, tmp_path, capsys):
    assert _build(tiny_dirs["qwen3"], tmp_path) == 0
    entry = next(p for p in tmp_path.iterdir() if (p / "manifest.json").is_file())
    victim = entry / "post_attn.0.onnx.data"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    capsys.readouterr()
    rc = main(["generate", "hi", "--model", str(tiny_dirs["qwen3"]), "--backend", "onnxruntime",
               "--engine-cache", str(tmp_path), "--max-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "post_attn.0.onnx.data does not match its manifest hash" in err and "Traceback" not in err
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
    p = subprocess.run([sys.executable, "-c", KILL_MIDWAY, str(tiny_dirs["llama"]), str(tmp_path)], env=env,
                       capture_output=True, timeout=300)
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    assert main(["engines", "list", "--json", "--engine-cache", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)["entries"]
    assert rows and all(r["status"] == "partial" for r in rows)      # something was on disk, none usable
    assert main(["engines", "prune", "--engine-cache", str(tmp_path)]) == 0
    assert not any(tmp_path.iterdir())


def test_tensorrt_profiles_and_missing_tensorrt(tiny_dirs, capsys):
    from engines.tensorrt import profile_ranges

    assert profile_ranges((1, 9, 256)) == [(1, 1, 1), (2, 9, 9), (10, 256, 256)]
    assert profile_ranges((1, 1, 1)) == [(1, 1, 1)]
    try:
        import tensorrt  # noqa: F401
        if torch.cuda.is_available():
            pytest.skip("TensorRT and a GPU are present: the missing-TensorRT error cannot be shown here")
    except ImportError:
        pass
    rc = main(["generate", "hi", "--model", str(tiny_dirs["llama"]), "--backend", "tensorrt", "--max-tokens", "2"])
    assert rc == 2 and "tensorrt backend needs" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and TensorRT 10 (neither exists here)")
def test_tensorrt_selftest_on_device(tiny_llama, tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT 10 is not installed")
    from thor_runtime.loading import load

    loaded = load(str(Path(tiny_llama.source)), "fp32", device="cuda", layout="dense")
    rep = run_selftest(loaded, "tensorrt", quick=True, options=BackendOptions(cache_dir=str(tmp_path)))
    assert rep.passed, rep.summary()
