"""DFlash drafter, its checkpoints and its proposer, on tiny random targets (+ one default-model
check).

Exactness: greedy speculative decoding with any drafter (random here) must commit exactly
the tokens plain decoding commits. Window: one entry per committed token, in row order,
at the right absolute positions, equal to features recomputed from a plain target forward.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.tiny import proposer_and_k, random_drafter
from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.dflash_io import load_drafter, save_drafter
from thor_runtime.speculative.dflash_model import (
    DFlashConfig,
    DFlashDrafter,
    block_attention_mask,
)

N_TOKENS = 128
_plain_cache: dict = {}


def sp(n=N_TOKENS, **kw):
    return SamplingParams(max_tokens=n, ignore_eos=True, **kw)


def prompts(tok):
    long = " ".join(
        [
            "pick up the red cup and place it on the table",
            "move the gripper to the shelf, then open the drawer",
            "The robot arm has a workspace of 0.8 m and a payload of 3 kg.",
        ]
    )
    return [tok.encode("pick")[:1], tok.encode("move the gripper to the shelf"), tok.encode(long)]


def plain(loaded, ids, kv="fp32", n=N_TOKENS):
    key = (id(loaded), kv, tuple(ids), n)
    if key not in _plain_cache:
        _plain_cache[key] = (
            Runtime(loaded.model, loaded.tokenizer, kv_dtype=kv).generate(ids, sp(n)).token_ids
        )
    return _plain_cache[key]


def full_taps(model, ids, layers):
    """Taps of every position of ``ids`` from one plain forward on a fresh cache."""
    cache = KVCache(model.cfg, len(ids), "fp32", model.dtype)
    return model.forward(torch.tensor(ids), cache, taps=layers, logits_rows="none").taps


def expected_feats(drafter, model, ids, positions):
    taps = full_taps(model, ids, drafter.cfg.tap_layers)
    with torch.inference_mode():
        return drafter.project(drafter.concat_taps(taps)[positions])


# ---------------------------------------------------------------- exactness: spec == plain
# (kv dtype, prompt: 0 = one token / 1 = short / 2 = long, window W, seed the window, block B):
# per KV dtype every prompt once, W both shorter and longer than the prompt, seeding on and off.
EXACT_CASES = [
    ("fp32", 0, 8, True, 16),
    ("fp32", 1, 128, True, 16),
    ("fp32", 2, 8, False, 4),
    ("fp8", 0, 16, False, 4),
    ("fp8", 1, 4, True, 16),
    ("fp8", 2, 128, True, 16),
]


@pytest.mark.parametrize("kv,which,window,seed_window,block", EXACT_CASES)
def test_greedy_dflash_equals_plain(tiny_llama, kv, which, window, seed_window, block):
    ids = prompts(tiny_llama.tokenizer)[which]
    drafter = random_drafter(tiny_llama.cfg, num_layers=1, block_size=block, seed=window)
    p = DFlashProposer(drafter, tiny_llama.model, window=window, seed_window=seed_window)
    out = Runtime(tiny_llama.model, tiny_llama.tokenizer, kv_dtype=kv).generate(
        ids, sp(), speculation=Speculation(p, block - 1, DraftBudget())
    )
    assert out.token_ids == plain(tiny_llama, ids, kv)
    assert len(out.token_ids) == N_TOKENS
    # The window is exactly the last W committed-and-verified tokens (the final token is
    # the next anchor, not verified yet).
    pos, _ = p.window_entries()
    last = len(ids) + N_TOKENS - 2
    assert pos.tolist() == list(range(max(0, last - window + 1), last + 1))


class Steered(DFlashProposer):
    """Runs the drafter, then swaps in the true continuation with one corrupted position, so
    cycles commit varying numbers of rows (the random drafter alone almost never hits)."""

    def __init__(self, *a, truth, rng, **kw):
        super().__init__(*a, **kw)
        self.truth, self.rng = truth, rng

    def propose(self, seq, k):
        drafts, _ = super().propose(seq, k)
        true = list(self.truth[len(seq) : len(seq) + len(drafts)])
        j = self.rng.randrange(len(true) + 1)
        if j < len(true):
            true[j] = (true[j] + 1) % 300
        return true, None


@pytest.mark.parametrize("arch,window", [("llama", 8), ("llama", 200), ("qwen3", 24)])
def test_multirow_commits_window_matches_recomputation(tiny_llama, tiny_qwen3, arch, window):
    loaded = tiny_llama if arch == "llama" else tiny_qwen3
    model = loaded.model
    ids = prompts(loaded.tokenizer)[1]
    truth = list(ids) + plain(loaded, ids)
    drafter = random_drafter(loaded.cfg, num_layers=2, block_size=8, seed=3)
    p = Steered(drafter, model, window=window, truth=truth, rng=random.Random(0))
    out = Runtime(model, loaded.tokenizer).generate(
        ids, sp(), speculation=Speculation(p, 7, DraftBudget())
    )
    assert out.token_ids == truth[len(ids) :]
    assert (
        out.stats.accepted > N_TOKENS // 2 and out.stats.cycles < N_TOKENS
    )  # multi-row commits happened
    pos, feats = p.window_entries()
    last = len(truth) - 2
    assert pos.tolist() == list(range(max(0, last - window + 1), last + 1))
    want = expected_feats(drafter, model, truth[: last + 1], pos)
    torch.testing.assert_close(feats, want, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- window order and seeding
def test_window_append_order(tiny_llama):
    model, W = tiny_llama.model, 6
    drafter = random_drafter(tiny_llama.cfg, seed=5)
    p = DFlashProposer(drafter, model, window=W)
    prompt = prompts(tiny_llama.tokenizer)[2][:10]
    cache = KVCache(model.cfg, 64)
    out = model.prefill(
        torch.tensor(prompt), cache, taps=p.tap_layers, tap_rows=min(W, len(prompt))
    )
    p.start(prompt, out.taps)
    pos0, feats0 = p.window_entries()
    assert pos0.tolist() == list(range(4, 10))
    # One cycle: anchor a at position 10 with drafts d1..d3; rows 0..2 (a, d1, d2) committed.
    rows = [7, 8, 9, 11]
    v = model.forward(torch.tensor(rows), cache, taps=p.tap_layers)
    p.commit(3, v.taps)
    pos1, feats1 = p.window_entries()
    assert pos1.tolist() == [7, 8, 9, 10, 11, 12]
    new = feats1[3]  # first new entry: the anchor row (row 0) at position 10
    with torch.inference_mode():
        row0 = drafter.project(drafter.concat_taps(v.taps)[0])
    torch.testing.assert_close(new, row0)
    assert not torch.allclose(new, feats0[-1])  # not a copy of the previous last row
    torch.testing.assert_close(feats1[:3], feats0[3:])  # older entries kept, in order
    want = expected_feats(drafter, model, prompt + rows[:3], torch.arange(7, 13))
    torch.testing.assert_close(feats1, want, atol=1e-5, rtol=1e-5)
    # The next anchor (the recovered token) sits at position 13 = len(seq) - 1.
    seq = prompt + rows[:3] + [5]
    assert len(p.propose(seq, 3)[0]) == 3
    # Grammar-forced tokens after the anchor: the block stays on the committed anchor (5 at
    # position 13), the forced tokens take rows 1-2 and the drafts are the rows after them.
    forced = seq + [1, 2]
    full = drafter.draft_block(p._kv, 5, len(seq) - 1, 5).argmax(-1).tolist()
    assert p.propose(forced, 3)[0] == full[2:]
    assert p.propose(seq + [1] * (p.block_size - 1), 3)[0] == []  # forced rows fill the block
    with pytest.raises(ThorError, match="out of step"):
        p.propose(seq[:-1], 3)


@pytest.mark.parametrize(
    "W,plen,seed_window",
    [(8, 20, True), (64, 20, True), (8, 1, True), (8, 20, False), (0, 20, True)],
)
def test_window_seeding(tiny_llama, W, plen, seed_window):
    model = tiny_llama.model
    drafter = random_drafter(tiny_llama.cfg, seed=6)
    p = DFlashProposer(drafter, model, window=W, seed_window=seed_window)
    prompt = (prompts(tiny_llama.tokenizer)[2] * 3)[:plen]
    n = min(W, plen)
    out = model.prefill(
        torch.tensor(prompt), KVCache(model.cfg, 64), chunk=7, taps=p.tap_layers, tap_rows=n
    )
    p.start(prompt, out.taps)
    pos, feats = p.window_entries()
    if not seed_window:
        assert pos.numel() == 0
        assert (
            len(p.propose(prompt + [3], 5)[0]) == 5
        )  # an empty window: the block sees itself only
        return
    assert pos.tolist() == list(range(plen - n, plen))
    torch.testing.assert_close(
        feats, expected_feats(drafter, model, prompt, pos), atol=1e-5, rtol=1e-5
    )


# ---------------------------------------------------------- drafter: inference == batched forward
def test_inference_matches_batched_forward(tiny_qwen3):
    model, B = tiny_qwen3.model, 8
    drafter = random_drafter(tiny_qwen3.cfg, num_layers=2, block_size=B, seed=7, std=0.1)
    drafter.bind_target(model.embed_w, model.lm_head)
    ids = (prompts(tiny_qwen3.tokenizer)[2] * 2)[:40]
    raw = drafter.concat_taps(full_taps(model, ids, drafter.cfg.tap_layers))  # [40, n*D]
    M = drafter.cfg.mask_token_id
    with torch.no_grad():
        feats = drafter.project(raw)

        def single(a):  # one block at anchor position a over the context positions < a
            kv = drafter.context_kv(feats[:a], torch.arange(a)) if a else None
            return drafter.draft_block(kv, ids[a], a, B - 1)

        ctx_pos = torch.arange(40)[None]
        for a in (0, 12):
            blk = torch.tensor([[ids[a]] + [M] * (B - 1)])
            h = drafter(
                blk, torch.arange(a, a + B)[None], ctx_pos[:, :a], ctx_feats=feats[None, :a]
            )
            torch.testing.assert_close(drafter.logits(h[0, 1:]), single(a), atol=1e-4, rtol=1e-4)
        # Two blocks of one sequence at once (training): causal across blocks, over raw taps.
        anchors = (12, 25)
        blk = torch.tensor([[ids[a]] + [M] * (B - 1) for a in anchors]).reshape(1, -1)
        bpos = torch.cat([torch.arange(a, a + B) for a in anchors])[None]
        mask = block_attention_mask(ctx_pos, bpos, B)
        h = drafter(blk, bpos, ctx_pos, ctx_taps=raw[None], attn_mask=mask)
        for i, a in enumerate(anchors):
            got = drafter.logits(h[0, i * B + 1 : (i + 1) * B])
            torch.testing.assert_close(got, single(a), atol=1e-4, rtol=1e-4)
    # Trainable drafter, frozen shared target pieces.
    drafter.train()
    h = drafter(blk, bpos, ctx_pos, ctx_taps=raw[None], attn_mask=mask)
    drafter.logits(h).logsumexp(-1).mean().backward()
    assert drafter.fc.weight.grad is not None and model.embed_w.grad is None
    assert "embed_w" not in str(list(drafter.state_dict()))


# ---------------------------------------------------------------- checkpoints
def _drafts(drafter, loaded, ids, k=7):
    p = DFlashProposer(drafter, loaded.model, window=16)
    out = loaded.model.prefill(
        torch.tensor(ids),
        KVCache(loaded.cfg, len(ids) + 8),
        taps=p.tap_layers,
        tap_rows=min(16, len(ids)),
    )
    p.start(ids, out.taps)
    seq = list(ids) + [ids[0]]  # the first generated token is the anchor, at position len(ids)
    with torch.inference_mode():
        logits = drafter.draft_block(p._kv[:, :, :, : p.window_len], seq[-1], len(ids), k)
    return p.propose(seq, k)[0], logits


def test_checkpoint_roundtrip(tiny_llama, tmp_path):
    d = random_drafter(tiny_llama.cfg, num_layers=2, block_size=8, seed=9, std=0.1)
    save_drafter(d, tmp_path / "dr")
    assert json.loads((tmp_path / "dr" / "config.json").read_text())["format"] == "thor-dflash/1"
    d2 = load_drafter(tmp_path / "dr", tiny_llama.cfg)
    assert d2.cfg == d.cfg
    ids = prompts(tiny_llama.tokenizer)[1]
    (a, la), (b, lb) = _drafts(d, tiny_llama, ids), _drafts(d2, tiny_llama, ids)
    assert a == b and torch.equal(la, lb)


def zlab_dir(path, drafter, target_cfg, **over):
    c = drafter.cfg
    doc = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size,
        "rms_norm_eps": c.rms_eps,
        "rope_parameters": {"rope_theta": c.rope_theta, "rope_type": "default"},
        "block_size": c.block_size,
        "num_target_layers": target_cfg.num_layers,
        "dtype": "bfloat16",
        "dflash_config": {"target_layer_ids": list(c.tap_layers), "mask_token_id": c.mask_token_id},
    }
    doc.update(over)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(doc))
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in drafter.state_dict().items()},
        str(path / "model.safetensors"),
    )
    return path


def test_zlab_layout_loads_and_runs(tiny_qwen3, tmp_path):
    d = random_drafter(tiny_qwen3.cfg, num_layers=2, block_size=8, seed=11, std=0.1)
    with torch.no_grad():  # z-lab ships bf16: round the reference the same way
        for p in d.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    z = load_drafter(zlab_dir(tmp_path / "z", d, tiny_qwen3.cfg), tiny_qwen3.cfg)
    assert (
        z.cfg.tap_layers == d.cfg.tap_layers
        and z.cfg.block_size == 8
        and z.cfg.rope_theta == d.cfg.rope_theta
    )
    ids = prompts(tiny_qwen3.tokenizer)[2]
    (a, la), (b, lb) = _drafts(d, tiny_qwen3, ids), _drafts(z, tiny_qwen3, ids)
    assert a == b and torch.equal(la, lb)
    out = Runtime(tiny_qwen3.model, tiny_qwen3.tokenizer).generate(
        ids, sp(32), speculation=Speculation(DFlashProposer(z, tiny_qwen3.model), 7, DraftBudget())
    )
    assert out.token_ids == plain(tiny_qwen3, ids, n=32)


# ---------------------------------------------------------------- refusals
def test_refusals(tiny_llama, tiny_qwen3, tmp_path):
    cfg = tiny_llama.cfg
    d = random_drafter(cfg, seed=1)
    good = save_drafter(d, tmp_path / "good")

    pk = tmp_path / "pickle"
    pk.mkdir()
    (pk / "config.json").write_text((good / "config.json").read_text())
    (pk / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(ThorError, match="pickle"):
        load_drafter(pk, cfg)
    with pytest.raises(ThorError, match="pickle"):
        load_drafter(pk / "pytorch_model.bin", cfg)

    tr = save_drafter(d, tmp_path / "trunc")
    data = (tr / "model.safetensors").read_bytes()
    (tr / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ThorError, match="truncated"):
        load_drafter(tr, cfg)

    sd = {k: v.clone() for k, v in d.state_dict().items()}
    sd["layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 64)
    ms = save_drafter(d, tmp_path / "shape")
    save_file(sd, str(ms / "model.safetensors"))
    with pytest.raises(ThorError, match=r"layers\.0\.self_attn\.k_proj\.weight"):
        load_drafter(ms, cfg)
    del sd["layers.0.self_attn.k_proj.weight"]
    save_file(sd, str(ms / "model.safetensors"))
    with pytest.raises(ThorError, match=r"missing tensor layers\.0\.self_attn\.k_proj\.weight"):
        load_drafter(ms, cfg)

    with pytest.raises(ThorError, match="tap layers"):
        random_drafter(cfg, tap_layers=(0, cfg.num_layers))
    far = DFlashDrafter(DFlashConfig(**{**d.cfg.__dict__, "tap_layers": (1, 5)}))
    with pytest.raises(ThorError, match=r"tap layers \[5\]"):
        load_drafter(save_drafter(far, tmp_path / "far"), cfg)
    with pytest.raises(ThorError, match="tap layers"):
        DFlashProposer(far, tiny_llama.model)
    zq = random_drafter(tiny_qwen3.cfg, seed=2)
    with pytest.raises(ThorError, match="4-layer target"):
        load_drafter(
            zlab_dir(tmp_path / "z4", zq, tiny_qwen3.cfg, num_target_layers=4), tiny_qwen3.cfg
        )
    with pytest.raises(ThorError, match="hidden size"):
        load_drafter(zlab_dir(tmp_path / "zh", zq, tiny_qwen3.cfg, hidden_size=128), tiny_qwen3.cfg)
    with pytest.raises(ThorError, match="architecture"):
        load_drafter(
            zlab_dir(tmp_path / "z2", zq, tiny_qwen3.cfg, architectures=["DFlash2DraftModel"])
        )
    with pytest.raises(ThorError, match="not found"):
        load_drafter(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ThorError, match="config not found"):
        load_drafter(tmp_path / "empty")
    zm = zlab_dir(tmp_path / "zm", zq, tiny_qwen3.cfg)
    doc = json.loads((zm / "config.json").read_text())
    del doc["dflash_config"]["target_layer_ids"]
    (zm / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ThorError, match="target_layer_ids"):
        load_drafter(zm, tiny_qwen3.cfg)
    for bad in (
        {"block_size": 1},
        {"tap_layers": ()},
        {"tap_layers": (1, 1)},
        {"num_kv_heads": 3},
        {"window": -1},
        {"block_size": "16"},
        {"tap_layers": ("1",)},
    ):
        with pytest.raises(ThorError):
            DFlashConfig(**{**d.cfg.__dict__, **bad})


# ---------------------------------------------------------------- sampling: draft probabilities
def test_sample_probs(tiny_llama):
    drafter = random_drafter(tiny_llama.cfg, block_size=8, seed=4, std=0.2)
    ids = prompts(tiny_llama.tokenizer)[1]
    p = DFlashProposer(drafter, tiny_llama.model, sample_probs=True, seed=0)
    p.start(ids, None)
    drafts, q = p.propose(ids + [3], 5)
    assert q.shape == (5, tiny_llama.cfg.vocab_size)
    torch.testing.assert_close(q.sum(-1), torch.ones(5))
    assert all(q[j, d] > 0 for j, d in enumerate(drafts))
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    params = sp(24, temperature=0.8, seed=1)
    runs = [
        rt.generate(
            ids,
            params,
            speculation=Speculation(
                DFlashProposer(drafter, tiny_llama.model, sample_probs=True, seed=0),
                7,
                DraftBudget(),
            ),
        ).token_ids
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0]) == 24


# ---------------------------------------------------------------- the real default target
DEFAULT_PROMPTS = [
    "Plan how the robot moves the red mug from the counter to the dish rack, as JSON steps.",
    "The robot must pick up the screwdriver and hand it to the technician. List the steps.",
]


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_default_model_greedy_dflash_equals_plain(default_model, kv):
    """The committed drafter and a random one, on the real default target, 128 greedy tokens:
    identical to plain decoding, with fp32 and with fp8 KV (verify rows are bit-for-bit 1-row
    steps, so an fp8 cache holds the same bytes either way: test_exact.py)."""
    from thor_runtime.speculative import DEFAULT_DRAFTER, SpecOptions

    def check(got, want):
        assert got == want

    tok, model = default_model.tokenizer, default_model.model
    shipped = json.loads((DEFAULT_DRAFTER / "config.json").read_text())
    assert (
        shipped["target_id"] == model.cfg.name and shipped["hidden_size"] == model.cfg.hidden_size
    )
    rt = Runtime(model, tok, kv_dtype=kv)
    for i, prompt in enumerate(DEFAULT_PROMPTS):
        ids = tok.encode_chat([{"role": "user", "content": prompt}])
        want = rt.generate(ids, sp(128)).token_ids
        p, k = proposer_and_k(SpecOptions(method="dflash"), model)  # the committed drafter
        assert p.block_size == shipped["block_size"] and tuple(p.tap_layers) == tuple(
            shipped["tap_layers"]
        )
        check(
            rt.generate(ids, sp(128), speculation=Speculation(p, k, DraftBudget())).token_ids, want
        )
        if i == 0:
            rnd = DFlashProposer(random_drafter(model.cfg, num_layers=1, seed=0), model, window=128)
            # all 15 drafts every cycle (no budget): rejections and rollbacks on every cycle
            check(rt.generate(ids, sp(128), speculation=Speculation(rnd, 15)).token_ids, want)
