"""Hybrid target: Gated-DeltaNet layers with every few layers a gated full attention.

Segments, as in the dense model (thor_runtime/models/dense.py), with a second kind of mixer:

  embed -> per layer [pre_attn -> attention -> post_attn]   (full-attention layers)
                     [pre_gdn  -> gdn       -> post_gdn ]   (GDN layers)
        -> head

``pre_*`` / ``post_*`` are dense, shape-stable work (norms, projections, MLP) that a backend can
replace; ``attention`` and ``gdn`` are the only parts that touch the cache (KV for attention,
recurrent state for GDN). Norms are zero-centred in these checkpoints (scale 1 + w); the
weight is stored as 1 + w so the shared ``rms_norm`` applies it. Full attention differs from
Qwen3 by an output gate (q_proj carries a gate per head) and partial RoPE. In a layer with
a mixture-of-experts block (moe.py), it replaces the dense MLP; its shared expert takes the
dense MLP's slots (``w_gate_up`` / ``w_down``). ``forward`` runs such a layer as the dense
``pre_moe`` (out proj, residual, norm), then ``moe_block`` here, then the residual add.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from thor_runtime.cache.kv_cache import KVCache, KVScales
from thor_runtime.errors import ThorError
from thor_runtime.models.dense import (
    ForwardOut,
    Int8Weight,
    PackedWeight,
    TargetModel,
    Weight,
    apply_rope,
    linear,
    make_rows_exact,
    residual_mlp,
    resolve_layout,
    rms_norm,
)
from thor_runtime.models.hybrid import gdn as G
from thor_runtime.models.hybrid.config import HybridConfig
from thor_runtime.models.hybrid.moe import MoEBlock
from thor_runtime.models.hybrid.state import MAX_SLOTS, HybridCache, RecurrentState
from thor_runtime.models.hybrid.weights import canonical, check_hybrid_weights


@dataclass
class HybridLayer:
    kind: str  # "attn" | "gdn"
    in_norm: torch.Tensor  # [D] (1 + w)
    w_in: Weight  # attn: [2 H Dh + 2 Hkv Dh, D]; gdn: [C + Vd + 2 Hv, D]
    w_out: Weight  # attn: [D, H Dh]; gdn: [D, Vd]
    mlp_norm: torch.Tensor  # [D]
    w_gate_up: Weight  # [2 I, D] (MoE layers: the shared expert's, [2 Is, D])
    w_down: Weight  # [D, I]
    q_norm: torch.Tensor | None = None  # [Dh] (attn)
    k_norm: torch.Tensor | None = None
    gdn: G.GDNWeights | None = None
    out_norm: torch.Tensor | None = None  # [dv] gated RMSNorm weight (gdn; plain scale)
    moe: MoEBlock | None = None  # router + routed experts (MoE layers)


class HybridModel:
    """Batch-1 hybrid decoder; a ``target.Target`` like TargetModel (forward, prefill, verify, taps,
    new_cache). No runner: its mixers and recurrent state run here, eager."""

    is_hybrid = True
    # What runs the dense segments in ``forward`` (engines: ONNX Runtime, TensorRT), and what a
    # verify runs them through; None = the methods below. The mixers always stay here.
    backend = backend_exact = None

    def __init__(
        self,
        cfg: HybridConfig,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        source: str = "weights",
        device: str | torch.device = "cpu",
        quant: str | None = None,
        layout: str = "auto",
    ):
        check_hybrid_weights(cfg, weights, source)
        self.source = source  # the checkpoint's path: what a stored prefix is keyed by
        weights = canonical(cfg, weights)
        self.cfg, self.device, self.quant = cfg, torch.device(device), quant
        self.dtype, self.layout = dtype, layout = resolve_layout(
            dtype, self.device, quant, layout, ("int8",)
        )

        def held(t: torch.Tensor):
            if layout == "dense":
                return t
            return PackedWeight(t, dense=t if layout == "dual" else None)

        def f32(name, plus_one=False):
            t = weights[name].to(device=self.device, dtype=torch.float32)
            return (t + 1.0 if plus_one else t).contiguous()

        def proj(*names):
            t = torch.cat([weights[n].to(self.device) for n in names]).contiguous()
            return Int8Weight(t) if quant else held(t.to(dtype))

        self.embed_w = (
            weights["model.embed_tokens.weight"].to(device=self.device, dtype=dtype).contiguous()
        )
        self.lm_head = (
            self.embed_w
            if cfg.tie_word_embeddings
            else weights["lm_head.weight"].to(device=self.device, dtype=dtype).contiguous()
        )
        self.head_w = Int8Weight(self.lm_head, keep_dense=False) if quant else held(self.lm_head)
        self.final_norm = f32("model.norm.weight", plus_one=True)
        self.layers: list[HybridLayer] = []
        for i, kind in enumerate(cfg.layer_types):
            p = f"model.layers.{i}."
            m = p + ("mlp.shared_expert." if i in cfg.moe_layers else "mlp.")
            common = dict(
                in_norm=f32(p + "input_layernorm.weight", True),
                mlp_norm=f32(p + "post_attention_layernorm.weight", True),
                w_gate_up=proj(m + "gate_proj.weight", m + "up_proj.weight"),
                w_down=proj(m + "down_proj.weight"),
            )
            if i in cfg.moe_layers:
                common["moe"] = MoEBlock.build(
                    cfg, weights, p + "mlp.", dtype, self.device, quant, layout
                )
            if kind == "full_attention":
                a = p + "self_attn."
                self.layers.append(
                    HybridLayer(
                        "attn",
                        w_in=proj(*(a + f"{n}_proj.weight" for n in "qkv")),
                        w_out=proj(a + "o_proj.weight"),
                        q_norm=f32(a + "q_norm.weight", True),
                        k_norm=f32(a + "k_norm.weight", True),
                        **common,
                    )
                )
            else:
                g = p + "linear_attn."
                gw = G.GDNWeights(
                    conv_w=f32(g + "conv1d.weight")[:, 0],
                    neg_A=-f32(g + "A_log").exp(),
                    dt_bias=f32(g + "dt_bias"),
                    num_k_heads=cfg.linear_num_key_heads,
                    num_v_heads=cfg.linear_num_value_heads,
                    dk=cfg.linear_key_head_dim,
                    dv=cfg.linear_value_head_dim,
                )
                self.layers.append(
                    HybridLayer(
                        "gdn",
                        w_in=proj(*(g + f"in_proj_{n}.weight" for n in ("qkv", "z", "b", "a"))),
                        w_out=proj(g + "out_proj.weight"),
                        gdn=gw,
                        out_norm=f32(g + "norm.weight"),
                        **common,
                    )
                )
        self.row_loops = make_rows_exact(self, ("w_in", "w_out", "w_gate_up", "w_down"))
        verdict: dict[str, bool] = {}
        wrapped = [
            L.moe.make_rows_exact(verdict, self.device) for L in self.layers if L.moe is not None
        ]
        if any(wrapped):
            self.row_loops.append("router")
        self.attn_index = {layer: j for j, layer in enumerate(cfg.attn_layers)}
        self.gdn_index = {layer: j for j, layer in enumerate(cfg.gdn_layers)}
        rot = cfg.rotary_dim
        self.inv_freq = (
            1.0 / (cfg.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
        ).float()
        self._rope_len = 0
        self._ensure_rope(min(cfg.max_position_embeddings, 4096))

    # ---- cache: the hook Runtime uses instead of building a KVCache itself
    def new_cache(
        self,
        capacity: int,
        kv_dtype: str = "fp32",
        kv_scales: KVScales | None = None,
        naive: bool = False,
    ) -> HybridCache:
        acfg = self.cfg.attn_cfg()
        if kv_scales is not None and kv_scales.k.shape[0] == self.cfg.num_layers:
            idx = torch.tensor(self.cfg.attn_layers)  # a per-layer file: keep the attention rows
            kv_scales = KVScales(kv_scales.k[idx], kv_scales.v[idx], kv_scales.prompt_set_sha256)
        kv = KVCache(acfg, capacity, kv_dtype, self.dtype, kv_scales, self.device)
        c = self.cfg
        rec = RecurrentState(
            len(c.gdn_layers),
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
            c.conv_dim,
            c.linear_conv_kernel,
            self.device,
            naive,
        )
        cache = HybridCache(kv, rec)
        cache.reforward = lambda ids: self.forward(ids, cache, logits_rows="none", exact=True)
        return cache

    # ---- rope (partial: the first rotary_dim dims of each head rotate, the rest pass)
    def ensure_positions(self, n: int) -> None:
        self._ensure_rope(n)

    def _ensure_rope(self, n: int) -> None:
        if n <= self._rope_len:
            return
        freqs = torch.outer(torch.arange(n, dtype=torch.float32), self.inv_freq)  # [S, rot/2]
        emb = torch.cat((freqs, freqs), dim=-1).to(self.device)  # [S, rot]
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        self._rope_len = n

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [H, T, Dh] -> same, first rotary_dim dims rotated."""
        rot = self.cfg.rotary_dim
        cos, sin = self.cos[pos].unsqueeze(-3), self.sin[pos].unsqueeze(-3)  # [1, T, rot]
        return torch.cat((apply_rope(x[..., :rot], cos, sin), x[..., rot:]), dim=-1)

    # ---- segments
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_w)  # [T, D]

    def pre_attn(self, i: int, h: torch.Tensor, pos: torch.Tensor):
        """h [T, D] -> q [H, T, Dh], k/v [Hkv, T, Dh] (normed, partial RoPE), gate [T, H Dh]."""
        cfg, L = self.cfg, self.layers[i]
        T, H, Dh, Hk = h.shape[0], cfg.num_heads, cfg.head_dim, cfg.num_kv_heads
        x = rms_norm(h, L.in_norm, cfg.rms_eps)
        qg, k, v = linear(x, L.w_in).split([2 * H * Dh, Hk * Dh, Hk * Dh], dim=-1)
        q, gate = qg.view(T, H, 2 * Dh).chunk(2, dim=-1)  # [T, H, Dh] each
        q = rms_norm(q, L.q_norm, cfg.rms_eps).transpose(0, 1)  # [H, T, Dh]
        k = rms_norm(k.view(T, Hk, Dh), L.k_norm, cfg.rms_eps).transpose(0, 1)  # [Hkv, T, Dh]
        v = v.view(T, Hk, Dh).transpose(0, 1)
        return self._rope(q, pos), self._rope(k, pos), v, gate.reshape(T, H * Dh)

    def attention(self, i: int, q, k, v, cache: HybridCache, exact: bool = False) -> torch.Tensor:
        """The dense model's cached causal attention on this layer's slot of the KV cache."""
        return TargetModel.attention(
            self, self.attn_index[i], q, k, v, cache.kv, exact
        )  # [T, H Dh]

    def pre_gdn(self, i: int, h: torch.Tensor):
        """h [T, D] -> conv inputs qkv [T, C], gate z [T, Vd], b [T, Hv], a [T, Hv]."""
        c = self.cfg
        x = rms_norm(h, self.layers[i].in_norm, c.rms_eps)
        Hv = c.linear_num_value_heads
        return linear(x, self.layers[i].w_in).split([c.conv_dim, c.value_dim, Hv, Hv], dim=-1)

    def gdn(
        self, i: int, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, cache: HybridCache
    ) -> torch.Tensor:
        """Conv + gated delta rule over T rows -> [T, Hv, dv] fp32. Recurrent form with one
        checkpoint slot per row when the cache says so, else the chunked form."""
        w, rec, j = self.layers[i].gdn, cache.rec, self.gdn_index[i]
        T = qkv.shape[0]
        win = torch.cat([rec.conv_state(j), qkv.float()])  # [k-1+T, C]
        b, a = b.float(), a.float()
        if cache.checkpointed:
            out = torch.empty(T, w.num_v_heads, w.dv, device=qkv.device)
            src = rec.current(j)
            for t in range(T):  # row by row, exactly the decode step: slot t = state after row t
                dst = rec.slot(j, t)
                out[t] = G.step(w, win[t : t + rec.kernel], b[t], a[t], src, dst)
                src = dst
            rec.conv[j] = win
            return out
        out, s = G.chunked(w, win, b, a, rec.current(j))
        rec.ssm[j][0] = s
        rec.conv[j] = win[-rec.kernel :].clone()
        return out

    def post_gdn(self, i: int, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Gated RMSNorm per value head: norm(core) * w * SiLU(z) -> [T, Vd]."""
        L, T = self.layers[i], core.shape[0]
        zf = z.float().view(T, -1, self.cfg.linear_value_head_dim)  # [T, Hv, dv]
        y = core * torch.rsqrt(core.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps)
        return (L.out_norm * y * F.silu(zf)).reshape(T, -1).to(self.dtype)

    def post_attn(self, i: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """h [T, D] residual, o [T, *] mixer output -> next h (out proj, residual, MLP)."""
        L = self.layers[i]
        if L.moe is not None:
            h, x = self.pre_moe(i, h, o)
            return h + self.moe_block(i, x)
        return residual_mlp(h, o, L.w_out, L.mlp_norm, L.w_gate_up, L.w_down, self.cfg.rms_eps)

    def pre_moe(self, i: int, h: torch.Tensor, o: torch.Tensor):
        """A MoE layer's dense part after its mixer: h [T, D], o [T, *] -> h + out proj [T, D]
        and its RMSNorm x [T, D], the MoE block's input."""
        L = self.layers[i]
        h = h + linear(o, L.w_out)
        return h, rms_norm(h, L.mlp_norm, self.cfg.rms_eps)

    def moe_block(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] -> the MoE block's output [T, D] (shared expert, router, routed experts). Stays
        eager under a backend: routing is data-dependent and exact per row (moe.py)."""
        L = self.layers[i]
        gate, up = linear(x, L.w_gate_up).chunk(2, dim=-1)  # [T, Is] each
        return L.moe(x, linear(F.silu(gate) * up, L.w_down))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return linear(rms_norm(h, self.final_norm, self.cfg.rms_eps), self.head_w).float()  # [R, V]

    # ---- whole forward
    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        cache: HybridCache,
        taps: tuple[int, ...] = (),
        logits_rows: str | slice = "all",
        chunked: bool | None = None,
        exact: bool = False,
    ) -> ForwardOut:
        """ids [T] continue the sequence. chunked: None = the recurrent form with one checkpoint
        slot per row when continuing a sequence with T <= MAX_SLOTS rows (decode, verify), the
        chunked form for a whole sequence on an empty cache or longer inputs; True/False force."""
        start, T = cache.length, ids.shape[0]
        if start + T > self.cfg.max_position_embeddings:
            raise ThorError(
                f"sequence of {start + T} tokens exceeds the model context "
                f"{self.cfg.max_position_embeddings}"
            )
        self._ensure_rope(start + T)
        recurrent = not chunked if chunked is not None else (start > 0 and T <= MAX_SLOTS)
        cache.begin(ids, recurrent)
        seg = self if self.backend is None else self.backend_exact if exact else self.backend
        h = seg.embed(ids.to(self.device))
        pos = torch.arange(start, start + T, device=self.device)  # [T]
        out = ForwardOut(None)
        for i, L in enumerate(self.layers):
            if L.kind == "attn":
                q, k, v, gate = seg.pre_attn(i, h, pos)
                o = self.attention(i, q, k, v, cache, exact) * torch.sigmoid(gate)
            else:
                qkv, z, b, a = seg.pre_gdn(i, h)
                o = seg.post_gdn(i, self.gdn(i, qkv, b, a, cache), z)
            if L.moe is not None:
                h, x = seg.pre_moe(i, h, o)
                h = h + self.moe_block(i, x)
            else:
                h = seg.post_attn(i, h, o)
            if i in taps:
                out.taps[i] = h
        cache.end()
        if logits_rows != "none":
            rows = {"all": slice(None), "last": slice(-1, None)}.get(logits_rows, logits_rows)
            out.logits = seg.head(h[rows])
        return out

    def verify(
        self, ids: torch.Tensor, cache: HybridCache, taps: tuple[int, ...] = (), cols=None
    ) -> ForwardOut:
        """The decode cycle's forward (see TargetModel.verify): row-invariant projections,
        attention per row and the GDN recurrence row by row with a checkpoint slot per row, so
        each row — and the state a partial accept keeps — is bit-for-bit a 1-row step's (for up
        to EXACT_ROWS rows; one forward, because the slots of one verify serve the rollback)."""
        return self.forward(ids, cache, taps, exact=True)

    def prefill(
        self,
        ids: torch.Tensor,
        cache: HybridCache,
        chunk: int = 0,
        taps: tuple[int, ...] = (),
        tap_rows: int = 0,
    ) -> ForwardOut:
        """The prompt in chunks of ``chunk`` tokens (0 = one pass), chunked GDN form; the recurrent
        state is carried from chunk to chunk. Last-row logits, taps of the last ``tap_rows``
        rows."""
        T = ids.shape[0]
        step = chunk if chunk and chunk > 0 else T
        parts: dict[int, list[torch.Tensor]] = {i: [] for i in taps}
        out = ForwardOut(None)
        for s in range(0, T, step):
            e = min(T, s + step)
            want = taps if tap_rows and e > T - tap_rows else ()
            o = self.forward(
                ids[s:e], cache, taps=want, logits_rows="last" if e == T else "none", chunked=True
            )
            for i, t in o.taps.items():
                parts[i].append(t[max(0, T - tap_rows - s) :])
            out.logits = o.logits
        if tap_rows:
            out.taps = {i: torch.cat(p) for i, p in parts.items()}
        return out
