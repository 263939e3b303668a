"""In-flight batching (thor_runtime/engine/inflight.py, batch_verify.py): the verifies of several
sequences as one forward give each sequence the bits its verify alone gives, on every batched
form (the layer path, the row kernel); and sequences generated at once from several threads
commit exactly what each commits alone — plain, speculative, constrained — while their
rounds really are shared."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from tests.helpers.exactness import PROMPT
from tests.helpers.tiny import random_drafter
from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.engine.batch_verify import VerifyCall, verify_many
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.inflight import FairLock, StepBatch
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.kernels.lowbit_kernels import int4_kernels
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.ngram import NgramProposer

# (prompt tokens cached, rows verified) per sequence: 1-row steps, a verify, one wider than a
# chunk (17 > EXACT_ROWS), all at different positions
SHAPES = [(5, 1), (11, 3), (8, 17), (14, 1), (3, 6)]


def _row_model(tiny):
    from thor_runtime.engine.runner import attach
    from thor_runtime.loading.hf_weights import hf_weights
    from thor_runtime.models.dense import TargetModel

    if not int4_kernels()["ort"].available():
        pytest.skip("onnxruntime (the onnx extra) is not installed")
    m = attach(
        TargetModel(tiny.cfg, hf_weights(Path(tiny.source)), quant="int4", int4_kernel="ort")
    )
    if m.runner.rows is None:
        pytest.skip(f"the row kernel does not run here: {m.runner.rows_why}")
    return m


def _alone_vs_batch(model, ids, taps):
    """-> [(alone, batched)] per SHAPES entry: (ForwardOut, cache) after the same prefill."""
    runs = []
    for batched in (False, True):
        caches, calls = [], []
        for j, (cached, rows) in enumerate(SHAPES):
            seq = ids[j : j + cached + rows]
            cache = KVCache(model.cfg, cached + rows + 2, "fp32", model.dtype)
            model.prefill(seq[:cached], cache)
            caches.append(cache)
            calls.append(VerifyCall(seq[cached:], cache, taps if j % 2 == 0 else ()))
        outs = (
            verify_many(model, model.verify, calls)
            if batched
            else [model.verify(c.ids, c.cache, taps=c.taps) for c in calls]
        )
        runs.append(list(zip(outs, caches)))
    return list(zip(*runs))


def _assert_bits(pairs):
    for (a, ca), (b, cb) in pairs:
        assert torch.equal(a.logits, b.logits)
        assert a.taps.keys() == b.taps.keys() and all(
            torch.equal(a.taps[i], b.taps[i]) for i in a.taps
        )
        n = ca.length
        assert cb.length == n
        assert torch.equal(ca.k[:, :, :n], cb.k[:, :, :n]) and torch.equal(
            ca.v[:, :, :n], cb.v[:, :, :n]
        )


@pytest.mark.parametrize("which", ["tiny_llama", "tiny_qwen3"])
def test_layer_path_batch_is_each_verify_alone(request, which):
    loaded = request.getfixturevalue(which)
    ids = torch.tensor(loaded.tokenizer.encode(PROMPT))
    _assert_bits(_alone_vs_batch(loaded.model, ids, taps=(0, 1)))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_row_kernel_batch_is_each_verify_alone(request, arch):
    tiny = request.getfixturevalue(f"tiny_{arch}")
    m = _row_model(tiny)
    ids = torch.tensor(tiny.tokenizer.encode(PROMPT))
    assert {m.runner.pick(KVCache(m.cfg, 8, "fp32", m.dtype), 4, True).name} == {"rowstep"}
    _assert_bits(_alone_vs_batch(m, ids, taps=(0, 1)))


def test_a_call_past_the_context_fails_alone(tiny_llama):
    """A shared round where one call cannot run: that call raises, the others get their rows."""
    m = tiny_llama.model
    ids = torch.tensor(tiny_llama.tokenizer.encode(PROMPT))
    batch = StepBatch(m, m.verify, 4)
    ok = KVCache(m.cfg, 16, "fp32", m.dtype)
    m.prefill(ids[:6], ok)
    ref = KVCache(m.cfg, 16, "fp32", m.dtype)
    m.prefill(ids[:6], ref)
    full = KVCache(m.cfg, m.cfg.max_position_embeddings + 4, "fp32", m.dtype)
    full.lengths = [m.cfg.max_position_embeddings - 1] * m.cfg.num_layers
    with pytest.raises(ThorError, match="exceeds the model context"):
        verify_many(m, m.verify, [VerifyCall(ids[6:9], ok), VerifyCall(ids[:3], full)])
    ok.crop(6)
    errors, outs = [], []

    def bad():
        try:
            batch.verify(ids[:3], full)
        except ThorError as e:
            errors.append(e)

    with batch.member(), batch.member():
        t = threading.Thread(target=bad)
        t.start()
        outs.append(batch.verify(ids[6:9], ok))
        t.join()
    assert len(errors) == 1 and batch.rounds[2] == 1
    assert torch.equal(outs[0].logits, m.verify(ids[6:9], ref).logits)


def test_fair_lock_serves_in_order():
    lock, order, started = FairLock(), [], []
    with lock:
        threads = []
        for i in range(4):
            t = threading.Thread(
                target=lambda i=i: (
                    started.append(i),
                    lock.__enter__(),
                    order.append(i),
                    lock.__exit__(),
                )
            )
            threads.append(t)
            t.start()
            while len(started) <= i or lock._next <= i + 1:  # each asks before the next starts
                threading.Event().wait(0.001)
    for t in threads:
        t.join()
    assert order == [0, 1, 2, 3]


def _spec(kind, model):
    if kind == "none":
        return Speculation()
    if kind == "ngram":
        return Speculation(NgramProposer(), 4)
    if kind == "auto":  # lookup or plain per request, K per cycle from the cost curve
        from thor_runtime.speculative import SpecOptions, build_speculation

        return build_speculation(SpecOptions(method="auto"), model)
    d = random_drafter(model.cfg, block_size=5, seed=3)
    return Speculation(DFlashProposer(d, model, window=16), 4)


def _generate_all(rt, prompts, spec, constraint_for, concurrent):
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    if not concurrent:
        return [
            rt.generate(p, params, spec, constraint=constraint_for(i)).token_ids
            for i, p in enumerate(prompts)
        ]
    out, errors, go = [None] * len(prompts), [], threading.Barrier(len(prompts))

    def run(i):
        try:
            go.wait()
            out[i] = rt.generate(prompts[i], params, spec, constraint=constraint_for(i)).token_ids
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


@pytest.mark.parametrize("kind", ["none", "ngram", "dflash", "auto"])
@pytest.mark.parametrize("constrained", [False, True])
def test_sequences_at_once_commit_what_each_commits_alone(
    tiny_llama, gtok, kind, constrained, monkeypatch
):
    from agent.schema.grammar import Grammar
    from thor_runtime.speculative.auto import CostBudget

    shared_caps = []  # auto: the drafts it let ride in rounds shared with others
    real = CostBudget.cap_shared

    def recorded(self, k, state, forced, members):
        shared_caps.append(real(self, k, state, forced, members))
        return shared_caps[-1]

    monkeypatch.setattr(CostBudget, "cap_shared", recorded)

    m, tok = tiny_llama.model, tiny_llama.tokenizer
    words = [
        "the red mug",
        "a box of screws and bolts",
        "go to the dock",
        "pick the blue cup up now please",
    ]
    prompts = [tok.encode(f"{PROMPT} {w}") for w in words]
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 12}},
        "required": ["a"],
    }
    grammar = Grammar(gtok, schema) if constrained else None

    def constraint_for(i):
        return grammar.constraint() if grammar is not None and i % 2 == 0 else None

    spec = _spec(kind, m)
    alone = _generate_all(Runtime(m, tok), prompts, spec, constraint_for, concurrent=False)
    rt = Runtime(m, tok)
    rt.share(4)
    together = _generate_all(rt, prompts, spec, constraint_for, concurrent=True)
    assert together == alone
    assert max(rt.batch.rounds) > 1, rt.batch.rounds  # rounds were shared, not taken in turn
    assert bool(shared_caps) == (kind == "auto")  # auto chose its drafts per shared round


def test_which_rounds_share_a_forward(tiny_llama, tiny_qwen3_5):
    from thor_runtime.engine.batch_verify import shares

    m = tiny_llama.model
    assert shares(m, m.verify)
    assert not shares(
        m, lambda ids, cache, taps=(): m.verify(ids, cache, taps)
    )  # another decode owner's
    assert not shares(tiny_qwen3_5.model, tiny_qwen3_5.model.verify)  # recurrent state
    rt = Runtime(tiny_qwen3_5.model, tiny_qwen3_5.tokenizer)
    rt.share(4)
    assert (
        rt.batch is not None and not rt.batch.shared_forward
    )  # its rounds: one call after another


@pytest.mark.parametrize("kind", ["none", "ngram", "dflash"])
@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_fixed_shape_slots_commit_what_each_commits_alone(tiny_llama, gtok, kind, kv):
    """The fixed-shape decoder (CUDA's) gets a KV slot per sequence and runs every slot's rows
    in each forward: four sequences at once commit what each commits alone through it, their
    drafts ride in the shared rounds, and every slot is given back."""
    from agent.schema.grammar import Grammar

    m, tok = tiny_llama.model, tiny_llama.tokenizer
    words = [
        "the red mug",
        "a box of screws and bolts",
        "go to the dock",
        "pick the blue cup up now please",
    ]
    prompts = [tok.encode(f"{PROMPT} {w}") for w in words]
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 12}},
        "required": ["a"],
    }
    grammar = Grammar(gtok, schema)

    def constraint_for(i):
        return grammar.constraint() if i % 2 == 0 else None

    rt = Runtime(m, tok, kv_dtype=kv, fixed_shape=True, step_rows=8, max_context=128)
    assert rt.share(4) == 4 and rt.decoder.slots == 4 and rt.batch.shared_forward
    spec = _spec(kind, m)
    # alone, last prompt first: a slot is taken in turn, so each prompt decodes in another
    # slot (another stretch of the forward's rows) than it gets in the batch
    alone = _generate_all(
        rt, prompts[::-1], spec, lambda i: constraint_for(3 - i), concurrent=False
    )[::-1]
    together = _generate_all(rt, prompts, spec, constraint_for, concurrent=True)
    assert together == alone
    assert max(rt.batch.rounds) > 1, rt.batch.rounds
    assert sorted(rt.decoder._free) == [0, 1, 2, 3]
    # the cost of a verify does not grow with its rows: every forward runs all of them
    assert rt.decoder.span == rt.decoder.capacity


def test_fixed_shape_slots_are_held_and_given_back(tiny_llama):
    rt = Runtime(
        tiny_llama.model, tiny_llama.tokenizer, fixed_shape=True, step_rows=4, max_context=64
    )
    assert rt.decoder.slots == 1 and rt.share(1) == 1 and rt.batch is None
    assert rt.share(4) == 4 and rt.share(1) == 1 and rt.decoder.slots == 1 and rt.batch is None
    assert rt.share(2) == 2
    dec = rt.decoder
    a, b = dec.new_cache(10), dec.new_cache(10)
    with pytest.raises(ThorError, match="all 2 decode slots are in use"):
        dec.new_cache(10)
    dec.release(a)
    assert dec.new_cache(10) is a
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ThorError, match="its own KV store"):
        dec.verify(ids, KVCache(tiny_llama.cfg, 16))
    with pytest.raises(ThorError, match="two verifies of one slot"):
        dec.verify_many([VerifyCall(ids, b), VerifyCall(ids, b)])


def test_a_slot_that_is_prefilling_keeps_its_keys_through_a_round(tiny_llama):
    """A round runs every slot's rows; a slot with no call in it (a request still prefilling)
    writes its padding past the context, so its prompt's keys stay as its prefill left them."""
    m = tiny_llama.model
    rt = Runtime(m, tiny_llama.tokenizer, fixed_shape=True, step_rows=4, max_context=64)
    rt.share(2)
    dec = rt.decoder
    busy, idle = dec.new_cache(40), dec.new_cache(40)
    ids = torch.arange(1, 21)
    m.prefill(ids[:10], busy)
    m.prefill(ids[:12], idle)
    k, v = idle.k[:, :, :12].clone(), idle.v[:, :, :12].clone()
    for t in range(3):
        dec.verify(ids[10 + t : 14 + t], busy)
        busy.crop(11 + t)
    assert (
        idle.length == 12
        and torch.equal(idle.k[:, :, :12], k)
        and torch.equal(idle.v[:, :, :12], v)
    )


def test_a_verify_longer_than_a_forward_leaves_its_batch_mates_rows_intact(tiny_llama):
    """A CUDA graph writes every forward into the same static outputs. A round in which one
    sequence verifies more rows than a forward takes (a long run of forced grammar tokens) runs
    two forwards; the rows the first handed to its batch-mates must survive the second. Here the
    forward is made to reuse its outputs as a graph replay does (the CPU has no graphs)."""
    m = tiny_llama.model
    rt = Runtime(m, tiny_llama.tokenizer, fixed_shape=True, step_rows=4, max_context=64)
    rt.share(2)
    dec = rt.decoder
    forward, static = dec._fn, {}

    def replayed(span, taps):
        logits, t = forward(span, taps)
        if "logits" not in static:
            static["logits"], static["taps"] = logits.clone(), {i: x.clone() for i, x in t.items()}
        static["logits"].copy_(logits)
        for i, x in t.items():
            static["taps"][i].copy_(x)
        return static["logits"], static["taps"]

    ids = torch.arange(1, 40)

    def run(batched):
        long, short = dec.new_cache(40), dec.new_cache(40)
        m.prefill(ids[:10], long)
        m.prefill(ids[:12], short)
        calls = [
            VerifyCall(ids[10:19], long, (0,)),
            VerifyCall(ids[12:13], short, (0,)),
        ]  # 9 rows: 3 forwards
        outs = (
            dec.verify_many(calls)
            if batched
            else [dec.verify(c.ids, c.cache, c.taps) for c in calls]
        )
        outs = [(o.logits.clone(), o.taps[0].clone()) for o in outs]
        dec.release(long)
        dec.release(short)
        return outs

    alone = run(batched=False)
    dec._fn = replayed
    together = run(batched=True)
    for (a, ta), (b, tb) in zip(alone, together):
        assert torch.equal(a, b) and torch.equal(ta, tb)
