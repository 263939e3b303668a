"""The DFlash head shortlist (draft vocabulary) and the small-query attention path."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.tiny import random_drafter
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.models.dense import attend
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.dflash_io import load_drafter, save_drafter
from thor_runtime.speculative.draft_vocab import FILENAME, DraftVocab, load_draft_vocab


# ---- attention ---------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 3, 16])
@pytest.mark.parametrize("lead", [(), (2,)])
def test_attend_matches_sdpa(T, lead):
    g = torch.Generator().manual_seed(T)
    H, Hkv, n, Dh = 6, 2, 40, 8
    q = torch.randn(*lead, H, T, Dh, generator=g)
    k, v = torch.randn(*lead, Hkv, n, Dh, generator=g), torch.randn(*lead, Hkv, n, Dh, generator=g)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(3, -3), v.repeat_interleave(3, -3))
    assert torch.allclose(attend(q, k, v), ref, atol=1e-5)
    # query t sees keys 0..n-T+t: as a bool mask and as the additive float mask the model builds
    allowed = torch.arange(n)[None, :] <= torch.arange(T)[:, None] + n - T  # [T, n]
    ref = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, -3), v.repeat_interleave(3, -3), attn_mask=allowed
    )
    bias = torch.zeros(T, n).masked_fill(~allowed, float("-inf"))
    assert torch.allclose(attend(q, k, v, allowed), ref, atol=1e-5)
    assert torch.allclose(attend(q, k, v, bias), ref, atol=1e-5)


# ---- the shortlist itself ------------------------------------------------------------------------
def test_draft_vocab_validation_and_counts():
    v = DraftVocab.from_counts(Counter({5: 10, 7: 5, 9: 1}), 2, 20, source={"data": "x"})
    assert v.ids == (5, 7) and v.coverage == pytest.approx(15 / 16)
    assert v.with_tokens([9, 5, 99, -1]).tolist() == [
        5,
        7,
        9,
    ]  # out-of-range prompt ids are skipped
    for bad, msg in (((), "empty"), ((1, 1), "repeated"), ((3, 20), "outside")):
        with pytest.raises(ThorError, match=msg):
            DraftVocab(bad, 20)
    with pytest.raises(ThorError, match="size"):
        DraftVocab.from_counts(Counter({1: 1}), 0, 20)


def test_draft_vocab_roundtrip_and_refusals(tiny_llama, tmp_path):
    cfg = tiny_llama.cfg
    d = random_drafter(cfg, block_size=4, num_taps=2)
    d.draft_vocab = DraftVocab((3, 1, 2), cfg.vocab_size, 0.5)
    save_drafter(d, tmp_path)
    back = load_drafter(tmp_path, cfg)
    assert back.draft_vocab == d.draft_vocab
    # saving a drafter without a shortlist removes the stale one
    d.draft_vocab = None
    save_drafter(d, tmp_path)
    assert not (tmp_path / FILENAME).exists() and load_drafter(tmp_path, cfg).draft_vocab is None

    f = tmp_path / FILENAME
    DraftVocab((1, 2), cfg.vocab_size).save(tmp_path)
    with pytest.raises(ThorError, match="vocabulary of"):
        load_draft_vocab(tmp_path, cfg.vocab_size + 1)
    doc = json.loads(f.read_text())
    f.write_text(json.dumps({**doc, "ids": [1, 1]}))
    with pytest.raises(ThorError, match="repeated"):
        load_drafter(tmp_path, cfg)
    f.write_text(json.dumps({**doc, "format": "other"}))
    with pytest.raises(ThorError, match="not a draft vocabulary"):
        load_drafter(tmp_path, cfg)


# ---- the proposer with a shortlist ---------------------------------------------------------------
def _drafter_with_vocab(loaded, ids):
    d = random_drafter(loaded.cfg, block_size=5, num_taps=2, seed=3)
    d.draft_vocab = DraftVocab(tuple(ids), loaded.cfg.vocab_size)
    return d


def test_shortlist_head_scores_the_same_logits(tiny_llama):
    m = tiny_llama.model
    d = random_drafter(tiny_llama.cfg, block_size=5, num_taps=2, seed=3).bind_target(
        m.embed_w, m.lm_head
    )
    ids = torch.tensor([4, 9, 17, 30])
    full = d.draft_block(None, 5, 10, 4)  # [4, V]
    sub = d.draft_block(None, 5, 10, 4, head=m.lm_head[ids])  # [4, 4]
    assert torch.allclose(full[:, ids], sub, atol=1e-5)


@pytest.mark.parametrize("bf16_cpu", [False, True])
def test_shortlist_greedy_equals_plain_and_drafts_stay_inside(tiny_llama, bf16_cpu, monkeypatch):
    """On a CPU with bf16 arithmetic the drafter beside an fp32 target drafts in bf16 (the rule
    reads the CPU flags: both kinds run here whatever this CPU is); output stays plain's."""
    import thor_runtime.speculative.dflash as dflash_mod

    monkeypatch.setattr(dflash_mod, "cpu_bf16", lambda: bf16_cpu)
    rt, tok = Runtime(tiny_llama.model, tiny_llama.tokenizer), tiny_llama.tokenizer
    prompt = tok.encode_chat([{"role": "user", "content": "stack the red block on the blue one"}])
    plain = rt.generate(prompt, SamplingParams(max_tokens=24)).token_ids
    # the shortlist holds the plain output's tokens, so the drafter can be right
    short = sorted(set(plain))[: max(1, len(set(plain)) // 2)]
    p = DFlashProposer(_drafter_with_vocab(tiny_llama, short), tiny_llama.model, window=16)
    assert p.drafter.dtype == (torch.bfloat16 if bf16_cpu else torch.float32)
    seen = []
    inner = p.propose
    p.propose = lambda seq, k: (lambda out: (seen.extend(out[0]), out)[1])(inner(seq, k))
    spec = rt.generate(
        prompt, SamplingParams(max_tokens=24), speculation=Speculation(p, 4, DraftBudget())
    )
    assert spec.token_ids == plain
    allowed = set(short) | set(prompt)
    assert seen and set(seen) <= allowed
    # full_vocab ignores the shortlist
    assert (
        DFlashProposer(
            _drafter_with_vocab(tiny_llama, short), tiny_llama.model, full_vocab=True
        ).vocab
        is None
    )


def test_shortlist_sampling_probs_are_full_width(tiny_llama):
    short = (2, 5, 11, 40)
    p = DFlashProposer(
        _drafter_with_vocab(tiny_llama, short),
        tiny_llama.model,
        window=8,
        sample_probs=True,
        seed=0,
    )
    p.start([7, 8, 9], None)
    drafts, q = p.propose([7, 8, 9, 12], 3)  # the anchor (first generated token) last
    V = tiny_llama.cfg.vocab_size
    assert q.shape == (3, V) and torch.allclose(q.sum(-1), torch.ones(3), atol=1e-5)
    outside = torch.ones(V, dtype=torch.bool)
    outside[list(set(short) | {7, 8, 9})] = False
    assert (q[:, outside] == 0).all() and set(drafts) <= set(short) | {7, 8, 9}
    assert all(q[j, t] > 0 for j, t in enumerate(drafts))


def test_bf16_arithmetic_read_from_the_cpu_flags():
    from thor_runtime.device import cpu_bf16, cpu_flags

    zen4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
    zen3 = "processor\t: 0\nflags\t\t: fpu avx2 fma\n"
    neoverse_v2 = "processor\t: 0\nFeatures\t: fp asimd sve2 bf16 i8mm\n"
    cortex_a78 = "processor\t: 0\nFeatures\t: fp asimd asimddp\n"
    assert "avx512_vnni" in cpu_flags(zen4) and cpu_flags("no flags here") == frozenset()
    assert (
        cpu_bf16(zen4) and cpu_bf16(neoverse_v2) and not cpu_bf16(zen3) and not cpu_bf16(cortex_a78)
    )
