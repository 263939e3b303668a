"""Low-bit weights: GGUF Q4 blocks kept as int4 with the file's own scales, logits within a
stated tolerance of fp32, speculation exactly plain decoding, and the prepared-weight cache
(a hit equals a build; a mismatching key or file hash is refused and rebuilt)."""

from __future__ import annotations

import importlib
import json
import shutil

import numpy as np
import pytest
import torch

from tests.helpers.exactness import PROMPT, assert_same, steps_vs_verify
from tests.helpers.lowbit import REGRET, REL_TOL, assert_end_of_context
from tests.helpers.tiny import random_drafter
from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.kernels.lowbit import GROUP, q4_blocks, quantize_int4
from thor_runtime.kernels.lowbit_kernels import int4_kernels
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.ngram import NgramProposer

KERNELS = int4_kernels()
UNAVAILABLE = {
    "ort": "onnxruntime (the onnx extra) is not installed",
    "torch": "this torch has no CPU int4 kernel",
}
# every int4 kernel, each skipped with its reason where it cannot run
each_kernel = pytest.mark.parametrize(
    "kernel",
    [
        pytest.param(k, marks=pytest.mark.skipif(not cls.available(), reason=UNAVAILABLE[k]))
        for k, cls in KERNELS.items()
    ],
)


def test_q4_blocks_match_gguf_dequantization():
    """Our reading of Q4_0 / Q4_1 blocks reproduces the gguf package's dequantization exactly."""
    from gguf import GGMLQuantizationType, quants

    g = np.random.default_rng(0)
    w = g.normal(size=(8, 4 * GROUP)).astype(np.float32)
    for kind in ("Q4_0", "Q4_1"):
        qt = GGMLQuantizationType[kind]
        raw = quants.quantize(w, qt)
        ref = quants.dequantize(raw, qt).reshape(w.shape)
        assert torch.equal(q4_blocks(raw, w.shape, kind).dequantize(), torch.from_numpy(ref))


@each_kernel
def test_int4_weight_is_its_codes(kernel):
    """The kernel computes x @ dequantize(codes).T, to the rounding of its scales (torch:
    bf16) or of its activations (ort: int8 per block of 32)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g)
    codes = quantize_int4(w)
    x = torch.randn(5, 64, generator=g)
    ref = x @ codes.dequantize().t()
    y = KERNELS[kernel].from_codes([codes])(x)
    assert (y - ref).abs().max() <= 0.02 * ref.abs().max()
    for i in range(5):  # a row alone gets the bits it gets among others
        assert torch.equal(KERNELS[kernel].from_codes([codes])(x[i : i + 1]), y[i : i + 1])
    assert (codes.dequantize() - w).abs().max() <= (w.amax() - w.amin()) / 15  # one step at most


@pytest.fixture(scope="module", params=list(KERNELS))
def int4_default(request, tmp_path_factory):
    if not KERNELS[request.param].available():
        pytest.skip(UNAVAILABLE[request.param])
    from thor_runtime.loading import load

    return load(
        "default",
        "int4",
        cache_dir=str(tmp_path_factory.mktemp("wcache")),
        int4_kernel=request.param,
    )


def _logits(model, ids):
    return model.forward(ids, KVCache(model.cfg, len(ids) + 1, "fp32", model.dtype)).logits


@pytest.mark.slow
def test_int4_logits_within_tolerance_of_fp32(int4_default, default_model):
    m = int4_default.model
    assert m.quant == "int4" and m.row_loops == []  # the int4 kernel passes the row probe
    ids = torch.tensor(default_model.tokenizer.encode(PROMPT))
    a, b = _logits(m, ids), _logits(default_model.model, ids)
    assert (a - b).abs().max() <= REL_TOL * b.abs().max()
    picked = b.gather(-1, a.argmax(-1, keepdim=True))[:, 0]  # fp32's score of int4's pick
    assert (b.amax(-1) - picked).max() <= REGRET


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_int4_verify_rows_are_one_row_steps(int4_default, kv):
    ids = torch.tensor(int4_default.tokenizer.encode(PROMPT))
    assert_same(*steps_vs_verify(int4_default.model, ids, 8, kv, taps=(1, 14)))


@pytest.mark.slow
def test_int4_speculation_is_plain_decoding(int4_default):
    model, tok = int4_default.model, int4_default.tokenizer
    rt = Runtime(model, tok, kv_dtype="fp32")
    ids = tok.encode_chat(
        [{"role": "user", "content": "Plan how the robot moves the red mug to the dish rack."}]
    )
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    plain = rt.generate(ids, params, Speculation())
    drafter = DFlashProposer(random_drafter(model.cfg, num_layers=1, seed=0), model, window=64)
    for spec in (Speculation(drafter, 15), Speculation(NgramProposer(), 8)):
        assert rt.generate(ids, params, spec).token_ids == plain.token_ids


@each_kernel
def test_int4_tiny_requantized_is_exact(tiny_llama, kernel):
    """Float checkpoints re-quantize to int4 (min/max per group); verify is exact there too."""
    from pathlib import Path

    from thor_runtime.engine.runner import attach
    from thor_runtime.loading.hf_weights import hf_weights
    from thor_runtime.models.dense import TargetModel

    m = attach(
        TargetModel(
            tiny_llama.cfg, hf_weights(Path(tiny_llama.source)), quant="int4", int4_kernel=kernel
        )
    )
    assert m.int4_kernel == kernel
    assert isinstance(m.layers[0].wqkv, KERNELS[kernel]) or m.row_loops
    ids = torch.tensor(tiny_llama.tokenizer.encode(PROMPT))[:30]
    assert_same(*steps_vs_verify(m, ids, 9, "fp32", taps=(0, 2)))


@pytest.mark.slow
def _load_counting_probes(src: str, quant: str, cache: str):
    """load() with every row-invariance probe counted. -> (loaded, probed kernel modules)."""
    from thor_runtime.loading import load

    probes = []
    with pytest.MonkeyPatch.context() as mp:
        for mod in ("thor_runtime.engine.exactness", "thor_runtime.kernels.lowbit_step"):
            real = importlib.import_module(mod).rows_invariant
            mp.setattr(
                f"{mod}.rows_invariant", lambda *a, _r=real, _m=mod: probes.append(_m) or _r(*a)
            )
        return load(src, quant, cache_dir=cache), probes


def test_weight_cache_hit_refusal_and_rebuild(tmp_path, default_model):
    from thor_runtime.loading import default_model_path, load

    src = tmp_path / "m.gguf"
    shutil.copyfile(default_model_path(), src)
    cache = tmp_path / "cache"
    first, probes = _load_counting_probes(str(src), "int4", str(cache))
    assert first.model.cache_hit is False and probes
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    # the probe verdicts are kept per CPU environment: a hit probes nothing
    hit, probes = _load_counting_probes(
        str(src), "auto", str(cache)
    )  # auto: a quantized GGUF runs int4
    assert probes == []
    assert hit.model.cache_hit is True and hit.model.quant == "int4"
    ids = torch.tensor(default_model.tokenizer.encode(PROMPT))
    ref = _logits(first.model, ids)
    assert torch.equal(_logits(hit.model, ids), ref)
    assert hit.tokenizer.encode(PROMPT) == default_model.tokenizer.encode(PROMPT)
    assert hit.tokenizer.encode_chat(
        [{"role": "user", "content": "hi"}]
    ) == default_model.tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    meta = json.loads((entry / "key.json").read_text())
    assert meta["verdicts"]

    # a key that does not match (another torch wrote it) -> refused, rebuilt
    meta["torch"] = "0.0.0"
    (entry / "key.json").write_text(json.dumps(meta))
    assert load(str(src), "int4", cache_dir=str(cache)).model.cache_hit is False
    assert load(str(src), "int4", cache_dir=str(cache)).model.cache_hit is True

    # damaged weights (one byte flipped) -> the file hash does not match -> refused, rebuilt
    f = entry / "weights.safetensors"
    data = bytearray(f.read_bytes())
    data[-100] ^= 0xFF
    f.write_bytes(bytes(data))
    rebuilt = load(str(src), "int4", cache_dir=str(cache))
    assert rebuilt.model.cache_hit is False
    assert torch.equal(_logits(rebuilt.model, ids), ref)

    # a damaged header (the mapping itself fails while the hash is still running) -> rebuilt too
    data = bytearray(f.read_bytes())
    data[0:8] = (len(data) * 2).to_bytes(8, "little")
    f.write_bytes(bytes(data))
    assert load(str(src), "int4", cache_dir=str(cache)).model.cache_hit is False
    assert load(str(src), "int4", cache_dir=str(cache)).model.cache_hit is True

    # a changed source file gets its own entry (its hash differs), never the old weights
    raw = bytearray(src.read_bytes())
    raw[-1] ^= 0x01
    src.write_bytes(bytes(raw))
    assert load(str(src), "int4", cache_dir=str(cache)).model.cache_hit is False
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2


@pytest.mark.skipif(not KERNELS["ort"].available(), reason=UNAVAILABLE["ort"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2"])
def test_fused_layer_graphs_are_the_projection_path(arch, request):
    """MatMulNBits models run each layer boundary as one ORT graph (for caches the step graph
    does not take): the same math as the per-projection path (to fp32 rounding), and exact
    verifies where the probe admits it."""
    from pathlib import Path

    from thor_runtime.engine.runner import attach
    from thor_runtime.loading.hf_weights import hf_weights
    from thor_runtime.models.dense import TargetModel

    tiny = request.getfixturevalue(f"tiny_{arch}")
    m = attach(
        TargetModel(tiny.cfg, hf_weights(Path(tiny.source)), quant="int4", int4_kernel="ort")
    )
    m.runner.step = None  # the per-boundary path, as a bf16 or fp8 cache runs it
    m.runner.prefill_on_rows = False  # prompts too
    ids = torch.tensor(tiny.tokenizer.encode(PROMPT))[:30]
    fused = _logits(m, ids)  # built on first use
    key = next(k for k in m.row_verdicts if k.startswith("FusedPostPre"))
    assert (m.runner.fused is not None) == m.row_verdicts[key]
    if m.runner.fused is None:
        pytest.skip("the fused graph is not row-invariant on this CPU (the projection path runs)")
    assert len(m.runner.fused) == tiny.cfg.num_layers - 1
    assert_same(*steps_vs_verify(m, ids, 9, "fp32", taps=(0, 2)))
    m.runner.fused = None
    split = _logits(m, ids)
    # int8 activation rounding turns last-bit differences of the norms into ~0.2-1 % here
    assert (fused - split).abs().max() <= 2e-2 * split.abs().max()


@pytest.mark.skipif(not KERNELS["ort"].available(), reason=UNAVAILABLE["ort"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2"])
def test_step_graph_is_the_layer_path(arch, request):
    """The whole forward as one ORT graph (attention on GroupQueryAttention, appending to our
    KV cache in place): the layer path's math to int8-activation rounding, the cache's own
    keys and values, exact verifies with taps where the probe admits it; a cache it cannot
    bind (fp8) runs the layer path, built on first use."""
    from pathlib import Path

    from thor_runtime.engine.runner import attach
    from thor_runtime.loading.hf_weights import hf_weights
    from thor_runtime.models.dense import TargetModel

    tiny = request.getfixturevalue(f"tiny_{arch}")
    m = attach(
        TargetModel(tiny.cfg, hf_weights(Path(tiny.source)), quant="int4", int4_kernel="ort")
    )
    m.runner.rows = None  # verifies on the graph too (the row kernel: test_rowstep.py)
    _ = m.runner.step  # built on first ask where a regrouping row kernel runs
    key = next(k for k in m.row_verdicts if k.startswith("StepGraph"))
    assert (m.runner.step is not None) == m.row_verdicts[key]
    if m.runner.step is None:
        pytest.skip("the step graph is not row-invariant on this CPU (the layer path runs)")
    assert m.runner.fused is None  # not built while only fp32 caches come
    ids = torch.tensor(tiny.tokenizer.encode(PROMPT))[:30]
    cache = KVCache(m.cfg, len(ids) + 1, "fp32", m.dtype)
    whole = m.forward(ids, cache).logits
    assert cache.length == len(ids)
    steps, verify = steps_vs_verify(m, ids, 9, "fp32", taps=(0, 2))
    assert_same(steps, verify)
    assert torch.equal(verify[0], whole[9:])  # a prefill row is a verify row here too
    step_kv = cache
    m.runner.step, step = None, m.runner.step
    ref_cache = KVCache(m.cfg, len(ids) + 1, "fp32", m.dtype)
    layers = m.forward(ids, ref_cache).logits
    assert (whole - layers).abs().max() <= 2e-2 * layers.abs().max()
    n = len(ids)
    assert (step_kv.k[:, :, :n] - ref_cache.k[:, :, :n]).abs().max() <= 2e-2 * ref_cache.k[
        :, :, :n
    ].abs().max()
    m.runner.step = step
    fp8 = KVCache(m.cfg, len(ids) + 1, "fp8", m.dtype)
    assert not m.runner.step.fits(fp8, 1)
    assert_same(*steps_vs_verify(m, ids, 9, "fp8", taps=(1,)))
    assert (
        m.runner.fused is not None
        or not m.row_verdicts[next(k for k in m.row_verdicts if k.startswith("FusedPostPre"))]
    )


@pytest.mark.skipif(not KERNELS["ort"].available(), reason=UNAVAILABLE["ort"])
def test_step_graph_at_the_end_of_the_context(tiny_llama):
    """The last position of the model's context: the padded copy of a 1-row step sits one
    position past it (its RoPE row and its cache slot exist), the step is still a verify row,
    and one token more is refused."""
    from pathlib import Path

    from thor_runtime.engine.runner import attach
    from thor_runtime.loading.hf_weights import hf_weights
    from thor_runtime.models.dense import TargetModel

    m = attach(
        TargetModel(
            tiny_llama.cfg, hf_weights(Path(tiny_llama.source)), quant="int4", int4_kernel="ort"
        )
    )
    if m.runner.step is None:
        pytest.skip("the step graph is not row-invariant on this CPU (the layer path runs)")
    m.runner.rows = None  # steps and verifies on the graph (the row kernel: test_rowstep.py)
    assert_end_of_context(m, tiny_llama.tokenizer)


@pytest.mark.skipif(not KERNELS["ort"].available(), reason=UNAVAILABLE["ort"])
def test_step_graph_runs_long_inputs_in_chunks(tiny_llama):
    """A long forward runs in calls of CHUNK_ROWS rows: the same bits as calling it chunk by
    chunk, with the logits of the rows asked for (across a chunk border) and every tap row."""
    from pathlib import Path

    from thor_runtime.engine.runner import attach
    from thor_runtime.kernels.lowbit_step import CHUNK_ROWS
    from thor_runtime.loading.hf_weights import hf_weights
    from thor_runtime.models.dense import TargetModel

    m = attach(
        TargetModel(
            tiny_llama.cfg, hf_weights(Path(tiny_llama.source)), quant="int4", int4_kernel="ort"
        )
    )
    if m.runner.step is None:
        pytest.skip("the step graph is not row-invariant on this CPU (the layer path runs)")
    T = 2 * CHUNK_ROWS + 44
    ids = torch.tensor(tiny_llama.tokenizer.encode(PROMPT) * T)[:T]
    for rows in ("all", slice(CHUNK_ROWS - 5, CHUNK_ROWS + 7), "last"):
        whole = m.forward(ids, KVCache(m.cfg, T, "fp32", m.dtype), taps=(1,), logits_rows=rows)
        cache = KVCache(m.cfg, T, "fp32", m.dtype)
        parts = [
            m.forward(ids[s : s + CHUNK_ROWS], cache, taps=(1,)) for s in range(0, T, CHUNK_ROWS)
        ]
        ref = torch.cat([p.logits for p in parts])
        want = (
            rows if isinstance(rows, slice) else {"all": slice(None), "last": slice(-1, None)}[rows]
        )
        assert torch.equal(whole.logits, ref[want])
        assert torch.equal(whole.taps[1], torch.cat([p.taps[1] for p in parts]))


def test_cached_int8_weights_are_64_byte_aligned():
    """A weight cache entry maps tensors wherever the safetensors header puts them; torch's
    int8 weight kernel crashed (SIGSEGV) on 16 rows of a head not on a 64-byte boundary, so
    such a weight is copied on load, with the same values."""
    from thor_runtime.loading.weight_cache import _weight_from

    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (256, 64), dtype=torch.int8, generator=g)
    raw = torch.empty(q.numel() + 8, dtype=torch.int8)
    off = next(i for i in range(1, 8) if (raw.data_ptr() + i) % 64)
    view = raw[off : off + q.numel()].view(256, 64)
    view.copy_(q)
    assert view.data_ptr() % 64
    s = torch.rand(256, dtype=torch.bfloat16, generator=g)
    w = _weight_from({"h.q": view, "h.s": s}, "h")
    assert w.q.data_ptr() % 64 == 0 and torch.equal(w.q, q)
    x = torch.randn(16, 64, generator=g)
    assert torch.equal(w(x), torch._weight_int8pack_mm(x.to(torch.bfloat16), q, s).float())


@pytest.mark.slow
def test_warm_start_reads_no_gguf_fields(tmp_path, monkeypatch):
    """A cache hit takes the config and tokenizer from the entry: gguf's reader (the whole
    vocabulary parsed, seconds) is not opened, the hybrid check included."""
    from thor_runtime.loading import gguf_weights, load

    load("default", "int4", cache_dir=str(tmp_path))

    def refuse(path):
        raise AssertionError(f"a warm start opened {path} with gguf's reader")

    monkeypatch.setattr(gguf_weights, "open_reader", refuse)
    assert load("default", "int4", cache_dir=str(tmp_path)).model.cache_hit
