"""DFlash block drafter (Chen et al., arXiv 2602.06036): drafts a whole block in one pass.

The drafter is a small Qwen3-style stack that reads the target's own hidden states:

    taps (target hidden states at ``tap_layers``, concatenated)  [C, n_taps*D]
      -> fc (no bias) -> hidden_norm                      = context features [C, D]
    block [anchor, MASK x (B-1)] -> target embedding       = block hidden     [B, D]
    each layer: block queries attend NON-causally over [context ; block];
                context K/V come from the features through the same layer's k/v proj
                (no input norm on them), RoPE at absolute token positions
    final norm -> target lm_head                           = logits [B, V]

Row j >= 1 of the block predicts the token at ``anchor_pos + j``: the drafts are
argmax(logits[1:k+1]). The embedding and lm_head are the target's (frozen, shared);
they are bound with ``bind_target`` as plain attributes, so they are neither trained
nor in ``state_dict`` / the checkpoint. Parameter names equal z-lab's checkpoint names
(``fc.weight``, ``layers.N.self_attn.q_proj.weight`` ...), so both layouts load as-is.

API
---
``DFlashConfig(tap_layers, mask_token_id, hidden_size, num_layers, num_heads, num_kv_heads,
head_dim, intermediate_size, block_size=16, rms_eps=1e-6, rope_theta=1e6, target_id="",
window=128)``

``DFlashDrafter(cfg)``; ``.bind_target(embed_w [V, D], lm_head_w [V, D])``

* ``concat_taps(taps: {layer: [T, D]}) -> [T, n_taps*D]`` (cfg.tap_layers order)
* ``project(raw [..., n_taps*D]) -> feats [..., D]``  (fc + hidden_norm)
* inference, batch 1, one block:
  ``context_kv(feats [C, D], pos [C]) -> kv [L, 2, Hkv, C, Dh]`` — per-layer context K/V
  (k_norm and RoPE applied). They depend only on the feature and its position, so a
  caller caches them per committed token. Attention over context is order-free (no
  causal mask, positions are inside K), so a ring buffer needs no reordering.
  ``draft_block(ctx_kv [L, 2, Hkv, C, Dh] | None, anchor_id, anchor_pos, n, block_size=None,
  head=None) -> logits [n, V]`` (fp32) for block rows 1..n; ``head`` [V', D] scores a
  subset of the vocabulary (see draft_vocab.py).
* training, batched: ``forward(block_ids [B, N], block_pos [B, N], ctx_feats [B, C, D] or
  ctx_taps [B, C, n_taps*D], ctx_pos [B, C], attn_mask=None) -> hidden [B, N, D]``;
  ``logits(hidden) -> [..., V]``. N = nblk * block_size (several blocks of one sequence
  side by side). ``attn_mask``:
    - None or bool [B, C] (valid context entries): every query sees that context, and
      the block part is block-diagonal (each block sees itself only, bidirectionally);
    - bool [B, N, C+N] (True = may attend) or additive float [B, N, C+N]: full control.
      ``block_attention_mask`` builds the training mask: a block sees the context
      features of tokens strictly before its anchor (causal across blocks) and its own
      block bidirectionally.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from thor_runtime.config import SpeculationSettings as _Defaults
from thor_runtime.errors import ThorError
from thor_runtime.models.config import check_attention_dims
from thor_runtime.models.dense import apply_rope, attend, rms_norm


@dataclass(frozen=True)
class DFlashConfig:
    tap_layers: tuple[int, ...]  # target layers whose output hidden states feed fc
    mask_token_id: int  # embedding row used for the B-1 masked block slots
    hidden_size: int  # = target D (fc output, shared embedding / lm_head)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    block_size: int = 16  # B: anchor + B-1 drafts per pass
    rms_eps: float = 1e-6
    rope_theta: float = 1e6
    target_id: str = ""  # informational: the target this drafter was trained for
    window: int = _Defaults.window  # default per-token context window W of the proposer
    # The target's weight kind when its taps were recorded ("fp32", "bf16", "int8", "int4";
    # "" unknown): low-bit weights shift the taps, and with them what the drafter predicts.
    target_weights: str = ""
    # The planner request format its training plans were written in (agent/planner/plan_format.py;
    # "" = unrecorded): a format change leaves the drafter predicting a document that is gone.
    plan_format: str = ""

    def __post_init__(self):
        taps = self.tap_layers
        if not isinstance(taps, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in taps
        ):
            raise ThorError(f"dflash config: tap_layers must be a list of layer ids, got {taps!r}")
        object.__setattr__(self, "tap_layers", tuple(taps))  # JSON gives a list; keep it hashable
        for k in (
            "mask_token_id",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "block_size",
            "window",
        ):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ThorError(f"dflash config: {k} must be an integer, got {v!r}")
        for k in ("target_weights", "plan_format"):
            if not isinstance(getattr(self, k), str):
                raise ThorError(f"dflash config: {k} must be a string, got {getattr(self, k)!r}")
        for k in ("rms_eps", "rope_theta"):
            if not isinstance(getattr(self, k), (int, float)):
                raise ThorError(f"dflash config: {k} must be a number, got {getattr(self, k)!r}")
        if not self.tap_layers:
            raise ThorError("dflash config: tap_layers is empty")
        if min(self.tap_layers) < 0 or len(set(self.tap_layers)) != len(self.tap_layers):
            raise ThorError(
                f"dflash config: tap_layers must be distinct non-negative ids, got "
                f"{list(self.tap_layers)}"
            )
        check_attention_dims(
            "dflash config",
            self,
            (
                "hidden_size",
                "num_layers",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "intermediate_size",
            ),
        )
        if self.block_size < 2:
            raise ThorError(f"dflash config: block_size must be >= 2, got {self.block_size}")
        if self.mask_token_id < 0:
            raise ThorError(f"dflash config: mask_token_id must be >= 0, got {self.mask_token_id}")
        if self.window < 0:
            raise ThorError(f"dflash config: window must be >= 0, got {self.window}")
        if not self.rms_eps > 0 or not self.rope_theta > 0:
            raise ThorError("dflash config: rms_eps and rope_theta must be positive")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)  # fp32 statistics, as the target


class Attention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        D, H, Hk, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.H, self.Hk, self.Dh = H, Hk, Dh
        self.q_proj = nn.Linear(D, H * Dh, bias=False)
        self.k_proj = nn.Linear(D, Hk * Dh, bias=False)
        self.v_proj = nn.Linear(D, Hk * Dh, bias=False)
        self.o_proj = nn.Linear(H * Dh, D, bias=False)
        self.q_norm = RMSNorm(Dh, cfg.rms_eps)
        self.k_norm = RMSNorm(Dh, cfg.rms_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, D] (context features or normed block hidden); cos/sin [B, T, Dh]
        -> k, v [B, Hkv, T, Dh] with k_norm and RoPE applied."""
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.Hk, self.Dh)).transpose(
            1, 2
        )  # [B, Hkv, T, Dh]
        v = self.v_proj(x).view(B, T, self.Hk, self.Dh).transpose(1, 2)  # [B, Hkv, T, Dh]
        return apply_rope(k, cos[:, None], sin[:, None]), v

    def forward(self, x, ctx_k, ctx_v, cos, sin, mask):
        """x [B, N, D] normed block hidden; ctx_k/ctx_v [B, Hkv, C, Dh]; cos/sin [B, N, Dh];
        mask None | bool/additive [B, 1, N, C+N]. -> [B, N, D]."""
        B, N, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, N, self.H, self.Dh)).transpose(1, 2)  # [B, H, N, Dh]
        q = apply_rope(q, cos[:, None], sin[:, None])
        bk, bv = self.kv(x, cos, sin)  # [B, Hkv, N, Dh]
        k = torch.cat([ctx_k, bk], dim=2)  # [B, Hkv, C+N, Dh]
        v = torch.cat([ctx_v, bv], dim=2)
        o = attend(q, k, v, mask)  # [B, H, N, Dh]
        return self.o_proj(o.transpose(1, 2).reshape(B, N, self.H * self.Dh))


class MLP(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, ctx_k, ctx_v, cos, sin, mask):
        h = h + self.self_attn(self.input_layernorm(h), ctx_k, ctx_v, cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


def block_attention_mask(
    ctx_pos: torch.Tensor,
    block_pos: torch.Tensor,
    block_size: int,
    ctx_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Training mask for several blocks per sequence -> bool [B, N, C+N] (True = attend).

    ctx_pos [B, C] absolute positions of the context features; block_pos [B, N] with
    N = nblk * block_size, each block's first position being its anchor's. A query in
    block b sees context entries with position < anchor_b (and ctx_valid), and all
    rows of block b — never another block.
    """
    B, N = block_pos.shape
    if N % block_size:
        raise ThorError(f"dflash: {N} block rows is not a multiple of block_size {block_size}")
    anchor = block_pos[:, ::block_size].repeat_interleave(block_size, dim=1)  # [B, N]
    ctx = ctx_pos[:, None, :] < anchor[:, :, None]  # [B, N, C]
    if ctx_valid is not None:
        ctx = ctx & ctx_valid[:, None, :].bool()
    blk = torch.arange(N, device=block_pos.device) // block_size
    own = (blk[:, None] == blk[None, :]).expand(B, N, N)  # [B, N, N]
    return torch.cat([ctx, own], dim=2)


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.cfg = cfg
        D = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.tap_layers) * D, D, bias=False)
        self.hidden_norm = RMSNorm(D, cfg.rms_eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(D, cfg.rms_eps)
        # Plain attributes, not buffers: kept fp32 whatever the module dtype (bf16 inverse
        # frequencies would smear positions), and the target's tensors stay shared.
        d = cfg.head_dim
        self.inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d)
        )
        self.inv_freq = self.inv_freq.float()  # [Dh/2]
        self.embed_w: torch.Tensor | None = None  # [V, D] target's, frozen
        self.lm_head_w: torch.Tensor | None = None  # [V, D] target's, frozen
        self._mask_emb: torch.Tensor | None = None  # [D] cached embedding of the mask token
        self.draft_vocab = None  # DraftVocab | None: the head's shortlist
        self.row_block = None  # dflash_rows.RowDrafter (set by DFlashProposer)

    # ---- the shared, frozen target pieces
    def bind_target(self, embed_w: torch.Tensor, lm_head_w: torch.Tensor) -> "DFlashDrafter":
        V, D = embed_w.shape
        if D != self.cfg.hidden_size or tuple(lm_head_w.shape) != (V, D):
            raise ThorError(
                f"dflash: target embedding {list(embed_w.shape)} / lm_head "
                f"{list(lm_head_w.shape)} do not fit drafter hidden size {self.cfg.hidden_size}"
            )
        if self.cfg.mask_token_id >= V:
            raise ThorError(
                f"dflash: mask_token_id {self.cfg.mask_token_id} is outside the target "
                f"vocabulary of {V}"
            )
        self.embed_w, self.lm_head_w, self._mask_emb = embed_w, lm_head_w, None
        return self

    def _need_target(self):
        if self.embed_w is None or self.lm_head_w is None:
            raise ThorError(
                "dflash: drafter has no target embedding / lm_head; call bind_target first"
            )

    @property
    def dtype(self) -> torch.dtype:
        return (
            self.hidden_norm.weight.dtype
        )  # the projections may be the row kernel's (row_linear.py)

    def rope(self, pos: torch.Tensor):
        """pos [..., T] long -> cos, sin [..., T, Dh] in the drafter dtype (angles in fp32)."""
        if self.inv_freq.device != pos.device:
            self.inv_freq = self.inv_freq.to(pos.device)  # once per device
        ang = pos.to(torch.float32)[..., None] * self.inv_freq  # [..., T, Dh/2]
        ang = torch.cat([ang, ang], dim=-1)  # [..., T, Dh]
        return ang.cos().to(self.dtype), ang.sin().to(self.dtype)

    # ---- context features
    def concat_taps(self, taps: dict[int, torch.Tensor]) -> torch.Tensor:
        """{layer: [T, D]} -> [T, n_taps*D] in cfg.tap_layers order (the fc input layout)."""
        missing = [t for t in self.cfg.tap_layers if t not in taps]
        if missing:
            raise ThorError(f"dflash: target taps lack layers {missing}")
        return torch.cat([taps[t] for t in self.cfg.tap_layers], dim=-1)

    def project(self, raw: torch.Tensor) -> torch.Tensor:
        """raw [..., n_taps*D] -> context features [..., D]."""
        return self.hidden_norm(self.fc(raw.to(self.dtype)))

    # ---- inference: one block, batch 1
    def context_kv(self, feats: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """feats [C, D], pos [C] -> [L, 2, Hkv, C, Dh]: every layer's context K (normed,
        rotated) and V. Cached by the proposer, one entry per committed token."""
        cos, sin = self.rope(pos[None])  # [1, C, Dh]
        out = [
            torch.stack([t[0] for t in layer.self_attn.kv(feats[None], cos, sin)])
            for layer in self.layers
        ]  # L x [2, Hkv, C, Dh]
        return torch.stack(out)

    def mask_embedding(self) -> torch.Tensor:
        """[D]: the mask token's embedding, the input of a block's rows after the anchor (kept)."""
        if self._mask_emb is None:
            self._mask_emb = self.embed_w[self.cfg.mask_token_id].to(self.dtype)
        return self._mask_emb

    def block_input(self, anchor_id: int, Bk: int) -> torch.Tensor:
        """[Bk, D]: a block's embedded rows, the anchor's then Bk - 1 mask tokens'."""
        return torch.cat(
            [self.embed_w[anchor_id].to(self.dtype)[None], self.mask_embedding().expand(Bk - 1, -1)]
        )

    def draft_block(
        self,
        ctx_kv: torch.Tensor | None,
        anchor_id: int,
        anchor_pos: int,
        n: int,
        block_size: int | None = None,
        head: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ctx_kv [L, 2, Hkv, C, Dh] or None (block attends to itself only) -> logits [n, V]
        (fp32) of block rows 1..n, i.e. the tokens at anchor_pos+1 .. anchor_pos+n.
        head: rows of the lm_head to score, [V', D] (a draft vocabulary) -> logits [n, V']."""
        self._need_target()
        Bk = block_size or self.cfg.block_size
        if not 1 <= n <= Bk - 1:
            raise ThorError(f"dflash: can draft 1..{Bk - 1} tokens per block, asked for {n}")
        dev = self.embed_w.device
        h = self.block_input(anchor_id, Bk)[None]  # [1, Bk, D]
        cos, sin = self.rope(
            torch.arange(anchor_pos, anchor_pos + Bk, device=dev)[None]
        )  # [1, Bk, Dh]
        if ctx_kv is None:
            Hk, Dh = self.cfg.num_kv_heads, self.cfg.head_dim
            ctx_kv = h.new_zeros(len(self.layers), 2, Hk, 0, Dh)
        for i, layer in enumerate(self.layers):
            h = layer(h, ctx_kv[i, 0][None], ctx_kv[i, 1][None], cos, sin, None)
        return self.score(self.norm(h[0, 1 : n + 1]), head)  # [n, V]

    def score(self, hn: torch.Tensor, head: torch.Tensor | None = None) -> torch.Tensor:
        """hn [n, D] normed block rows -> logits [n, V] (fp32) over ``head`` rows (None = all)."""
        # W @ h^T rather than h @ W^T: on CPU (MKL) h @ W^T re-streams the [V, D] head for
        # row counts that are not a multiple of 16 (15 rows measured ~2x slower); W @ h^T
        # reads it once whatever n is, and the head read is most of a propose.
        if isinstance(head, nn.Module):  # the draft head's rows on the row kernel
            return head(hn).float()
        w = self.lm_head_w if head is None else head
        return torch.mm(w, hn.t()).t().float()  # [n, V]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] (after the final norm) -> [..., V] fp32 via the target lm_head."""
        self._need_target()
        return F.linear(hidden, self.lm_head_w.to(hidden.dtype)).float()

    # ---- training: batched, several blocks per sequence
    def forward(
        self,
        block_ids: torch.Tensor,
        block_pos: torch.Tensor,
        ctx_pos: torch.Tensor,
        ctx_feats: torch.Tensor | None = None,
        ctx_taps: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """block_ids, block_pos [B, N]; ctx_pos [B, C]; exactly one of ctx_feats [B, C, D]
        (projected) or ctx_taps [B, C, n_taps*D] (raw); attn_mask see module doc.
        -> final-normed hidden [B, N, D] (``logits`` turns it into [B, N, V])."""
        self._need_target()
        if (ctx_feats is None) == (ctx_taps is None):
            raise ThorError("dflash: pass exactly one of ctx_feats and ctx_taps")
        feats = (
            self.project(ctx_taps) if ctx_taps is not None else ctx_feats.to(self.dtype)
        )  # [B, C, D]
        B, N = block_ids.shape
        C = feats.shape[1]
        if tuple(block_pos.shape) != (B, N) or tuple(ctx_pos.shape) != (B, C):
            raise ThorError(
                f"dflash: block_pos {list(block_pos.shape)} / ctx_pos {list(ctx_pos.shape)} "
                f"do not match block_ids [{B}, {N}] / context [{B}, {C}]"
            )
        mask = self._full_mask(attn_mask, B, N, C, block_ids.device)  # [B, 1, N, C+N]
        h = F.embedding(block_ids, self.embed_w).to(self.dtype)  # [B, N, D]
        cos, sin = self.rope(block_pos)  # [B, N, Dh]
        ccos, csin = self.rope(ctx_pos)  # [B, C, Dh]
        for layer in self.layers:
            ck, cv = layer.self_attn.kv(feats, ccos, csin)  # [B, Hkv, C, Dh]
            h = layer(h, ck, cv, cos, sin, mask)
        return self.norm(h)

    def _full_mask(self, attn_mask, B, N, C, dev):
        if attn_mask is not None and attn_mask.dim() == 3:
            if tuple(attn_mask.shape) != (B, N, C + N):
                raise ThorError(
                    f"dflash: attn_mask {list(attn_mask.shape)}, expected [{B}, {N}, {C + N}]"
                )
            if attn_mask.dtype != torch.bool:
                attn_mask = attn_mask.to(self.dtype)  # additive
            return attn_mask[:, None]
        if attn_mask is not None and tuple(attn_mask.shape) != (B, C):
            raise ThorError(
                f"dflash: attn_mask {list(attn_mask.shape)}, expected [{B}, {C}] or "
                f"[{B}, {N}, {C + N}]"
            )
        Bk = self.cfg.block_size if N % self.cfg.block_size == 0 else N
        if attn_mask is None and N == Bk:
            return None  # one block, all context: no mask at all
        ctx = (
            torch.ones(B, C, dtype=torch.bool, device=dev)
            if attn_mask is None
            else attn_mask.bool()
        )[:, None, :].expand(B, N, C)
        blk = torch.arange(N, device=dev) // Bk
        own = (blk[:, None] == blk[None, :]).expand(B, N, N)
        return torch.cat([ctx, own], dim=2)[:, None]
