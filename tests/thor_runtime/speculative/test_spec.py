"""Speculative cycle: greedy output token-identical to plain decoding; stops inside spans."""

from __future__ import annotations

import pytest

from tests.helpers.tiny import proposer_and_k, random_drafter
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.base import Proposer
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer

PROMPTS = [
    "pick up the red cup and place it on the table. pick up the red cup and place it on the",
    '{"steps": [{"id": "s1", "skill": "pick", "args": {"object": "cup"}}, {"id": "s2", "skill": "',
    "move",
]


class Scripted(Proposer):
    """Drafts from a script: the true greedy continuation (all accepted), or garbage."""

    name = "scripted"

    def __init__(
        self, truth: list[int], prompt_len: int, garbage: int | None = None, cut: int | None = None
    ):
        self.truth, self.plen, self.garbage, self.cut = truth, prompt_len, garbage, cut

    def propose(self, seq, k):
        done = len(seq) - self.plen  # tokens generated so far
        if self.garbage is not None:
            return [self.garbage] * k, None
        drafts = self.truth[done : done + k]
        if self.cut is not None and len(drafts) > self.cut:  # wrong from position `cut` on
            drafts = drafts[: self.cut] + [(drafts[self.cut] + 1) % 50] + drafts[self.cut + 1 :]
        return drafts, None


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_ngram_greedy_identical_tiny(arch, kv, request):
    loaded = request.getfixturevalue(f"tiny_{arch}")
    rt = Runtime(loaded.model, loaded.tokenizer, kv_dtype=kv)
    for prompt in PROMPTS:
        ids = loaded.tokenizer.encode(prompt)
        params = SamplingParams(max_tokens=128, ignore_eos=True)
        plain = rt.generate(ids, params)
        spec = rt.generate(
            ids,
            params,
            speculation=Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget()),
        )
        assert spec.token_ids == plain.token_ids
        assert spec.stats.cycles < plain.stats.cycles or spec.stats.accepted == 0


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_ngram_greedy_identical_default(default_model, kv):
    """Identical with fp32 KV and with fp8 KV: no tolerance (TargetModel.verify is exact)."""
    tok = default_model.tokenizer
    rt = Runtime(default_model.model, tok, kv_dtype=kv)
    for prompt in [
        "List the steps to pick up a cup, then repeat the list exactly.",
        'Return JSON {"skill": "pick", "object": "cup"} three times.',
    ]:
        ids = tok.encode_chat([{"role": "user", "content": prompt}])
        params = SamplingParams(max_tokens=128, ignore_eos=True)
        plain = rt.generate(ids, params)
        spec = rt.generate(ids, params, speculation=Speculation(NgramProposer(), 8, DraftBudget()))
        assert spec.token_ids == plain.token_ids
        assert spec.stats.accepted > 0


def _truth(rt, ids, n=40):
    return rt.generate(ids, SamplingParams(max_tokens=n, ignore_eos=True)).token_ids


def test_all_accepted_and_all_rejected(tiny_llama):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    ids = tiny_llama.tokenizer.encode(PROMPTS[0])
    truth = _truth(rt, ids)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    good = rt.generate(
        ids, params, speculation=Speculation(Scripted(truth, len(ids)), 4, DraftBudget())
    )
    assert good.token_ids == truth
    assert good.stats.accepted == good.stats.drafted  # every draft kept
    # K + 1 per cycle, bar the first (the budget starts a request at low_k = 2) and the tail
    assert good.stats.to_dict()["accept_length_mean"] > 4.0
    bad_token = next(t for t in range(50) if t not in truth)
    bad = rt.generate(
        ids,
        params,
        speculation=Speculation(Scripted(truth, len(ids), garbage=bad_token), 4, DraftBudget()),
    )
    assert bad.token_ids == truth and bad.stats.accepted == 0
    assert bad.stats.cycles == len(truth) - 1
    mid = rt.generate(
        ids, params, speculation=Speculation(Scripted(truth, len(ids), cut=2), 4, DraftBudget())
    )
    assert mid.token_ids == truth
    assert mid.stats.to_dict()["accept_per_position"][:3] == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("eos_pos", [0, 2, 3])  # first, a middle and the last of K = 4 drafts
def test_eos_inside_an_accepted_span(tiny_llama, eos_pos):
    tok = tiny_llama.tokenizer
    rt = Runtime(tiny_llama.model, tok)
    # The first cycle drafts truth[1:5]; make the token at that draft position the EOS
    # (a prompt whose greedy output does not use that token earlier).
    gen = __import__("torch").Generator().manual_seed(0)
    for _ in range(50):
        ids = __import__("torch").randint(5, 300, (6,), generator=gen).tolist()
        truth = _truth(rt, ids)
        eos = truth[1 + eos_pos]
        if eos not in truth[: 1 + eos_pos]:
            break
    else:
        raise AssertionError("no prompt gives a fresh token at that position")
    saved = tok.eos_token_ids
    try:
        tok.eos_token_ids = (eos,)
        plain = rt.generate(ids, SamplingParams(max_tokens=40))
        spec = rt.generate(
            ids,
            SamplingParams(max_tokens=40),
            speculation=Speculation(Scripted(truth, len(ids)), 4, DraftBudget()),
        )
    finally:
        tok.eos_token_ids = saved
    assert plain.finish_reason == spec.finish_reason == "eos"
    assert spec.token_ids == plain.token_ids == truth[: 2 + eos_pos]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7])
def test_max_tokens_mid_span(tiny_llama, max_tokens):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    ids = tiny_llama.tokenizer.encode(PROMPTS[0])
    truth = _truth(rt, ids)
    spec = rt.generate(
        ids,
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        speculation=Speculation(Scripted(truth, len(ids)), 5, DraftBudget()),
    )
    assert spec.token_ids == truth[:max_tokens] and spec.finish_reason == "length"


def test_stop_string_inside_span(tiny_llama):
    tok = tiny_llama.tokenizer
    rt = Runtime(tiny_llama.model, tok)
    ids = tok.encode(PROMPTS[1])
    truth = _truth(rt, ids)
    stop = tok.decode(truth)[6:9]
    params = SamplingParams(max_tokens=40, ignore_eos=True, stop=(stop,))
    plain = rt.generate(ids, params)
    spec = rt.generate(
        ids, params, speculation=Speculation(Scripted(truth, len(ids)), 6, DraftBudget())
    )
    assert (
        spec.token_ids == plain.token_ids
        and spec.text == plain.text
        and plain.finish_reason == "stop"
    )


def test_one_token_prompt(tiny_llama):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    ids = tiny_llama.tokenizer.encode("move")[:1]
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    assert (
        rt.generate(
            ids, params, speculation=Speculation(NgramProposer(), 8, DraftBudget())
        ).token_ids
        == rt.generate(ids, params).token_ids
    )


def test_ngram_proposer_finds_latest_longest_match():
    p = NgramProposer(NgramConfig(1, 3, 4))
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert p.propose(seq, 4)[0] == [7, 8, 5, 1]
    assert p.propose([4, 5, 6], 4)[0] == []
    assert p.propose(seq, 2)[0] == [7, 8]


def test_int8_weights_close_to_fp32_and_spec_identical(tiny_dirs):
    """int8 weight-only mode: logits near fp32's, and greedy ngram speculation still equals
    plain decoding in that mode (the verify rows use the same int8 kernel as decode)."""
    import torch

    from thor_runtime.cache.kv_cache import KVCache
    from thor_runtime.loading import load

    a, b = load(str(tiny_dirs["llama"])), load(str(tiny_dirs["llama"]), "int8")
    assert b.model.dtype == torch.bfloat16 and b.model.layers[0].wqkv.q.dtype == torch.int8
    ids = a.tokenizer.encode(PROMPTS[0])
    la = a.model.forward(torch.tensor(ids), KVCache(a.cfg, 64)).logits
    lb = b.model.forward(torch.tensor(ids), KVCache(b.cfg, 64, compute_dtype=torch.bfloat16)).logits
    assert float((la - lb).norm() / la.norm()) < 0.05
    rt = Runtime(b.model, b.tokenizer, kv_dtype="bf16")
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    plain = rt.generate(ids, params)
    assert (
        rt.generate(
            ids,
            params,
            speculation=Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget()),
        ).token_ids
        == plain.token_ids
    )


def test_auto_spec_picks_the_shipped_drafter_only_for_its_target(
    default_model, tiny_llama, tmp_path
):
    from thor_runtime.speculative import SpecOptions
    from thor_runtime.speculative.combined import CombinedProposer
    from thor_runtime.speculative.dflash import DFlashProposer
    from thor_runtime.speculative.dflash_io import save_drafter

    p, k = proposer_and_k(SpecOptions(method="auto"), default_model.model)
    assert isinstance(p, CombinedProposer) and isinstance(p.dflash, DFlashProposer)
    assert k == p.dflash.block_size - 1
    p, _ = proposer_and_k(SpecOptions(method="auto"), tiny_llama.model)  # trained for another model
    assert isinstance(p, NgramProposer)
    # the same target with low-bit weights: the drafter's fp32 taps do not hold, lookup runs
    from types import SimpleNamespace

    from thor_runtime.speculative import shipped_drafter_fits, weights_kind

    m = default_model.model
    assert weights_kind(m) == "fp32" and shipped_drafter_fits(m)
    for quant in ("int4", "int8"):
        low = SimpleNamespace(cfg=m.cfg, quant=quant, dtype=m.dtype)
        assert weights_kind(low) == quant and not shipped_drafter_fits(low)
        assert isinstance(proposer_and_k(SpecOptions(method="auto"), low)[0], NgramProposer)
    import torch

    bf16 = SimpleNamespace(cfg=m.cfg, quant=None, dtype=torch.bfloat16)
    assert weights_kind(bf16) == "bf16" and not shipped_drafter_fits(bf16)
    # under auto's cost policy free text looks up matches of 2+ tokens as ngram does (the policy
    # pauses drafts that do not pay); with --fixed-k (no policy) only matches of 3+
    from thor_runtime.speculative import build_speculation

    for target in (m, low):
        sp = build_speculation(SpecOptions(method="auto"), target)
        assert sp.free_text is not None and sp.free_text.proposer.cfg.min_n == 2
        fixed = build_speculation(SpecOptions(method="auto", fixed_k=True), target)
        assert fixed.free_text.proposer.cfg.min_n == 3
    assert build_speculation(SpecOptions(method="auto"), low).proposer.cfg.min_n == 2
    assert build_speculation(SpecOptions(method="ngram"), m).free_text is None
    save_drafter(random_drafter(tiny_llama.cfg, block_size=4, num_taps=2), tmp_path)
    p, k = proposer_and_k(SpecOptions(method="auto", drafter=str(tmp_path)), tiny_llama.model)
    assert isinstance(p, CombinedProposer) and k == 3
    p, k = proposer_and_k(SpecOptions(method="dflash", drafter=str(tmp_path)), tiny_llama.model)
    assert isinstance(p, DFlashProposer) and k == 3
