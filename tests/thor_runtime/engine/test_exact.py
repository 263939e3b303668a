"""Exact by construction: a verify row is bit-for-bit a 1-row step, on every CPU.

``TargetModel.verify`` computes each row's projections on kernels probed row-invariant at load
(RowLoop where a kernel is not) and attends each row alone over its own key prefix. So the
logits, the taps and the stored K/V — fp8 bytes included — of anchor + drafts equal what plain
decoding computes one token at a time. These tests compare with ``torch.equal``, never with a
tolerance; CI runs them again under the AVX2 and baseline CPU settings (.ci/run).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.exactness import PROMPT, assert_same, steps_vs_verify
from tests.helpers.tiny import random_drafter
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.models.dense import EXACT_ROWS, RowLoop, TargetModel, rows_invariant
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.ngram import NgramProposer


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
@pytest.mark.parametrize("which", ["tiny_llama", "tiny_qwen3"])
def test_verify_rows_are_one_row_steps_tiny(request, which, kv):
    loaded = request.getfixturevalue(which)
    ids = torch.tensor(loaded.tokenizer.encode(PROMPT))
    # 21 verify rows: two forwards (EXACT_ROWS, then the rest), as a wide block would run
    a, b = steps_vs_verify(loaded.model, ids[:30], 9, kv, taps=(0, 2))
    assert_same(a, b)


@pytest.mark.parametrize("layout", ["dense", "packed", "dual"])
def test_every_layout_is_exact(tiny_llama, layout):
    """Whatever the kernel, the probe decides: invariant kernels run batched, the others row by
    row (RowLoop) — and the verify is exact either way."""
    from thor_runtime.models.dense import PackedWeight

    if layout != "dense" and not PackedWeight.available(torch.float32, torch.device("cpu")):
        pytest.skip("this torch build has no oneDNN weight packing")
    from pathlib import Path

    from thor_runtime.loading.hf_weights import hf_weights

    m = TargetModel(tiny_llama.cfg, hf_weights(Path(tiny_llama.source)), layout=layout)
    wrapped = {
        n
        for n in ("wqkv", "wo", "w_gate_up", "w_down")
        if isinstance(getattr(m.layers[0], n), RowLoop)
    }
    assert wrapped == set(m.row_loops) - {"head"}
    # the verdict is the CPU's own: a projection is wrapped exactly when its kernel failed the probe
    w = m.layers[0].wqkv
    raw = w.w if isinstance(w, RowLoop) else w
    assert isinstance(w, RowLoop) == (not rows_invariant(raw, raw.shape[1], m.dtype, m.device))
    ids = torch.tensor(tiny_llama.tokenizer.encode(PROMPT))[:24]
    assert_same(*steps_vs_verify(m, ids, 8, "fp8"))


def test_rowloop_rows_equal_alone():
    """A RowLoop gives every decode-sized input's rows their 1-row bits; prefill-sized inputs
    go through the wrapped kernel in one call."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(48, 32, generator=g), torch.randn(EXACT_ROWS + 4, 32, generator=g)
    loop = RowLoop(w)
    alone = torch.cat([torch.nn.functional.linear(x[i : i + 1], w) for i in range(EXACT_ROWS)])
    assert torch.equal(loop(x[:EXACT_ROWS]), alone)
    assert torch.equal(loop(x), torch.nn.functional.linear(x, w))


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_verify_rows_are_one_row_steps_default(default_model, kv):
    ids = torch.tensor(default_model.tokenizer.encode(PROMPT))
    assert_same(*steps_vs_verify(default_model.model, ids, 8, kv, taps=(1, 14)))


def _run_keeping_cache(rt, ids, params, speculation):
    caches = []
    make = rt.new_cache

    def keep(capacity):
        caches.append(make(capacity))
        return caches[-1]

    rt.new_cache = keep
    try:
        res = rt.generate(ids, params, speculation)
    finally:
        rt.new_cache = make
    return res, caches[0]


@pytest.mark.slow
def test_fp8_speculation_stores_the_same_bytes_default(default_model):
    """Greedy DFlash (a random drafter: rejections every cycle) and prompt lookup with an fp8
    cache on the real default model: the same tokens as plain fp8 decoding, and after the run
    the stored fp8 cache is byte-identical — not a tie, the same bytes."""
    model, tok = default_model.model, default_model.tokenizer
    rt = Runtime(model, tok, kv_dtype="fp8")
    ids = tok.encode_chat(
        [{"role": "user", "content": "Plan how the robot moves the red mug to the dish rack."}]
    )
    params = SamplingParams(max_tokens=96, ignore_eos=True)
    plain, c_plain = _run_keeping_cache(rt, ids, params, Speculation())
    drafter = DFlashProposer(random_drafter(model.cfg, num_layers=1, seed=0), model, window=64)
    for spec in (Speculation(drafter, 15), Speculation(NgramProposer(), 8)):
        res, c_spec = _run_keeping_cache(rt, ids, params, spec)
        assert res.token_ids == plain.token_ids
        assert res.stats.cycles < plain.stats.cycles or res.stats.drafted > 0
        n = c_plain.length
        assert c_spec.length == n and c_spec.k.dtype == torch.float8_e4m3fn
        assert torch.equal(
            c_spec.k[:, :, :n].view(torch.uint8), c_plain.k[:, :, :n].view(torch.uint8)
        )
        assert torch.equal(
            c_spec.v[:, :, :n].view(torch.uint8), c_plain.v[:, :, :n].view(torch.uint8)
        )


def test_one_row_attend_is_grouped_attention():
    """attend's one-query-row path (decode steps, and each row of an exact verify, whose rows
    are strided views of the verify's q) computes SDPA's grouped-query attention."""
    import torch.nn.functional as F

    from thor_runtime.models.dense import attend

    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 5, 16, generator=g)  # [H, T, Dh]
    k, v = torch.randn(2, 2, 40, 16, generator=g)  # [Hkv, n, Dh] each
    for t in range(5):
        row = q[:, t : t + 1]  # [H, 1, Dh], strided
        ref = F.scaled_dot_product_attention(
            row.contiguous(), k[:, : 30 + t], v[:, : 30 + t], enable_gqa=True
        )
        assert torch.allclose(
            attend(row, k[:, : 30 + t], v[:, : 30 + t]), ref, atol=1e-5, rtol=1e-4
        )
