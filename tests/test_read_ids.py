"""Logits read by id: under a grammar, a verify on the row kernel computes only the logits of
the ids some row may commit (thor_runtime/constraint.py ``read_ids``). Each computed logit has
the bits the whole head gives it, so constrained decoding commits the same tokens, plain and
speculative, alone and in a shared round."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_grammar import PLAN_LIKE
from test_rowstep import _with_rows

from agent.grammar import Grammar
from thor_runtime import constraint as constraint_mod
from thor_runtime.batch_verify import VerifyCall, verify_many
from thor_runtime.constraint import masked, masked_argmax, read_ids
from thor_runtime.generate import Runtime
from thor_runtime.kv_cache import KVCache
from thor_runtime.rowstep import RowStep
from thor_runtime.sampling import SamplingParams
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer


def _cache(m, ids):
    c = KVCache(m.cfg, 64, "fp32", m.dtype)
    m.prefill(ids, c)
    return c


def test_read_ids_only_when_few():
    allowed = np.zeros((3, 320), bool)
    allowed[0, [5, 9]] = allowed[2, 9] = True
    assert read_ids(allowed).tolist() == [5, 9]
    allowed[1, :100] = True                      # a free-text row: every logit is read
    assert read_ids(allowed) is None
    assert read_ids(None) is None


def test_argmax_over_the_read_ids_is_the_masked_rows_argmax():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 3, (6, 2000), generator=gen).float()    # [6, 2000], many equal maxima
    allowed = np.zeros((6, 2000), bool)
    for r in range(6):
        allowed[r, np.random.default_rng(r).choice(2000, 5 + r, replace=False)] = True
    allowed[5] = False
    allowed[5, [0, 1999]] = True                                        # the ends of the vocabulary
    logits[5, [0, 1999]] = 9.0                                          # a tie between them: the first
    ids = read_ids(allowed)
    assert ids is not None
    want = masked(logits, allowed).argmax(-1)
    assert torch.equal(masked_argmax(logits, allowed, ids), want)
    assert int(want[5]) == 0


def test_logits_read_by_id_have_the_whole_heads_bits(tiny_llama):
    m = _with_rows(tiny_llama)
    V, unit = m.cfg.vocab_size, m.runner.rows.unit
    ids = torch.tensor(tiny_llama.tokenizer.encode("pick up the red cup and put it in the sink"))[:20]
    cols = np.array([3, 50, V - 1])
    whole = m.verify(ids[12:], _cache(m, ids[:12])).logits                       # [8, V]
    part = m.verify(ids[12:], _cache(m, ids[:12]), cols=cols).logits
    computed = torch.isfinite(part)                                               # [8, V]
    assert computed[:, cols].all() and torch.equal(part[:, cols], whole[:, cols])
    assert torch.equal(part[computed], whole[computed])
    units = np.unique(cols // unit)
    assert computed.sum(1).tolist() == [min(len(units) * unit, V)] * 8           # the rest was not computed
    # two sequences in one round, each reading its own ids: each gets its verify alone
    c1, c2 = _cache(m, ids[:12]), _cache(m, ids[:9])
    a, b = verify_many(m, m.verify, [VerifyCall(ids[12:16], c1, (), np.array([7])),
                                     VerifyCall(ids[9:14], c2, (), np.array([11, 12]))])
    alone = m.verify(ids[9:14], _cache(m, ids[:9])).logits
    assert torch.equal(a.logits[:, 7], whole[:4, 7])
    assert torch.equal(b.logits[:, [11, 12]], alone[:, [11, 12]])


def test_a_round_computes_each_sequences_own_logits(tiny_llama, monkeypatch):
    """One sequence reading every logit does not make its batch-mates' verifies compute the whole
    head: each gets the logits it reads with the bits of its verify alone, and the by-id one
    nothing else."""
    m = _with_rows(tiny_llama)
    V, unit = m.cfg.vocab_size, m.runner.rows.unit
    ids = torch.tensor(tiny_llama.tokenizer.encode("pick up the red cup and put it in the sink"))[:20]
    heads = []
    monkeypatch.setattr(RowStep, "_units", _recording(RowStep._units, heads))
    calls = [VerifyCall(ids[12:16], _cache(m, ids[:12])), VerifyCall(ids[9:14], _cache(m, ids[:9]), (), np.array([11, V - 1]))]
    heads.clear()
    full, part = verify_many(m, m.verify, calls)
    assert heads == [(None, 4), ((11 // unit, (V - 1) // unit), 5)]       # one full head of 4 rows, one of 5 by id
    assert torch.equal(full.logits, m.verify(ids[12:16], _cache(m, ids[:12])).logits)
    alone = m.verify(ids[9:14], _cache(m, ids[:9])).logits                      # [5, V]
    assert torch.equal(part.logits[:, [11, V - 1]], alone[:, [11, V - 1]])
    computed = torch.isfinite(part.logits)
    assert computed.sum(1).tolist() == [_width(V, unit, [11, V - 1])] * 5


def test_a_sequence_longer_than_a_kernel_call_keeps_its_own_logits_and_taps(tiny_llama):
    """A verify of more rows than one kernel call takes (a long run of forced tokens) spans two
    calls of the round; its logits and taps come back whole and in order, beside a batch-mate
    that reads every logit."""
    from thor_runtime.rowstep import MAX_ROWS

    m = _with_rows(tiny_llama)
    V = m.cfg.vocab_size
    ids = torch.arange(3, 3 + MAX_ROWS + 20) % V
    n = MAX_ROWS + 6

    def cache(k):
        c = KVCache(m.cfg, MAX_ROWS + 24, "fp32", m.dtype)
        m.prefill(ids[:k], c)
        return c

    cols = np.array([5, V - 2])
    long, short = verify_many(m, m.verify, [VerifyCall(ids[4:4 + n], cache(4), (0,), cols),
                                            VerifyCall(ids[2:5], cache(2), (0,))])
    alone_long = m.verify(ids[4:4 + n], cache(4), taps=(0,))
    alone_short = m.verify(ids[2:5], cache(2), taps=(0,))
    assert long.logits.shape == (n, V) and torch.equal(long.logits[:, cols], alone_long.logits[:, cols])
    assert torch.equal(long.taps[0], alone_long.taps[0])
    assert torch.equal(short.logits, alone_short.logits) and torch.equal(short.taps[0], alone_short.taps[0])


def _recording(units, seen):
    def record(self, cols, R):
        seen.append((None if cols is None else tuple(np.unique(np.asarray(cols) // self.unit).tolist()), R))
        return units(self, cols, R)
    return record


def _width(V: int, unit: int, cols: list[int]) -> int:
    """ids in the units that hold ``cols`` (the last unit may be short)."""
    return sum(min(u * unit + unit, V) - u * unit for u in sorted({c // unit for c in cols}))


def test_constrained_decoding_reads_few_logits_and_commits_the_same(tiny_llama, gtok, monkeypatch):
    m = _with_rows(tiny_llama)
    tok = tiny_llama.tokenizer
    rt = Runtime(m, tok)
    g = Grammar(gtok, PLAN_LIKE)
    ids = tok.encode("pick up the red cup")
    params = SamplingParams(max_tokens=80)
    seen = []
    units = RowStep._units
    monkeypatch.setattr(RowStep, "_units", lambda self, cols, R: seen.append(cols is not None) or units(self, cols, R))

    def run(spec):
        return rt.generate(ids, params, speculation=spec, constraint=g.constraint()).token_ids

    specs = [Speculation(), Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget())]
    by_id = [run(s) for s in specs]
    assert any(seen), "no verify read its logits by id"
    monkeypatch.setattr(constraint_mod, "READ_SHARE", 0.0)        # every logit, every verify
    seen.clear()
    whole = [run(s) for s in specs]
    assert not any(seen)
    assert by_id == whole and whole[0] == whole[1]
