"""The prefix cache: a prompt that starts like a recent one prefills only the rest, and decodes
to the same tokens as without it (the same guarantee as chunked prefill)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from thor_runtime.cache.kv_cache import KVCache, KVScales
from thor_runtime.cache.prefix_cache import PrefixCache
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative import SpecOptions, build_speculation

GREEDY = SamplingParams(max_tokens=12)


def _prompts(vocab: int, shared: int = 48) -> tuple[list[int], list[int], list[int]]:
    g = torch.Generator().manual_seed(3)
    head = torch.randint(5, vocab, (shared,), generator=g).tolist()
    return (
        head + torch.randint(5, vocab, (9,), generator=g).tolist(),
        head + torch.randint(5, vocab, (6,), generator=g).tolist(),
        torch.randint(5, vocab, (40,), generator=g).tolist(),
    )


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
@pytest.mark.parametrize("which", ["tiny_llama", "tiny_qwen3"])
def test_a_shared_start_is_reused_and_changes_no_token(which, kv, request):
    m = request.getfixturevalue(which)
    a, b, other = _prompts(m.model.cfg.vocab_size)
    cold = Runtime(m.model, m.tokenizer, kv_dtype=kv)
    for spec in ("none", "ngram"):
        warm = Runtime(m.model, m.tokenizer, kv_dtype=kv, prefix_cache=2)
        sp = build_speculation(SpecOptions(method=spec), m.model)
        warm.generate(a, GREEDY, sp)
        r = warm.generate(b, GREEDY, sp)
        assert r.stats.cached_prompt_tokens == 48  # the start a and b share
        assert r.token_ids == cold.generate(b, GREEDY, sp).token_ids
        # nothing in common: prefilled whole, same tokens
        r = warm.generate(other, GREEDY, sp)
        assert (
            r.stats.cached_prompt_tokens == 0
            and r.token_ids == cold.generate(other, GREEDY, sp).token_ids
        )
        # the same prompt again: everything but the last row comes from the cache
        assert warm.generate(b, GREEDY, sp).stats.cached_prompt_tokens == len(b) - 1


def test_restored_rows_equal_a_chunked_prefill(tiny_llama):
    """The cache holds the same bytes as a prefill in two chunks split at the shared start."""
    m = tiny_llama.model
    a, b, _ = _prompts(m.cfg.vocab_size)
    pc = PrefixCache(entries=1)
    first = KVCache(m.cfg, len(a), "fp8", m.dtype)
    m.prefill(torch.tensor(a), first)
    pc.store(a, first)
    warm = KVCache(m.cfg, len(b), "fp8", m.dtype)
    n = pc.restore(b, warm, len(b) - 1)
    out = m.prefill(torch.tensor(b[n:]), warm)
    chunked = KVCache(m.cfg, len(b), "fp8", m.dtype)
    m.prefill(torch.tensor(b[:n]), chunked)
    ref = m.prefill(torch.tensor(b[n:]), chunked)
    assert n == 48 and torch.equal(warm.k, chunked.k) and torch.equal(warm.v, chunked.v)
    assert torch.equal(out.logits, ref.logits)


def test_entries_are_copies_least_recently_used_goes_first(tiny_llama):
    m = tiny_llama.model
    pc = PrefixCache(entries=2, min_tokens=4)
    caches = {}
    for name, ids in (("x", [7] * 10), ("y", [8] * 10), ("z", [9] * 10)):
        c = KVCache(m.cfg, 12, "fp32", m.dtype)
        m.prefill(torch.tensor(ids), c)
        caches[name] = c
        pc.store(ids, c)
    assert len(pc) == 2
    caches["y"].k.zero_()  # the running sequence's cache is not the entry
    target = KVCache(m.cfg, 12, "fp32", m.dtype)
    assert pc.restore([7] * 10, target, 9) == 0  # x went first
    assert pc.restore([8] * 10, target, 9) == 9 and target.k[:, :, :9].abs().sum() > 0
    target.crop(0)
    assert pc.restore([8, 8, 8, 1], target, 3) == 0  # under min_tokens
    with pytest.raises(ValueError, match="another model, KV dtype or scales"):
        KVCache(m.cfg, 12, "fp8", m.dtype).load_prefix(caches["x"], 4)
    other = KVScales(
        torch.full_like(KVScales.unit(m.cfg).k, 2.0), torch.ones_like(KVScales.unit(m.cfg).v)
    )
    with pytest.raises(ValueError):
        KVCache(m.cfg, 12, "fp32", m.dtype, other).load_prefix(caches["x"], 4)


class _Seeded:
    """A proposer whose window asks for the taps of the last 20 prompt rows; drafts nothing."""

    tap_layers, window = (0,), 20

    def start(self, ids, taps):
        self.taps = taps
        self.seed_taps = None if taps is None else taps[0].shape[0]

    def propose(self, seq, room):
        return [], None

    def commit(self, n, taps):
        pass


def test_drafter_seed_rows_come_from_an_entry_that_kept_them(tiny_llama):
    """The prompt tail whose taps seed the drafter's window is prefilled unless the entry holding
    the shared start kept the taps of those rows: then only the rows after the shared start run,
    and the window gets the same taps a whole prefill gives. An entry keeps TAP_MARGIN rows more
    than the window, so a prompt whose window starts a little earlier is covered too."""
    from thor_runtime.engine.generate import TAP_MARGIN

    m = tiny_llama.model
    rt = Runtime(m, tiny_llama.tokenizer, prefix_cache=2)
    a, b, _ = _prompts(m.cfg.vocab_size)  # 48 shared, then 9 and 6 of their own
    c = a[:48] + [
        int(t)
        for t in torch.randint(
            5, m.cfg.vocab_size, (12,), generator=torch.Generator().manual_seed(9)
        )
    ]
    p = _Seeded()
    sp = dataclasses.replace(build_speculation(SpecOptions(method="none"), m), proposer=p, k=4)
    assert len(a) - 20 - TAP_MARGIN <= 34
    rt.generate(a, GREEDY, sp)  # keeps the taps of a's rows from 57 - 20 - margin
    r = rt.generate(b, GREEDY, sp)  # b's seed rows start at 34: kept by the margin
    assert r.stats.cached_prompt_tokens == 48 and p.seed_taps == 20
    warm_b = p.taps[0]
    cold_b = Runtime(m, tiny_llama.tokenizer).generate(b, GREEDY, sp)
    assert torch.allclose(warm_b, p.taps[0], atol=1e-5) and cold_b.token_ids == r.token_ids
    rt.prefixes = PrefixCache(2)
    rt.generate(a, GREEDY)  # no drafter: its copy keeps no taps
    r = rt.generate(c, GREEDY, sp)  # c's seed rows start at 40: not kept
    assert r.stats.cached_prompt_tokens == 40 and p.seed_taps == 20
    warm_taps = p.taps[0]
    cold = Runtime(m, tiny_llama.tokenizer).generate(c, GREEDY, sp)  # no cache: all 60 rows run
    cold_taps = p.taps[0]
    assert torch.allclose(warm_taps, cold_taps, atol=1e-5) and cold.token_ids == r.token_ids


def test_hybrid_targets_keep_no_prefixes(tmp_path):
    from tests.helpers.tiny_hybrid import make_hybrid_dir
    from thor_runtime.loading import load

    m = load(str(make_hybrid_dir(tmp_path / "h")))
    assert Runtime(m.model, m.tokenizer, prefix_cache=2).prefixes is None


@pytest.mark.slow
def test_plans_in_one_world_reuse_its_prompt_and_stay_the_same(default_model):
    """Two tasks in one world: the second prefills only what follows the shared system prompt,
    and both plans are the ones a cold runtime writes."""
    from agent.planner.planner import Planner
    from evals.plan_bench import plan_cases

    cases = [c for c in plan_cases() if c[0] == "kitchen"][:2]
    m = default_model
    warm = Planner(
        Runtime(m.model, m.tokenizer, prefix_cache=2), m.tokenizer, attempts=0, max_tokens=96
    )
    cold = Planner(Runtime(m.model, m.tokenizer), m.tokenizer, attempts=0, max_tokens=96)
    for i, (_, task, world, skills) in enumerate(cases):
        w = warm.plan(task, world, skills)
        assert w.text == cold.plan(task, world, skills).text
        shared = w.stats["cached_prompt_tokens"]
        assert (shared > 100) if i else shared == 0, (i, shared)


def test_the_taps_margin_survives_a_prompt_that_was_itself_restored(tiny_llama):
    """A prompt restored from an entry takes that entry's margin of taps along (not only its own
    seed rows'), so the prompt after it, whose seed starts a little earlier, is restored too."""
    m = tiny_llama.model
    rt = Runtime(m, tiny_llama.tokenizer, prefix_cache=2)
    a, b, _ = _prompts(m.cfg.vocab_size)  # 48 shared, then 9 and 6 of their own
    e = b[:52] + [b[3]]  # 52 shared with b, 48 with a; seed from 33
    p = _Seeded()
    sp = dataclasses.replace(build_speculation(SpecOptions(method="none"), m), proposer=p, k=4)
    rt.generate(a, GREEDY, sp)
    assert rt.generate(b, GREEDY, sp).stats.cached_prompt_tokens == 48
    r = rt.generate(e, GREEDY, sp)  # b kept a's taps from before its own seed
    assert r.stats.cached_prompt_tokens == 52 and p.seed_taps == 20
    warm = p.taps[0]
    cold = Runtime(m, tiny_llama.tokenizer).generate(e, GREEDY, sp)
    assert torch.allclose(warm, p.taps[0], atol=1e-5) and cold.token_ids == r.token_ids
