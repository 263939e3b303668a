"""Preallocated per-sequence KV cache with fp32 / bf16 / fp16 / fp8-e4m3 storage.

FP8 keeps one byte per element and a scale per (layer, kv head) for K and for V:
stored = clamp(x / scale, ±448) in e4m3, read back as stored * scale. Attention
always sees the dequantized view in the model's compute dtype.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from thor_runtime.errors import ThorError
from thor_runtime.fileio import read_json, write_json_atomic
from thor_runtime.models.config import ModelConfig

KV_DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}
FP8_MAX = 448.0  # largest finite e4m3fn value


@dataclass(frozen=True)
class KVScales:
    """Per-layer, per-KV-head scales. File format (JSON):

    {"format": "thor-kv-scales/1", "num_layers": L, "num_kv_heads": H,
     "k": [[s_l0h0, ...], ...], "v": [[...], ...], "prompt_set_sha256": "..."}
    """

    k: torch.Tensor  # [L, Hkv] fp32
    v: torch.Tensor  # [L, Hkv] fp32
    prompt_set_sha256: str = ""

    @classmethod
    def unit(cls, cfg: ModelConfig) -> "KVScales":
        ones = torch.ones(cfg.num_layers, cfg.num_kv_heads)
        return cls(ones, ones.clone())

    def save(self, path: str | Path) -> None:
        doc = {
            "format": "thor-kv-scales/1",
            "num_layers": int(self.k.shape[0]),
            "num_kv_heads": int(self.k.shape[1]),
            "k": self.k.tolist(),
            "v": self.v.tolist(),
            "prompt_set_sha256": self.prompt_set_sha256,
        }
        write_json_atomic(path, doc)

    @classmethod
    def load(cls, path: str | Path, cfg: ModelConfig) -> "KVScales":
        doc = read_json(path, "KV scales file")
        if doc.get("format") != "thor-kv-scales/1":
            raise ThorError(f"KV scales file {path}: expected format 'thor-kv-scales/1'")
        want = (cfg.num_layers, cfg.num_kv_heads)
        k, v = (
            torch.tensor(doc.get("k", []), dtype=torch.float32),
            torch.tensor(doc.get("v", []), dtype=torch.float32),
        )
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise ThorError(
                f"KV scales file {path}: shape k{tuple(k.shape)} v{tuple(v.shape)} does not "
                f"match the model's [layers, kv_heads] = {list(want)}"
            )
        if not (
            torch.isfinite(k).all() and torch.isfinite(v).all() and (k > 0).all() and (v > 0).all()
        ):
            raise ThorError(f"KV scales file {path}: scales must be finite and positive")
        return cls(k, v, str(doc.get("prompt_set_sha256", "")))


def prompt_set_hash(prompts: list[str]) -> str:
    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()


class KVCache:
    """One sequence's keys and values for every layer, preallocated to ``max_len``."""

    def __init__(
        self,
        cfg: ModelConfig,
        max_len: int,
        kv_dtype: str = "fp32",
        compute_dtype: torch.dtype = torch.float32,
        scales: KVScales | None = None,
        device: str | torch.device = "cpu",
        storage: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        """``storage``: (k, v) tensors of the shape below to hold the keys and values in (a slot
        of a SlotStore), instead of new ones."""
        if kv_dtype not in KV_DTYPES:
            raise ThorError(f"unknown KV dtype {kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")
        self.cfg, self.max_len, self.kv_dtype = cfg, max_len, kv_dtype
        self.store_dtype, self.compute_dtype = KV_DTYPES[kv_dtype], compute_dtype
        # One slot past the capacity: a graph that pads a single row to two (lowbit_step.py)
        # writes the copy's key there; it is never read.
        shape = (cfg.num_layers, cfg.num_kv_heads, max_len + 1, cfg.head_dim)
        if storage is None:
            storage = tuple(torch.zeros(shape, dtype=self.store_dtype, device=device) for _ in "kv")
        self.k, self.v = storage  # [L, Hkv, S + 1, Dh] each
        self.lengths = [0] * cfg.num_layers
        self.scales = scales or KVScales.unit(cfg)
        # [L, Hkv, 1, 1] so a whole layer quantizes in one broadcast.
        self._ks = self.scales.k.to(device)[:, :, None, None]
        self._vs = self.scales.v.to(device)[:, :, None, None]
        self.fp8 = kv_dtype == "fp8"

    @property
    def length(self) -> int:
        return self.lengths[-1]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [Hkv, T, Dh] for the next T positions of ``layer``."""
        start, t = self.lengths[layer], k.shape[1]
        if start + t > self.max_len:
            raise ThorError(
                f"sequence of {start + t} tokens exceeds the KV cache capacity {self.max_len}"
            )
        k, v = self._stored(layer, k, v)
        self.k[layer, :, start : start + t] = k
        self.v[layer, :, start : start + t] = v
        self.lengths[layer] = start + t

    def _stored(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.fp8:
            k = (k.float() / self._ks[layer]).clamp(-FP8_MAX, FP8_MAX)
            v = (v.float() / self._vs[layer]).clamp(-FP8_MAX, FP8_MAX)
        return k.to(self.store_dtype), v.to(self.store_dtype)

    def view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [Hkv, n, Dh] in the compute dtype."""
        return self.read(layer, self.lengths[layer])

    def read(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n keys and values [Hkv, n, Dh] in the compute dtype, whatever their length."""
        return self.loaded(layer, self.k[layer, :, :n], self.v[layer, :, :n])

    def loaded(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored keys and values of ``layer`` (any leading dims, [..., Hkv, n, Dh]) in the compute
        dtype."""
        if self.fp8:
            return (
                (k.to(torch.float32) * self._ks[layer]).to(self.compute_dtype),
                (v.to(torch.float32) * self._vs[layer]).to(self.compute_dtype),
            )
        if k.dtype != self.compute_dtype:
            return k.to(self.compute_dtype), v.to(self.compute_dtype)
        return k, v

    def crop(self, n: int) -> None:
        """Forget everything after the first n positions (rollback of rejected drafts)."""
        if n < 0:
            raise ValueError("crop length must be >= 0")
        self.lengths = [min(x, n) for x in self.lengths]

    def snapshot(self, n: int) -> "KVCache":
        """A new cache of capacity ``n`` holding a copy of the first ``n`` positions."""
        out = KVCache(self.cfg, n, self.kv_dtype, self.compute_dtype, self.scales, self.k.device)
        out.load_prefix(self, n)
        return out

    def load_prefix(self, src: "KVCache", n: int) -> None:
        """Make this cache hold exactly the first ``n`` positions of ``src`` (same bytes)."""
        if (
            src.kv_dtype != self.kv_dtype
            or src.k.shape[:2] != self.k.shape[:2]
            or not (
                torch.equal(src.scales.k, self.scales.k)
                and torch.equal(src.scales.v, self.scales.v)
            )
        ):
            raise ValueError("prefix from a cache of another model, KV dtype or scales")
        if n > min(src.length, self.max_len):
            raise ValueError(
                f"prefix of {n} positions: the source holds {src.length}, capacity {self.max_len}"
            )
        self.k[:, :, :n] = src.k[:, :, :n]
        self.v[:, :, :n] = src.v[:, :, :n]
        self.lengths = [n] * self.cfg.num_layers


class SlotStore:
    """The keys and values of ``slots`` sequences in one tensor each, so that one forward writes
    and reads every slot (fixed_shape.py's in-flight batching). Slot b is also a KVCache over
    its own part of the tensors (``caches[b]``), for its prefill, its crop and the prefix cache."""

    def __init__(
        self,
        cfg: ModelConfig,
        max_len: int,
        slots: int,
        kv_dtype: str = "fp32",
        compute_dtype: torch.dtype = torch.float32,
        scales: KVScales | None = None,
        device: str | torch.device = "cpu",
    ):
        if kv_dtype not in KV_DTYPES:
            raise ThorError(f"unknown KV dtype {kv_dtype!r}; choose one of {', '.join(KV_DTYPES)}")
        shape = (slots, cfg.num_layers, cfg.num_kv_heads, max_len + 1, cfg.head_dim)
        self.k = torch.zeros(
            shape, dtype=KV_DTYPES[kv_dtype], device=device
        )  # [B, L, Hkv, S + 1, Dh]
        self.v = torch.zeros(
            shape, dtype=KV_DTYPES[kv_dtype], device=device
        )  # [B, L, Hkv, S + 1, Dh]
        self.caches = [
            KVCache(
                cfg,
                max_len,
                kv_dtype,
                compute_dtype,
                scales,
                device,
                storage=(self.k[b], self.v[b]),
            )
            for b in range(slots)
        ]
        self._rows = torch.arange(slots, device=device)[:, None]  # [B, 1]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """k, v: [Hkv, B * R, Dh], slot by slot; pos [B, R]: each row's position in its slot."""
        B, R = pos.shape
        c = self.caches[0]
        k, v = c._stored(layer, k, v)  # quantized like every slot's
        for src, dst in ((k, self.k), (v, self.v)):
            src = src.reshape(src.shape[0], B, R, -1).permute(1, 2, 0, 3)  # [B, R, Hkv, Dh]
            dst = dst[:, layer]  # [B, Hkv, S + 1, Dh]
            if c.fp8:  # index_put_ has no fp8 kernels: move the bytes
                src, dst = src.view(torch.uint8), dst.view(torch.uint8)
            dst[self._rows, :, pos] = src

    def read(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n keys and values of every slot, [B, Hkv, n, Dh] in the compute dtype."""
        return self.caches[0].loaded(layer, self.k[:, layer, :, :n], self.v[:, layer, :, :n])
