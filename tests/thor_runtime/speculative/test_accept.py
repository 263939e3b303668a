"""Acceptance policies, unit-tested with hand-made logits."""

from __future__ import annotations

import pytest
import torch

from thor_runtime.speculative.accept import (
    RelaxedConfig,
    accept_relaxed,
    accept_sampling,
    accept_strict,
    in_thinking,
    rows_argmax,
)

V = 8


def rows(*argmaxes, second=None, gap=5.0):
    """Logits [len, V] whose row j has its max at argmaxes[j] (and optionally a runner-up)."""
    x = torch.zeros(len(argmaxes), V)
    for j, a in enumerate(argmaxes):
        x[j, a] = 10.0
        if second is not None and second[j] is not None:
            x[j, second[j]] = 10.0 - gap
    return x


def test_strict_all_accepted_gets_bonus():
    n, out = accept_strict(rows(1, 2, 3, 4), torch.tensor([1, 2, 3]))
    assert n == 3 and out == [1, 2, 3, 4]


def test_strict_all_rejected_gets_recovered():
    n, out = accept_strict(rows(1, 2, 3, 4), torch.tensor([5, 2, 3]))
    assert n == 0 and out == [1]


def test_strict_mid_miss_ignores_later_matches():
    n, out = accept_strict(rows(1, 2, 3, 4), torch.tensor([1, 6, 3]))
    assert n == 1 and out == [1, 2]


def test_strict_no_drafts_is_plain_decoding():
    n, out = accept_strict(rows(7), torch.empty(0, dtype=torch.long))
    assert n == 0 and out == [7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rows_argmax_is_torchs_first_maximum(dtype):
    """The cycle's argmax (numpy's on a CPU, torch's for bf16) takes each row's first maximum, as
    torch.argmax does: wide rows with ties, a row of one value, a non-contiguous view."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (5, 151_936), generator=g).to(dtype)  # many ties per row
    x[1] = 2.0
    for view in (x, x[::2], x[:, 7:]):
        got = rows_argmax(view)
        assert got.dtype == torch.long and torch.equal(got, view.argmax(-1))


B, E = 6, 7  # <think>, </think>


@pytest.mark.parametrize("margin", ["logit", "prob"])
def test_relaxed_accepts_runner_up_only_inside_span(margin):
    cfg = RelaxedConfig(B, E, top_k=2, delta=6.0 if margin == "logit" else 1.0, margin=margin)
    logits = rows(1, 2, 3, second=[4, 5, None], gap=2.0)
    drafts = torch.tensor([4, 5])
    assert accept_relaxed(logits, drafts, inside=True, cfg=cfg) == (2, [4, 5, 3])
    assert accept_relaxed(logits, drafts, inside=False, cfg=cfg) == (0, [1])


def test_relaxed_respects_delta_and_topk():
    logits = rows(1, 2, second=[4, None], gap=3.0)
    assert (
        accept_relaxed(logits, torch.tensor([4]), True, RelaxedConfig(B, E, top_k=2, delta=2.0))[0]
        == 0
    )
    assert (
        accept_relaxed(logits, torch.tensor([4]), True, RelaxedConfig(B, E, top_k=2, delta=3.0))[0]
        == 1
    )
    # A draft outside the top-k is never relaxed, whatever delta.
    assert (
        accept_relaxed(logits, torch.tensor([3]), True, RelaxedConfig(B, E, top_k=1, delta=99.0))[0]
        == 0
    )


def test_relaxed_turns_strict_at_the_closing_draft():
    cfg = RelaxedConfig(B, E, top_k=3, delta=6.0)
    # Row 0: target says 1, draft 4 is a close runner-up -> relaxed accept.
    # Row 1: draft is </think> but the target's top-1 is 2 -> the closing draft is checked strictly.
    logits = rows(1, 2, 3, second=[4, E, None], gap=1.0)
    assert accept_relaxed(logits, torch.tensor([4, E]), True, cfg) == (1, [4, 2])
    # When the target agrees on </think>, the span closes and the next draft is strict.
    logits = rows(1, E, 3, 0, second=[4, None, 5, None], gap=1.0)
    assert accept_relaxed(logits, torch.tensor([4, E, 5]), True, cfg) == (2, [4, E, 3])


def test_relaxed_opens_at_begin_token():
    cfg = RelaxedConfig(B, E, top_k=3, delta=6.0)
    logits = rows(B, 2, 0, second=[None, 5, None], gap=1.0)
    assert accept_relaxed(logits, torch.tensor([B, 5]), False, cfg) == (2, [B, 5, 0])


def test_in_thinking():
    cfg = RelaxedConfig(B, E)
    assert (
        in_thinking([1, B, 2], cfg)
        and not in_thinking([1, B, 2, E, 3], cfg)
        and not in_thinking([1, 2], cfg)
    )


def test_relaxed_config_validation():
    from thor_runtime.errors import ThorError

    with pytest.raises(ThorError):
        RelaxedConfig(B, E, margin="bits")
    with pytest.raises(ThorError):
        RelaxedConfig(B, B)


def _chi2_ok(counts: torch.Tensor, p: torch.Tensor) -> bool:
    """Pearson chi-square over bins expecting >= 5 draws (the rest pooled); passes below
    df + 5 sqrt(2 df), far in the tail for a correct sampler (fixed seed, so deterministic),
    while sampling from q instead of p lands orders of magnitude above it."""
    n = counts.sum()
    exp = p * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    ex = torch.cat([exp[big], exp[~big].sum(0, keepdim=True)])
    stat = float(((obs - ex) ** 2 / ex.clamp_min(1e-9)).sum())
    df = obs.numel() - 1
    return stat < df + 5 * (2 * df) ** 0.5


def test_speculative_sampling_matches_target_distribution(tiny_llama):
    """The first committed token of a cycle is distributed as the target's p, for a
    deterministic proposer (one-hot q) and for a stochastic one (q from a softmax)."""
    ids = torch.tensor(tiny_llama.tokenizer.encode("pick up the red cup"))
    from thor_runtime.cache.kv_cache import KVCache

    logits = tiny_llama.model.forward(ids, KVCache(tiny_llama.cfg, 64)).logits[-2:]  # [2, V]
    p = torch.softmax(logits / 0.7, -1)  # [2, V]
    gen = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(1, p.shape[1], generator=gen), -1)  # [1, V]
    n = 20000
    for draft_probs in (None, q):
        counts = torch.zeros(p.shape[1])
        for _ in range(n):
            if draft_probs is None:
                d = torch.multinomial(
                    p[0], 1, generator=gen
                )  # any fixed rule works; sample to spread drafts
                d = torch.tensor([int(torch.argmax(p[0]))]) if _ % 2 else d
            else:
                d = torch.multinomial(draft_probs[0], 1, generator=gen)
            _n, out = accept_sampling(p, d, gen, draft_probs)
            counts[out[0]] += 1
        assert _chi2_ok(counts, p[0])
        # The test has teeth: the proposal's own distribution fails it.
        if draft_probs is not None:
            assert not _chi2_ok(
                torch.multinomial(q[0], n, replacement=True, generator=gen)
                .bincount(minlength=p.shape[1])
                .float(),
                p[0],
            )


def test_speculative_sampling_rejects_impossible_draft():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        n, out = accept_sampling(p, torch.tensor([2]), gen)
        assert n == 0 and out[0] in (0, 1)
