"""A drafter's projections on the row kernel (thor_runtime/kernels/row_linear.py): the int8 math
of the target's own blocks, each row's bits independent of the rows beside it, and speculative
output still plain decoding's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.lowbit import row_drafter, with_rows
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.kernels.lowbit_kernels import int4_kernels
from thor_runtime.kernels.row_linear import ENV, RowLinear
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.dflash_io import save_drafter

pytestmark = pytest.mark.skipif(
    not int4_kernels()["ort"].available(), reason="onnxruntime (the onnx extra) is not installed"
)


def _reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] W^T in float64 with both rounded as the kernel rounds them: W to symmetric 8-bit
    blocks of 32 (absmax / 127), each row of x to int8 per block of 32 (round half to even)."""

    def blocks(a):
        g = a.double().reshape(a.shape[0], -1, 32)  # [R, K/32, 32]
        s = g.abs().amax(-1, keepdim=True) / 127
        return torch.round(g / s.clamp_min(1e-300)) * s  # [R, K/32, 32]

    return torch.einsum("mbk,nbk->mn", blocks(x), blocks(w))  # [M, N]


def test_a_projection_on_the_row_kernel_is_the_int8_math_row_by_row(tiny_llama):
    m = with_rows(tiny_llama)
    g = torch.Generator().manual_seed(0)
    w, x = (
        torch.randn(48, 96, generator=g),
        torch.randn(70, 96, generator=g),
    )  # 70 rows: two kernel calls
    lin = RowLinear(m.runner.rows, w)
    y = lin(x)  # [70, 48]
    assert y.shape == (70, 48) and y.dtype == torch.float32
    ref = _reference(x, w)
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    # a row's bits do not depend on the rows beside it, nor on the call it lands in
    assert torch.equal(torch.cat([lin(x[i : i + 1]) for i in range(0, 70, 7)]), y[0:70:7])
    assert torch.equal(lin(x[:16].view(2, 8, 96)).view(16, 48), y[:16])


def test_a_drafter_beside_the_row_kernel_drafts_on_it_and_output_stays_plain(
    tiny_llama, monkeypatch, tmp_path
):
    m = with_rows(tiny_llama)
    tok = tiny_llama.tokenizer
    rt = Runtime(m, tok)
    prompt = tok.encode_chat([{"role": "user", "content": "stack the red block on the blue one"}])
    plain = rt.generate(prompt, SamplingParams(max_tokens=24)).token_ids
    short = sorted(set(plain))
    d = row_drafter(tiny_llama, short)
    torch_copy = copy.deepcopy(d)
    p = DFlashProposer(d, m, window=16)
    rows = [p.drafter.fc] + [
        c
        for lay in p.drafter.layers
        for c in (*lay.self_attn.children(), *lay.mlp.children())
        if not isinstance(c, type(lay.self_attn.q_norm))
    ]
    assert rows and all(isinstance(c, RowLinear) for c in rows)
    assert p.drafter.dtype == torch.float32
    spec = rt.generate(
        prompt, SamplingParams(max_tokens=24), speculation=Speculation(p, 4, DraftBudget())
    )
    assert spec.token_ids == plain
    # the draft head is a gather of the target's own 8-bit head blocks: its math to fp32 rounding
    ids = p._ids
    assert isinstance(p._head, RowLinear) and p._head.out_features == len(ids)
    x = torch.randn(5, m.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    want = _reference(x, m.head_w.dequantize()[ids])
    assert (p._head(x).double() - want).abs().max() <= 1e-5 * want.abs().max()
    # the drafter's logits are its fp32 math up to the int8 rounding
    torch_copy.float().bind_target(m.embed_w, m.lm_head)
    head = m.lm_head[torch.tensor(short)].float()
    a = p.drafter.draft_block(None, plain[0], 7, 4, head=RowLinear(m.runner.rows, head))  # [4, V']
    b = torch_copy.draft_block(None, plain[0], 7, 4, head=head)
    assert (a - b).abs().max() <= 3e-2 * b.abs().max()
    # its float projections are gone: saving it is refused, not written without them
    with pytest.raises(ThorError, match="row kernel"):
        save_drafter(p.drafter, tmp_path / "d")
    assert not (tmp_path / "d").exists()
    # THOR_DRAFTER_ROWS=0 keeps torch's matmuls
    monkeypatch.setenv(ENV, "0")
    q = DFlashProposer(row_drafter(tiny_llama, short), m, window=16)
    assert isinstance(q.drafter.fc, nn.Linear) and not isinstance(q.drafter.fc, RowLinear)
    assert (
        rt.generate(
            prompt, SamplingParams(max_tokens=24), speculation=Speculation(q, 4, DraftBudget())
        ).token_ids
        == plain
    )


def test_every_row_linear_frees_its_weights(tiny_llama):
    m = with_rows(tiny_llama)
    lin = RowLinear(m.runner.rows, torch.ones(16, 32))
    assert np.allclose(lin(torch.ones(3, 32)).numpy(), 32.0, rtol=1e-6)
    lin.__del__()
    assert lin._h is None
