"""Sparse mixture-of-experts MLP blocks of hybrid targets (Qwen3-Next, Qwen3.5-MoE).

The block follows transformers' implementation: a router (a linear map to one logit per
expert, softmax over the experts in fp32, the top-k, renormalised to sum 1 when
``norm_topk_prob``) picks k of E SwiGLU experts per token and sums their outputs weighted by
the router weights; a shared expert (a SwiGLU MLP every token takes) is added, scaled by
sigmoid of its own one-row gate.

Checkpoint forms. Qwen3-Next's published checkpoints keep one tensor per expert
(``mlp.experts.{e}.gate_proj.weight`` [I, D], ``up_proj`` [I, D], ``down_proj`` [D, I]);
Qwen3.5-MoE's keep the fused 3-D tensors transformers itself uses (``mlp.experts.gate_up_proj``
[E, 2 I, D], each expert's gate rows then its up rows, and ``mlp.experts.down_proj`` [E, D, I]),
into which transformers merges the per-expert form on load. Both forms are accepted for
either architecture, checked under the file's own names and turned into the fused one.

Exactness. A speculative verify's rows must carry the very bits 1-row decode steps give
them. Up to EXACT_ROWS rows (decode, verify) the routed part runs token by token: softmax,
top-k and each chosen expert's two matmuls on that token's row alone, summed in rank order,
which is the computation a 1-row step makes whatever the other rows hold. The router and
the shared expert are ordinary projections over all rows, held like the dense ones and
wrapped in a RowLoop where the probe finds their kernel not row-invariant. Longer inputs
(prefill, never part of a verify) group the tokens by expert, one matmul per expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from thor_runtime.models.dense import (
    EXACT_ROWS,
    Int8Weight,
    PackedWeight,
    RowLoop,
    Weight,
    linear,
    rows_invariant,
)

GATE_UP, DOWN = "experts.gate_up_proj", "experts.down_proj"
PER_EXPERT = ("gate_proj", "up_proj", "down_proj")


# ---- checkpoint tensors (names relative to a layer's "mlp." prefix)
def per_expert_prefixes(weights: dict[str, torch.Tensor]) -> set[str]:
    """The "model.layers.{i}.mlp." prefixes under which the file keeps one tensor per expert."""
    out = set()
    for k in weights:
        head, sep, tail = k.partition(".mlp.experts.")
        if sep and tail.split(".", 1)[0].isdigit():
            out.add(head + ".mlp.")
    return out


def is_fused(cfg, m: str, weights: dict[str, torch.Tensor] | None, per_expert: set[str]) -> bool:
    """Which form layer prefix ``m`` is checked in: the file's own, else the published one."""
    if weights is not None and (m + GATE_UP in weights or m + DOWN in weights):
        return True
    if m in per_expert:
        return False
    return cfg.arch != "qwen3_next"


def moe_shapes(cfg, m: str, fused: bool) -> dict[str, tuple[int, ...]]:
    D, E, Di, Is = (
        cfg.hidden_size,
        cfg.num_experts,
        cfg.moe_intermediate_size,
        cfg.shared_expert_intermediate_size,
    )
    shapes = {
        m + "gate.weight": (E, D),
        m + "shared_expert_gate.weight": (1, D),
        m + "shared_expert.gate_proj.weight": (Is, D),
        m + "shared_expert.up_proj.weight": (Is, D),
        m + "shared_expert.down_proj.weight": (D, Is),
    }
    if fused:
        shapes.update({m + GATE_UP: (E, 2 * Di, D), m + DOWN: (E, D, Di)})
    else:
        for e in range(E):
            shapes.update(
                {
                    m + f"experts.{e}.gate_proj.weight": (Di, D),
                    m + f"experts.{e}.up_proj.weight": (Di, D),
                    m + f"experts.{e}.down_proj.weight": (D, Di),
                }
            )
    return shapes


def fuse_experts(out: dict[str, torch.Tensor], m: str, num_experts: int) -> None:
    """Per-expert tensors under ``m`` -> the fused gate_up [E, 2 I, D] and down [E, D, I], in
    place."""
    if m + GATE_UP in out:
        return
    take = {
        n: [out.pop(m + f"experts.{e}.{n}.weight") for e in range(num_experts)] for n in PER_EXPERT
    }
    out[m + GATE_UP] = torch.cat(
        [torch.stack(take["gate_proj"]), torch.stack(take["up_proj"])], dim=1
    )
    out[m + DOWN] = torch.stack(take["down_proj"])


# ---- the block
def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in storage of its own: MKL's GEMV bits depend on the operand's alignment, so a
    tensor left at its byte offset in the file would give other bits than the same weights
    read from a file in the other expert form."""
    return t.clone() if t.data_ptr() % 64 else t


class Experts:
    """E SwiGLU experts. Plain tensors in the compute dtype, or int8 per expert: decode and
    verify call an expert on one row, where a plain GEMV is the fastest kernel, so they are
    neither packed nor held twice."""

    def __init__(
        self,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        dtype: torch.dtype,
        device,
        quant: str | None,
    ):
        self.n = gate_up.shape[0]
        if quant:
            self.gate_up = [
                Int8Weight(w.to(device), keep_dense=False) for w in gate_up
            ]  # [2 I, D] each
            self.down = [Int8Weight(w.to(device), keep_dense=False) for w in down]  # [D, I] each
        else:
            self.gate_up = _aligned(
                gate_up.to(device=device, dtype=dtype).contiguous()
            )  # [E, 2 I, D]
            self.down = _aligned(down.to(device=device, dtype=dtype).contiguous())  # [E, D, I]

    def __call__(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """x [M, D] -> expert e's output [M, D]."""
        gate, up = linear(x, self.gate_up[e]).chunk(2, dim=-1)  # [M, I] each
        return linear(F.silu(gate) * up, self.down[e])


@dataclass
class MoEBlock:
    router: Weight  # [E + 1, D] fp32: the E router rows, then the shared expert's gate row
    experts: Experts
    top_k: int
    norm_topk: bool

    @classmethod
    def build(
        cls,
        cfg,
        weights: dict[str, torch.Tensor],
        m: str,
        dtype: torch.dtype,
        device,
        quant: str | None,
        layout: str,
    ) -> MoEBlock:
        # The router stays fp32 even for int8/bf16 weights: its output is a discrete choice.
        r = torch.cat([weights[m + "gate.weight"], weights[m + "shared_expert_gate.weight"]])
        r = r.to(device=device, dtype=torch.float32).contiguous()
        if layout in ("packed", "dual") and PackedWeight.available(
            torch.float32, torch.device(device)
        ):
            r = PackedWeight(r, dense=r if layout == "dual" else None)
        return cls(
            r,
            Experts(weights[m + GATE_UP], weights[m + DOWN], dtype, device, quant),
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
        )

    def make_rows_exact(self, verdict: dict[str, bool], device: torch.device) -> bool:
        """Wrap the router in a RowLoop unless its kernel is row-invariant (one probe per kernel
        and shape, kept in ``verdict``). -> whether wrapped."""
        w = self.router
        key = (
            f"router{type(w).__name__}{tuple(w.shape)}"
            f"{'+dense' if getattr(w, 'dense', None) is not None else ''}"
        )
        if key not in verdict:
            verdict[key] = rows_invariant(w, w.shape[1], torch.float32, device)
        if not verdict[key]:
            self.router = RowLoop(w)
        return not verdict[key]

    def _route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [..., E] -> router weights [..., k] fp32 and expert ids [..., k]."""
        p = torch.softmax(logits, dim=-1, dtype=torch.float32)
        w, idx = torch.topk(p, self.top_k, dim=-1)
        return (w / w.sum(dim=-1, keepdim=True) if self.norm_topk else w), idx

    def __call__(self, x: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
        """x [T, D] normed input, shared [T, D] the shared expert's output ->
        block output [T, D]."""
        E = self.experts.n
        logits = linear(x.float(), self.router)  # [T, E + 1]
        routed = (
            self._by_token(x, logits[:, :E])
            if x.shape[0] <= EXACT_ROWS
            else self._by_expert(x, logits[:, :E])
        )
        return (routed + torch.sigmoid(logits[:, E:]) * shared.float()).to(x.dtype)

    def _by_token(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Each token alone (see the module docstring): row t's bits do not depend on the others."""
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)  # [T, D]
        for t in range(x.shape[0]):
            w, idx = self._route(logits[t])  # [k] each
            acc = None
            for j, e in enumerate(idx.tolist()):
                y = self.experts(e, x[t : t + 1]).float() * w[j]  # [1, D]
                acc = y if acc is None else acc + y
            out[t] = acc[0]
        return out

    def _by_expert(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        w, idx = self._route(logits)  # [T, k] each
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, D]
        for e in idx.unique().tolist():
            tok, slot = (idx == e).nonzero(as_tuple=True)
            out.index_add_(0, tok, self.experts(e, x[tok]).float() * w[tok, slot, None])
        return out
