"""A drafter's block and window updates as row-kernel calls (speculative/dflash_rows.py): the
torch forward's math over the same 8-bit projections, and speculative output still plain
decoding's."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.lowbit import row_drafter, with_rows
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.kernels.lowbit_kernels import int4_kernels
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.dflash_rows import ENV, RowDrafter

pytestmark = pytest.mark.skipif(
    not int4_kernels()["ort"].available(), reason="onnxruntime (the onnx extra) is not installed"
)


def _pair(tiny, ids, window=16):
    """Two proposers over one drafter's weights: the C block (``_fast``) and the torch forward."""
    m = with_rows(tiny)
    fast = DFlashProposer(row_drafter(tiny, ids), m, window=window)
    slow = DFlashProposer(row_drafter(tiny, ids), m, window=window)
    slow._fast = None
    slow._alloc()
    return m, fast, slow


def test_the_c_block_is_the_torch_forward_over_the_same_projections(tiny_llama):
    tok = tiny_llama.tokenizer
    prompt = tok.encode_chat([{"role": "user", "content": "put the red block on the blue one"}])
    m, fast, slow = _pair(tiny_llama, sorted(set(prompt)))
    assert isinstance(fast._fast, RowDrafter) and slow._fast is None
    g = torch.Generator().manual_seed(5)
    n_taps = len(fast.tap_layers)
    taps = {i: torch.randn(len(prompt), m.cfg.hidden_size, generator=g) for i in fast.tap_layers}
    for p in (fast, slow):
        p.start(prompt, taps)
    # the window: the same entries, features and K/V (to float rounding) in the same slots
    W = fast.window
    pf, ff = fast.window_entries()
    ps, fs = slow.window_entries()
    assert torch.equal(pf, ps) and torch.allclose(ff, fs, atol=1e-4, rtol=1e-4)
    assert torch.allclose(fast._kv[..., :W, :], slow._kv, atol=1e-3, rtol=1e-3)
    # a block: its logits over the draft head (the int8 rounding of activations that differ in
    # float rounding moves them by a little), and so its drafts
    seq = list(prompt) + [prompt[-1]]  # the token the prefill chose comes first
    for _ in range(3):
        n, at = fast.window_len, fast._next_pos
        assert slow.window_len == n  # both windows take in the committed rows
        hn = fast._fast.block(
            fast.drafter.block_input(seq[at], fast.block_size), at, fast._kv, n
        )  # [B, D]
        a = fast.drafter.score(hn[1:5], fast._head)  # [4, V']
        b = slow.drafter.draft_block(
            slow._kv[:, :, :, :n], seq[at], at, 4, slow.block_size, head=slow._head
        )
        assert (a - b).abs().max() <= 5e-2 * b.abs().max()  # each is ~5% off a float64 forward
        drafts = fast.propose(seq, 4)[0]
        assert drafts == slow.propose(seq, 4)[0]
        commit = torch.randn(3, n_taps * m.cfg.hidden_size, generator=g)
        for p in (fast, slow):
            p.commit(
                3,
                {
                    i: commit[:, j * m.cfg.hidden_size : (j + 1) * m.cfg.hidden_size]
                    for j, i in enumerate(p.tap_layers)
                },
            )
        seq += (drafts + [seq[-1]] * 3)[:3]
    assert fast._count == slow._count and fast.window_len == slow.window_len == W


def test_speculative_output_with_the_c_block_is_plain_decoding(tiny_llama, monkeypatch):
    m = with_rows(tiny_llama)
    tok = tiny_llama.tokenizer
    rt = Runtime(m, tok)
    prompt = tok.encode_chat([{"role": "user", "content": "stack the red block on the blue one"}])
    plain = rt.generate(prompt, SamplingParams(max_tokens=32)).token_ids
    p = DFlashProposer(
        row_drafter(tiny_llama, sorted(set(plain))), m, window=8
    )  # a window that wraps
    assert p._fast is not None
    spec = rt.generate(
        prompt, SamplingParams(max_tokens=32), speculation=Speculation(p, 4, DraftBudget())
    )
    assert spec.token_ids == plain and spec.stats.cycles > 0
    # THOR_DRAFTER_BLOCK=0: the torch forward around the same projections
    monkeypatch.setenv(ENV, "0")
    q = DFlashProposer(row_drafter(tiny_llama, sorted(set(plain))), m, window=8)
    assert q._fast is None
