"""Logits read by id: under a grammar, a verify on the row kernel computes only the logits of
the ids some row may commit (thor_runtime/engine/constraint.py ``read_ids``). Each computed logit
has the bits the whole head gives it, so constrained decoding commits the same tokens, plain and
speculative, alone and in a shared round."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent.schema.grammar import Grammar
from tests.helpers.lowbit import with_rows
from tests.helpers.schemas import PLAN_LIKE
from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.engine import constraint as constraint_mod
from thor_runtime.engine.batch_verify import VerifyCall, verify_many
from thor_runtime.engine.constraint import RowReads, masked, masked_argmax, read_ids
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.kernels.rowstep import RowStep
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
    allowed[1, :100] = True  # a free-text row: that row reads every logit
    reads = read_ids(allowed)
    assert isinstance(reads, RowReads)
    assert reads.ids.tolist() == [5, 9] and reads.wide.tolist() == [False, True, False]
    assert reads.part(1, 3).wide.tolist() == [True, False] and reads.part(1, 3).ids.tolist() == [
        5,
        9,
    ]
    allowed[[0, 2], :100] = True  # every row free text: every logit of every row
    assert read_ids(allowed) is None
    allowed = np.zeros((3, 320), bool)
    allowed[0, :8] = allowed[1, 8:16] = True  # few on each row (at most 320 / 16 = 20 read)
    assert read_ids(allowed).tolist() == list(range(16))
    allowed[2, 16:24] = True  # and too many together
    assert read_ids(allowed) is None
    assert read_ids(None) is None


def _argmax_cases():
    """(logits [6, 2000], allowed, reads) with many equal maxima: narrow rows only, then two rows
    inside a string, one whose first maximum is allowed and one whose is not; then every row
    inside one (every logit read: reads None)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 3, (6, 2000), generator=gen).float()  # [6, 2000], many equal maxima
    allowed = np.zeros((6, 2000), bool)
    for r in range(6):
        allowed[r, np.random.default_rng(r).choice(2000, 5 + r, replace=False)] = True
    allowed[5] = False
    allowed[5, [0, 1999]] = True  # the ends of the vocabulary
    logits[5, [0, 1999]] = 9.0  # a tie between them: the first
    ids = read_ids(allowed)
    assert ids is not None
    yield logits, allowed.copy(), ids
    allowed[[1, 4], 100:1900] = True  # two rows inside a string
    logits[4, 1500] = 50.0  # beyond the narrow rows' ids
    # row 4's first maximum is allowed (taken as it is), row 1's is not (the row masked, ties kept)
    assert allowed[4, int(logits[4].argmax())] and not allowed[1, int(logits[1].argmax())]
    reads = read_ids(allowed)
    assert isinstance(reads, RowReads) and reads.wide.tolist() == [
        False,
        True,
        False,
        False,
        True,
        False,
    ]
    yield logits, allowed, reads
    allowed[:, 100:1900] = True  # every row inside a string
    assert read_ids(allowed) is None
    yield logits, allowed, None


def test_argmax_over_the_read_ids_is_the_masked_rows_argmax():
    wants = []
    for logits, allowed, reads in _argmax_cases():
        want = masked(logits, allowed).argmax(-1)
        assert torch.equal(masked_argmax(logits, allowed, reads), want)
        wants.append(want)
    assert int(wants[0][5]) == 0 and int(wants[1][4]) == 1500


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: run `make test-gpu` on a GPU"
)
def test_argmax_over_the_read_ids_on_a_gpu_is_the_cpus():
    """Logits on a GPU take the other path (only the columns and rows read cross to the host)."""
    for logits, allowed, reads in _argmax_cases():
        assert torch.equal(
            masked_argmax(logits.cuda(), allowed, reads), masked_argmax(logits, allowed, reads)
        )


def test_logits_read_by_id_have_the_whole_heads_bits(tiny_llama):
    m = with_rows(tiny_llama)
    V, unit = m.cfg.vocab_size, m.runner.rows.unit
    ids = torch.tensor(tiny_llama.tokenizer.encode("pick up the red cup and put it in the sink"))[
        :20
    ]
    cols = np.array([3, 50, V - 1])
    whole = m.verify(ids[12:], _cache(m, ids[:12])).logits  # [8, V]
    part = m.verify(ids[12:], _cache(m, ids[:12]), cols=cols).logits
    computed = torch.isfinite(part)  # [8, V]
    assert computed[:, cols].all() and torch.equal(part[:, cols], whole[:, cols])
    assert torch.equal(part[computed], whole[computed])
    units = np.unique(cols // unit)
    assert computed.sum(1).tolist() == [min(len(units) * unit, V)] * 8  # the rest was not computed
    # two sequences in one round, each reading its own ids: each gets its verify alone
    c1, c2 = _cache(m, ids[:12]), _cache(m, ids[:9])
    a, b = verify_many(
        m,
        m.verify,
        [
            VerifyCall(ids[12:16], c1, (), np.array([7])),
            VerifyCall(ids[9:14], c2, (), np.array([11, 12])),
        ],
    )
    alone = m.verify(ids[9:14], _cache(m, ids[:9])).logits
    assert torch.equal(a.logits[:, 7], whole[:4, 7])
    assert torch.equal(b.logits[:, [11, 12]], alone[:, [11, 12]])


def test_a_round_computes_each_sequences_own_logits(tiny_llama, monkeypatch):
    """One sequence reading every logit does not make its batch-mates' verifies compute the whole
    head: each gets the logits it reads with the bits of its verify alone, and the by-id one
    nothing else."""
    m = with_rows(tiny_llama)
    V, unit = m.cfg.vocab_size, m.runner.rows.unit
    ids = torch.tensor(tiny_llama.tokenizer.encode("pick up the red cup and put it in the sink"))[
        :20
    ]
    heads = []
    monkeypatch.setattr(RowStep, "_heads", _recording(RowStep._heads, heads))
    calls = [
        VerifyCall(ids[12:16], _cache(m, ids[:12])),
        VerifyCall(ids[9:14], _cache(m, ids[:9]), (), np.array([11, V - 1])),
    ]
    heads.clear()
    full, part = verify_many(m, m.verify, calls)
    assert heads == [
        [((11 // unit, (V - 1) // unit), 5), (None, 4)]
    ]  # one head of 5 rows by id, one full of 4
    assert torch.equal(full.logits, m.verify(ids[12:16], _cache(m, ids[:12])).logits)
    alone = m.verify(ids[9:14], _cache(m, ids[:9])).logits  # [5, V]
    assert torch.equal(part.logits[:, [11, V - 1]], alone[:, [11, V - 1]])
    computed = torch.isfinite(part.logits)
    assert computed.sum(1).tolist() == [_width(V, unit, [11, V - 1])] * 5


def test_a_sequence_longer_than_a_kernel_call_keeps_its_own_logits_and_taps(tiny_llama):
    """A verify of more rows than one kernel call takes (a long run of forced tokens) spans two
    calls of the round; its logits and taps come back whole and in order, beside a batch-mate
    that reads every logit."""
    from thor_runtime.kernels.rowstep import MAX_ROWS

    m = with_rows(tiny_llama)
    V = m.cfg.vocab_size
    ids = torch.arange(3, 3 + MAX_ROWS + 20) % V
    n = MAX_ROWS + 6

    def cache(k):
        c = KVCache(m.cfg, MAX_ROWS + 24, "fp32", m.dtype)
        m.prefill(ids[:k], c)
        return c

    cols = np.array([5, V - 2])
    long, short = verify_many(
        m,
        m.verify,
        [VerifyCall(ids[4 : 4 + n], cache(4), (0,), cols), VerifyCall(ids[2:5], cache(2), (0,))],
    )
    alone_long = m.verify(ids[4 : 4 + n], cache(4), taps=(0,))
    alone_short = m.verify(ids[2:5], cache(2), taps=(0,))
    assert long.logits.shape == (n, V) and torch.equal(
        long.logits[:, cols], alone_long.logits[:, cols]
    )
    assert torch.equal(long.taps[0], alone_long.taps[0])
    assert torch.equal(short.logits, alone_short.logits) and torch.equal(
        short.taps[0], alone_short.taps[0]
    )


def _recording(plan, seen):
    """RowStep._heads that notes each call's heads: [(units or None: all, rows)]."""

    def record(self, cols, T, want):
        heads, logits = plan(self, cols, T, want)
        seen.append([(None if u is None else tuple(u.tolist()), len(r)) for r, _, u in heads])
        return heads, logits

    return record


def test_rows_inside_a_string_read_every_logit_and_the_others_their_ids(tiny_llama, monkeypatch):
    """A verify whose rows 2 and 5 lie inside a string (they read every logit) and whose others
    read a few ids: one head over all ids for those two rows, one over the few for the rest, both
    into the rows of one logits array, each logit with the bits the whole head gives it. Alone
    and beside a batch-mate reading other ids."""
    m = with_rows(tiny_llama)
    V, unit = m.cfg.vocab_size, m.runner.rows.unit
    ids = torch.tensor(tiny_llama.tokenizer.encode("pick up the red cup and put it in the sink"))[
        :20
    ]
    wide = np.zeros(8, bool)
    wide[[2, 5]] = True
    reads = RowReads(np.array([3, 50, V - 1]), wide)
    heads = []
    monkeypatch.setattr(RowStep, "_heads", _recording(RowStep._heads, heads))
    whole = m.verify(ids[12:], _cache(m, ids[:12])).logits  # [8, V]
    c = _cache(m, ids[:12])
    heads.clear()
    part = m.verify(ids[12:], c, cols=reads).logits
    narrow_units = tuple(np.unique(reads.ids // unit).tolist())
    assert heads == [[(narrow_units, 6), (None, 2)]]
    computed = torch.isfinite(part)  # [8, V]
    assert computed[wide].all() and torch.equal(part[wide], whole[wide])
    assert torch.equal(part[computed], whole[computed])
    assert computed[~wide].sum(1).tolist() == [_width(V, unit, reads.ids.tolist())] * 6
    # in a round: the string rows and the other sequence's full rows share the full head
    c1, c2 = _cache(m, ids[:12]), _cache(m, ids[:9])
    heads.clear()
    a, b = verify_many(
        m, m.verify, [VerifyCall(ids[12:], c1, (), reads), VerifyCall(ids[9:12], c2)]
    )
    assert heads == [[(narrow_units, 6), (None, 5)]]
    assert torch.equal(a.logits[computed], whole[computed]) and torch.isfinite(a.logits).equal(
        computed
    )
    assert torch.equal(b.logits, m.verify(ids[9:12], _cache(m, ids[:9])).logits)


def _width(V: int, unit: int, cols: list[int]) -> int:
    """ids in the units that hold ``cols`` (the last unit may be short)."""
    return sum(min(u * unit + unit, V) - u * unit for u in sorted({c // unit for c in cols}))


def test_constrained_decoding_reads_few_logits_and_commits_the_same(tiny_llama, gtok, monkeypatch):
    m = with_rows(tiny_llama)
    tok = tiny_llama.tokenizer
    rt = Runtime(m, tok)
    g = Grammar(gtok, PLAN_LIKE)
    ids = tok.encode("pick up the red cup")
    params = SamplingParams(max_tokens=80)
    seen = []
    monkeypatch.setattr(RowStep, "_heads", _recording(RowStep._heads, seen))

    def run(spec):
        return rt.generate(ids, params, speculation=spec, constraint=g.constraint()).token_ids

    specs = [Speculation(), Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget())]
    by_id = [run(s) for s in specs]
    assert any(u is not None for hs in seen for u, _ in hs), "no verify read its logits by id"
    assert any(len(hs) == 2 for hs in seen), "no verify had rows inside a string beside others"
    monkeypatch.setattr(constraint_mod, "READ_SHARE", 0.0)  # every logit, every verify
    seen.clear()
    whole = [run(s) for s in specs]
    assert all(u is None for hs in seen for u, _ in hs)
    assert by_id == whole and whole[0] == whole[1]
