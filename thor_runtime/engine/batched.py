"""Batched greedy decoding of several prompts at once, built from the model's segments.

Generating drafter training data one sequence at a time wastes the CPU on batch-1 matmuls.
``pre_attn`` / ``post_attn`` take leading batch dims, so this decoder runs them over [B, T]
with its own batched KV buffer and masked attention; ``TargetModel`` itself stays batch-1.

Left padding: prompts of different lengths are right-aligned, so every row's next token sits
in the same column and one decode step is one [B, 1] forward. Pad columns are masked out of
attention and get position 0; real tokens get positions 0..len-1 as in ``Runtime.generate``.
"""

from __future__ import annotations

import torch

from thor_runtime.errors import ThorError
from thor_runtime.models.dense import attend


@torch.inference_mode()
def _greedy_one(model, prompt: list[int], max_tokens: int, eos: set) -> list[int]:
    if not prompt:
        raise ThorError("datagen: empty prompt")
    cache = model.new_cache(len(prompt) + max_tokens)
    logits = model.prefill(torch.tensor(prompt), cache).logits
    out: list[int] = []
    while True:
        out.append(int(logits[-1].argmax()))
        if out[-1] in eos or len(out) >= max_tokens:
            return out
        logits = model.forward(torch.tensor(out[-1:]), cache).logits


@torch.inference_mode()
def batched_greedy(model, prompts: list[list[int]], max_tokens: int, eos_ids=()) -> list[list[int]]:
    """Greedy continuations of several prompts at once -> one list of new ids per prompt,
    ending with the EOS id when one was produced (as ``Runtime.generate``'s token_ids)."""
    if getattr(
        model, "is_hybrid", False
    ):  # recurrent state: no batched path, one sequence at a time
        return [_greedy_one(model, p, max_tokens, set(eos_ids)) for p in prompts]
    cfg, dev, dt = model.cfg, model.device, model.dtype
    B = len(prompts)
    if B == 0:
        return []
    lens = torch.tensor([len(p) for p in prompts])  # [B]
    if (lens == 0).any():
        raise ThorError("datagen: empty prompt")
    P = int(lens.max())
    S = P + max_tokens
    if S > cfg.max_position_embeddings:
        raise ThorError(
            f"datagen: {P} prompt + {max_tokens} new tokens exceed the model context "
            f"{cfg.max_position_embeddings}"
        )
    model.ensure_positions(S)
    pad = P - lens  # [B] left pad
    ids = torch.zeros(B, P, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, pad[b] :] = torch.tensor(p)
    col = torch.arange(S)  # [S]
    valid = col[None, :] >= pad[:, None]  # [B, S] real key
    pos = (col[None, :] - pad[:, None]).clamp(min=0)  # [B, S]
    kshape = (cfg.num_layers, B, cfg.num_kv_heads, S, cfg.head_dim)
    kbuf, vbuf = (
        torch.zeros(kshape, dtype=dt, device=dev),
        torch.zeros(kshape, dtype=dt, device=dev),
    )
    rows = torch.arange(B)  # which original prompt each live row is
    out: list[list[int]] = [[] for _ in range(B)]
    eos = set(eos_ids)

    def step(tok: torch.Tensor, c0: int) -> torch.Tensor:
        """tok [b, T] at columns c0..c0+T-1 -> last-column logits [b, V]."""
        c1 = c0 + tok.shape[1]  # kbuf/vbuf are read at call time (re-bound on compaction)
        h = model.embed(tok.to(dev))  # [b, T, D]
        p = pos[rows, c0:c1].to(dev)  # [b, T]
        # key j visible to query column c iff j is a real token and j <= c
        qcol = torch.arange(c0, c1)[:, None]  # [T, 1]
        m = valid[rows, None, :c1] & (col[None, :c1] <= qcol)[None]  # [b, T, c1]
        # A pad query sees only itself: a fully masked row would give NaN, and NaN keys poison
        # even masked scores. Real rows never see pad columns, so this changes nothing real.
        m = m | (col[None, :c1] == qcol)[None]
        m = m[:, None].to(dev)  # [b, 1, T, c1]
        for i in range(cfg.num_layers):
            q, k, v = model.pre_attn(i, h, p)  # q [b, H, T, Dh], k/v [b, Hkv, T, Dh]
            kbuf[i, :, :, c0:c1], vbuf[i, :, :, c0:c1] = k, v
            o = attend(q, kbuf[i, :, :, :c1], vbuf[i, :, :, :c1], m)  # [b, H, T, Dh]
            h = model.post_attn(i, h, o.transpose(1, 2).reshape(*h.shape[:2], -1))
        return model.head(h[:, -1])  # [b, V]

    nxt = step(ids, 0).argmax(-1)  # [B]
    c = P
    for t in range(max_tokens):
        done = torch.zeros(len(rows), dtype=torch.bool)
        for j, r in enumerate(rows.tolist()):
            tok = int(nxt[j])
            out[r].append(tok)
            done[j] = tok in eos or len(out[r]) >= max_tokens
        if done.all():
            break
        if done.any():
            # Drop finished rows so later steps only pay for live ones (buffers are re-indexed).
            keep = (~done).nonzero().squeeze(1)  # [b']
            kbuf, vbuf = kbuf[:, keep.to(dev)], vbuf[:, keep.to(dev)]
            rows, nxt = rows[keep], nxt[keep]
        nxt = step(nxt[:, None], c).argmax(-1)  # [b]
        c += 1
    return out
