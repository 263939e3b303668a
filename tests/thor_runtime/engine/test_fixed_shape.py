"""Decode at one shape (fixed_shape.py): speculative == plain by construction, on the CPU (the
mode forced) and on CUDA (its default there, with CUDA graphs)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny import random_drafter
from thor_runtime.engine.fixed_shape import KEY_BUCKET, FixedShapeDecoder, key_span
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative import SpecOptions, Speculation, build_speculation
from thor_runtime.speculative.base import Proposer
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer

PROMPTS = [
    "pick up the red cup and place it on the table. pick up the red cup and place it on the",
    '{"steps": [{"id": "s1", "skill": "pick", "args": {"object": "cup"}}, {"id": "s2", "skill": "',
]
PARAMS = SamplingParams(max_tokens=48, ignore_eos=True)


class Truthful(Proposer):
    """Drafts the plain run's own continuation, wrong from draft ``cut`` on: verifies of many
    rows, each accepted up to the cut — every row position of a verify gets used."""

    name = "truthful"

    def __init__(self, truth: list[int], prompt_len: int, cut: int):
        self.truth, self.plen, self.cut = truth, prompt_len, cut

    def propose(self, seq, k):
        done = len(seq) - self.plen
        d = self.truth[done : done + k]
        if len(d) > self.cut:
            d = d[: self.cut] + [(d[self.cut] + 1) % 50] + d[self.cut + 1 :]
        return d, None


def test_key_span_buckets():
    assert key_span(1, 4096) == KEY_BUCKET
    assert key_span(KEY_BUCKET + 1, 4096) == 2 * KEY_BUCKET
    assert key_span(3000, 4096) == 4096
    assert key_span(3000, 2048) == 2048


def proposers(loaded, truth, plen):
    """name -> Speculation: lookup, a truthful script, DFlash, and DFlash combined with lookup."""
    cfg, model = loaded.cfg, loaded.model
    drafter = random_drafter(cfg, num_layers=1, block_size=8, seed=1)
    return {
        "ngram": Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget()),
        "truthful": Speculation(Truthful(truth, plen, cut=5), 12),
        "dflash": build_speculation(
            SpecOptions(method="dflash", fixed_k=True), model, drafter=drafter
        ),
        "hybrid": build_speculation(
            SpecOptions(method="hybrid"),
            model,
            drafter=random_drafter(cfg, num_layers=1, block_size=8, seed=2),
        ),
    }


def check_spec_equals_plain(loaded, rt):
    for prompt in PROMPTS:
        ids = loaded.tokenizer.encode(prompt)
        plain = rt.generate(ids, PARAMS)
        for name, spec in proposers(loaded, plain.token_ids, len(ids)).items():
            got = rt.generate(ids, PARAMS, speculation=spec)
            assert got.token_ids == plain.token_ids, (name, prompt)
        assert got.stats.cycles < plain.stats.cycles or got.stats.accepted == 0
    return plain


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_forced_on_cpu_spec_equals_plain(tiny_llama, kv):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer, kv_dtype=kv, fixed_shape=True, step_rows=8)
    assert rt.decoder is not None and not rt.decoder.graphs
    check_spec_equals_plain(tiny_llama, rt)


def test_sdpa_attention_form_on_cpu(tiny_qwen3):
    """The fused-attention form CUDA takes (query groups folded into rows), run on the CPU:
    speculative == plain, and the tokens of the matmul form."""
    rt = Runtime(tiny_qwen3.model, tiny_qwen3.tokenizer, fixed_shape=True, step_rows=8)
    matmul = [rt.generate(rt.tok.encode(p), PARAMS).token_ids for p in PROMPTS]
    rt.decoder.sdpa = True
    plain = check_spec_equals_plain(tiny_qwen3, rt)
    assert plain.token_ids == matmul[-1]


def test_forced_on_cpu_matches_the_plain_step(tiny_qwen3):
    """The padded step gives the tokens the unpadded 1-row step gives."""
    tok, model = tiny_qwen3.tokenizer, tiny_qwen3.model
    padded = Runtime(model, tok, fixed_shape=True, step_rows=16)
    plain = Runtime(model, tok, fixed_shape=False)
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        assert padded.generate(ids, PARAMS).token_ids == plain.generate(ids, PARAMS).token_ids


def test_decoder_tensors_follow_the_model(tiny_llama):
    dec = FixedShapeDecoder(tiny_llama.model, rows=4, max_context=64)
    cache = dec.new_cache(20)
    dev = tiny_llama.model.device
    assert {t.device for t in (cache.k, cache.v, dec.ids, dec.start, dec.key_index)} == {dev}
    with pytest.raises(Exception, match="exceeds the decoder's context"):
        dec.new_cache(65)
    out = Runtime(tiny_llama.model, tiny_llama.tokenizer, fixed_shape=True).generate(
        tiny_llama.tokenizer.encode("move"), SamplingParams(max_tokens=4)
    )
    assert out.stats.to_dict()["device"] == str(dev)


# ---- on a CUDA device (make test-gpu); skipped elsewhere, saying why
cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: run `make test-gpu` on a GPU"
)


def on_cuda(path, dtype):
    from thor_runtime.loading import load

    return load(str(path), dtype, device="cuda")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("kv", ["fp32", "bf16", "fp8"])
def test_cuda_spec_equals_plain(tiny_dirs, dtype, kv):
    loaded = on_cuda(tiny_dirs["llama"], dtype)
    rt = Runtime(loaded.model, loaded.tokenizer, kv_dtype=kv)
    assert rt.decoder is not None and rt.decoder.graphs
    check_spec_equals_plain(loaded, rt)
    assert rt.decoder.captured >= 1


@pytest.mark.cuda
@cuda
def test_cuda_graph_replay_equals_eager(tiny_dirs):
    loaded = on_cuda(tiny_dirs["qwen3"], "bf16")
    graphed = Runtime(loaded.model, loaded.tokenizer, kv_dtype="fp8")
    eager = Runtime(loaded.model, loaded.tokenizer, kv_dtype="fp8")
    eager.decoder.graphs = False
    ids = loaded.tokenizer.encode(PROMPTS[0])
    a, b = graphed.generate(ids, PARAMS), eager.generate(ids, PARAMS)
    assert a.token_ids == b.token_ids
    # and the logits of a verify, bit for bit
    for rt in (graphed, eager):
        cache = rt.decoder.new_cache(len(ids) + 8)
        rt.model.prefill(torch.tensor(ids), cache)
        rt.last = rt.verify(torch.tensor(a.token_ids[:5]), cache).logits.clone()
    assert torch.equal(graphed.last, eager.last)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("dtype,bound", [("bf16", 0.995), ("fp16", 0.999)])
def test_cuda_logits_match_cpu_fp32(tiny_dirs, tiny_llama, dtype, bound):
    """Prefill and decode logits on CUDA against the CPU fp32 reference: cosine per row."""
    loaded = on_cuda(tiny_dirs["llama"], dtype)
    ids = tiny_llama.tokenizer.encode(PROMPTS[1])
    ref_rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    ref = ref_rt.model.prefill(torch.tensor(ids), ref_rt.new_cache(len(ids) + 4)).logits
    for kv in ("bf16", "fp8"):
        rt = Runtime(loaded.model, loaded.tokenizer, kv_dtype=kv)
        got = rt.model.prefill(torch.tensor(ids), rt.decoder.new_cache(len(ids) + 4)).logits.cpu()
        cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
        assert float(cos.min()) > (bound if kv != "fp8" else bound - 0.01), (kv, cos)


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_padded_hybrid_on_cpu_spec_equals_plain(tiny_qwen3_5, kv):
    """A hybrid target with every verify padded: padding rows are rejected drafts to its cache."""
    rt = Runtime(
        tiny_qwen3_5.model, tiny_qwen3_5.tokenizer, kv_dtype=kv, fixed_shape=True, step_rows=16
    )
    assert rt.decoder is None and rt.pad_rows == 16
    plain = check_spec_equals_plain(tiny_qwen3_5, rt)
    unpadded = Runtime(tiny_qwen3_5.model, tiny_qwen3_5.tokenizer, kv_dtype=kv, fixed_shape=False)
    assert (
        unpadded.generate(tiny_qwen3_5.tokenizer.encode(PROMPTS[1]), PARAMS).token_ids
        == plain.token_ids
    )


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_cuda_hybrid_spec_equals_plain(tiny_hybrid_dirs, kv):
    loaded = on_cuda(tiny_hybrid_dirs["qwen3_5"], "bf16")
    rt = Runtime(loaded.model, loaded.tokenizer, kv_dtype=kv)
    assert rt.pad_rows == 16
    check_spec_equals_plain(loaded, rt)


def test_drafter_block_at_one_shape_drafts_as_eager(tiny_llama):
    """The drafter's block over the whole window (masked), as CUDA captures it, run eagerly on
    the CPU: the same drafts as the block over the filled entries alone, cycle after cycle."""
    from thor_runtime.speculative.dflash import DFlashProposer

    model, tok = tiny_llama.model, tiny_llama.tokenizer
    rt = Runtime(model, tok)
    ids = tok.encode(PROMPTS[0])
    drafts = {}
    for fixed in (False, True):
        p = DFlashProposer(
            random_drafter(tiny_llama.cfg, num_layers=2, block_size=8, window=16, seed=4),
            model,
            fixed_block=fixed,
        )
        assert (p._block is not None) == fixed
        seen, propose = [], p.propose

        def recording(seq, k, propose=propose, seen=seen):
            d, q = propose(seq, k)
            seen.append(d)
            return d, q

        p.propose = recording
        out = rt.generate(ids, PARAMS, speculation=Speculation(p, 7))
        drafts[fixed] = (seen, out.token_ids)
    assert drafts[True][1] == drafts[False][1]
    assert (
        drafts[True][0] == drafts[False][0] and len(drafts[True][0]) > 3
    )  # window wraps: 16 < 48 tokens


@pytest.mark.cuda
@cuda
def test_cuda_drafter_block_graph(tiny_dirs):
    """On CUDA the drafter's block is a replayed graph; its drafts are the eager fixed-shape
    ones."""
    from thor_runtime.speculative.dflash import DFlashProposer

    loaded = on_cuda(tiny_dirs["llama"], "bf16")
    rt = Runtime(loaded.model, loaded.tokenizer)
    ids = loaded.tokenizer.encode(PROMPTS[0])
    runs = []
    for graphs in (True, False):
        p = DFlashProposer(
            random_drafter(loaded.cfg, num_layers=2, block_size=8, window=16, seed=4), loaded.model
        )
        p._block.graphs = graphs
        runs.append(rt.generate(ids, PARAMS, speculation=Speculation(p, 7)))
        assert (p._block._graph is not None) == graphs
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].stats.accepted == runs[1].stats.accepted


@pytest.mark.cuda
@cuda
def test_cuda_hybrid_slot_rollback_equals_padded_steps(tiny_hybrid_dirs):
    """A padded verify of K + 1 rows cropped to n accepted: the recurrent state, conv window and
    KV bytes are exactly those of n + 1 padded plain steps; the replay rollback (an unpadded
    re-forward, another shape) agrees within bf16 rounding."""
    from thor_runtime.engine.fixed_shape import PaddedVerify

    m = on_cuda(tiny_hybrid_dirs["qwen3_5"], "bf16").model
    pv, K, P = PaddedVerify(m, 16), 7, 30
    ids = torch.randint(
        0, m.cfg.vocab_size, (P + K + 1,), generator=torch.Generator().manual_seed(2)
    )
    for n in (0, 3, K):
        caches = {}
        for how in ("slots", "steps", "replay"):
            c = m.new_cache(64, naive=how == "replay")
            m.prefill(ids[:P], c)
            if how == "steps":
                for t in range(P, P + n + 1):
                    pv.verify(ids[t : t + 1], c)
                    c.crop(t + 1)
            else:
                pv.verify(ids[P:], c)
                c.crop(P + n + 1)
            caches[how] = c
        a, b, r = caches["slots"], caches["steps"], caches["replay"]
        for j in range(len(m.cfg.gdn_layers)):
            assert torch.equal(a.rec.current(j), b.rec.current(j)), (n, j)
            assert torch.equal(a.rec.conv_state(j), b.rec.conv_state(j)), (n, j)
            cos = torch.nn.functional.cosine_similarity(
                a.rec.current(j).flatten().double(), r.rec.current(j).flatten().double(), dim=0
            )
            assert float(cos) > 0.999, (n, j, float(cos))
        L = b.kv.length
        assert torch.equal(a.kv.k[:, :, :L], b.kv.k[:, :, :L]) and torch.equal(
            a.kv.v[:, :, :L], b.kv.v[:, :, :L]
        )
