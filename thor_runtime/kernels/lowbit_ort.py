"""Weight-only 4- and 8-bit projections on ONNX Runtime's MatMulNBits (CPU provider).

Why this kernel: with ``accuracy_level=4`` MLAS quantizes each activation row to int8 per
block of 32 inputs and runs integer dot products against the packed weights. On the AVX2
CPU this project is measured on, a single projection runs 3-4x faster than on torch's int4
CPU kernel at 1 to 16 rows (with lowbit_fused.py the default model decodes 1.5x faster on
one thread and prefills 1.4x faster on two: docs/performance.md, low-bit weights).

Weights. One projection is ``B`` [N, K/32, 16] uint8 (input 2j in the low nibble of a byte,
2j + 1 in its high nibble; 8-bit: one byte each), one fp32 scale per block, and the
operator's default zero point (8 for 4 bits, 128 for 8 bits): w = s * (q - 8). The
Int4Codes form is w = (q - 8) * scale + zero; a non-zero ``zero`` (Q4_1's minimum, the
offset of re-quantized groups) enters as a rank-K/32 correction y += blocksum(x) @ zero^T,
exact in real arithmetic, so Q4_0 and Q4_1 files run on their own scales.

Exactness. MLAS runs a single row on a GEMV path and two or more on a GEMM path whose rows
do not depend on each other or on the row count: a 1-row call is padded to two rows, so a
decode step and every row of a verify get the same bits (the model's load probe checks it,
as for every kernel).
"""

from __future__ import annotations

import numpy as np
import torch

from thor_runtime.errors import ThorError
from thor_runtime.kernels.lowbit import GROUP, Int4Codes

OPSET = 18
ACCURACY_LEVEL = 4  # int8 activations: the fast integer path
MIN_ROWS = 2  # see the module docstring: rows from here on are row-invariant
_ZERO_POINT = {4: 8, 8: 128}


class External:
    """A weight initializer handed to ORT as a buffer (see ``session``), not inside the graph."""

    def __init__(self, array: np.ndarray, name: str):
        self.array, self.name = np.ascontiguousarray(array), name


def session(node_lists: list[list], inits: list, inputs: dict, outputs: dict, threads: int):
    """An ORT CPU session over fp32 [M, width] inputs and outputs (M free; a value ``width``), or
    of another type and shape (a value ``(TensorProto type, dims)``). inits: TensorProtos and
    Externals.

    Externals enter the graph as external-data stubs that ``add_external_initializers`` fills:
    ORT then holds one copy of a weight (and MLAS its packed form), where an initializer inside
    the serialized graph stays resident twice (the parsed graph's and the session's; measured
    with MatMulNBits: 2.6x the weight bytes per session, against 1.6x this way), and the
    serialized graph itself has no weights to build and drop."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def io(name, width):
        kind, dims = width if isinstance(width, tuple) else (TensorProto.FLOAT, ["M", width])
        return helper.make_tensor_value_info(name, kind, dims)

    def stub(e: External):
        t = TensorProto(
            name=e.name,
            data_type=helper.np_dtype_to_tensor_dtype(e.array.dtype),
            dims=e.array.shape,
            data_location=TensorProto.EXTERNAL,
        )
        t.external_data.add(key="location", value=f"{e.name}.bin")  # never read: replaced below
        return t

    ext = [t for t in inits if isinstance(t, External)]
    g = helper.make_graph(
        [n for ns in node_lists for n in ns],
        "projection",
        [io(k, v) for k, v in inputs.items()],
        [io(k, v) for k, v in outputs.items()],
        [stub(t) if isinstance(t, External) else t for t in inits],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    )
    so = ort.SessionOptions()
    if ext:
        so.add_external_initializers(
            [e.name for e in ext], [ort.OrtValue.ortvalue_from_numpy(e.array) for e in ext]
        )
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.log_severity_level = 3
    # Per-session arenas grow to the largest call and are never returned: with one session per
    # layer that is hundreds of MB for kilobytes of activations.
    so.enable_cpu_mem_arena = False
    # A spinning pool would take the core torch's threads need between two projections.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def as_rows(x: torch.Tensor) -> np.ndarray:
    """x [..., width] -> contiguous fp32 [M, width] with M >= MIN_ROWS (a single row repeated).
    The reshaping is numpy's: a decode step calls this ~60 times, and torch ops cost more."""
    a = (x if x.dtype == torch.float32 else x.float()).numpy()
    a = a.reshape(-1, a.shape[-1])
    return np.concatenate([a] * MIN_ROWS) if a.shape[0] < MIN_ROWS else np.ascontiguousarray(a)


class NBitsWeight:
    """One (possibly fused) projection: ``y = x @ w.T`` with w held as ``bits``-bit blocks.
    blob [N, K/32, 32*bits/8] uint8, scale [N, K/32] fp32, corr [K/32, N] fp32 or None."""

    kernel = "ort-matmulnbits"

    def __init__(
        self,
        blob: torch.Tensor,
        scale: torch.Tensor,
        corr: torch.Tensor | None,
        bits: int,
        threads: int | None = None,
    ):
        if bits not in _ZERO_POINT:
            raise ThorError(f"MatMulNBits weights have 4 or 8 bits, not {bits}")
        N, nb, _ = blob.shape
        self.blob, self.scale, self.corr, self.bits = blob, scale, corr, bits
        self.shape = torch.Size((N, nb * GROUP))
        self.threads = threads
        self._session = None  # built on first call: a fused layer graph may never need it

    def nodes(self, x: str, y: str, prefix: str) -> tuple[list, list]:
        """ONNX nodes and initializers computing ``y = x @ w.T`` (names under ``prefix``), for
        this projection's own session and for graphs that fuse several."""
        from onnx import helper, numpy_helper

        N, K = self.shape
        nb = K // GROUP
        inits = [
            External(self.blob.numpy(), f"{prefix}B"),
            External(self.scale.reshape(-1).numpy(), f"{prefix}S"),
        ]
        y0 = y if self.corr is None else f"{prefix}Y0"
        nodes = [
            helper.make_node(
                "MatMulNBits",
                [x, f"{prefix}B", f"{prefix}S"],
                [y0],
                domain="com.microsoft",
                K=K,
                N=N,
                bits=self.bits,
                block_size=GROUP,
                accuracy_level=ACCURACY_LEVEL,
            )
        ]
        if self.corr is not None:
            inits += [
                External(self.corr.numpy(), f"{prefix}C"),
                numpy_helper.from_array(np.array([-1, nb, GROUP], np.int64), f"{prefix}blocks"),
                numpy_helper.from_array(np.array([2], np.int64), f"{prefix}axis"),
            ]
            nodes += [
                helper.make_node(
                    "Reshape", [x, f"{prefix}blocks"], [f"{prefix}X3"]
                ),  # [M, K/32, 32]
                helper.make_node(
                    "ReduceSum", [f"{prefix}X3", f"{prefix}axis"], [f"{prefix}BS"], keepdims=0
                ),  # [M, K/32]
                helper.make_node("Gemm", [f"{prefix}BS", f"{prefix}C", y0], [y]),
            ]  # BS @ C + Y0
        return nodes, inits

    @property
    def session(self):
        if self._session is None:
            nodes, inits = self.nodes("A", "Y", "")
            N, K = self.shape
            self._session = session(
                [nodes], inits, {"A": K}, {"Y": N}, self.threads or torch.get_num_threads()
            )
        return self._session

    # ---- construction from the forms the loaders produce
    @classmethod
    def from_codes(cls, parts: list[Int4Codes], threads: int | None = None) -> "NBitsWeight":
        """Fuse projections sharing their input (q/k/v, gate/up) along the output dim."""
        codes = torch.cat([p.codes for p in parts]).numpy().astype(np.uint8)  # [N, K]
        scale = torch.cat([p.scale for p in parts]).float().contiguous()  # [N, K/G]
        zero = torch.cat([p.zero for p in parts]).float()  # [N, K/G]
        N, K = codes.shape
        blob = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(N, K // GROUP, GROUP // 2)
        corr = zero.t().contiguous() if bool(zero.any()) else None  # [K/G, N]
        return cls(torch.from_numpy(np.ascontiguousarray(blob)), scale, corr, 4, threads)

    @classmethod
    def from_dense_int8(cls, w: torch.Tensor, threads: int | None = None) -> "NBitsWeight":
        """Symmetric 8-bit blocks (absmax / 127 per group of 32), e.g. a head whose GGUF
        tensor is Q8_0: those blocks already span +-127, so this recovers their codes."""
        w = w.float()
        N, K = w.shape
        if K % GROUP:
            raise ThorError(f"8-bit weights need an input size divisible by {GROUP}, got {K}")
        g = w.reshape(N, K // GROUP, GROUP)
        s = (g.abs().amax(-1) / 127).clamp_min(1e-12)  # [N, K/G]
        q = torch.round(g / s[..., None]).clamp(-127, 127).to(torch.int16) + 128
        return cls(q.to(torch.uint8).contiguous(), s.contiguous(), None, 8, threads)

    # ---- the weight cache's view
    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"blob": self.blob, "scale": self.scale}
        if self.corr is not None:
            out["corr"] = self.corr
        return out

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], threads: int | None = None) -> "NBitsWeight":
        bits = 8 if t["blob"].shape[2] == GROUP else 4
        return cls(t["blob"], t["scale"], t.get("corr"), bits, threads)

    def dequantize(self) -> torch.Tensor:
        """-> [N, K] fp32, the weights this projection multiplies by (tests, export)."""
        b = self.blob.to(torch.int16)
        q = torch.stack([b & 0x0F, b >> 4], -1).flatten(-2) if self.bits == 4 else b  # [N, K/G, G]
        w = (q - _ZERO_POINT[self.bits]).float() * self.scale[..., None]
        w = w.reshape(self.shape)
        if self.corr is not None:
            w = w + self.corr.t().repeat_interleave(GROUP, 1)
        return w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        m = lead.numel()
        a = as_rows(x)  # [max(M, 2), K]
        y = torch.from_numpy(self.session.run(None, {"A": a})[0][:m])  # [M, N]
        return y.to(x.dtype).view(*lead, -1)

    @staticmethod
    def available() -> bool:
        """onnxruntime (the ``onnx`` extra) is installed and runs the operator here."""
        try:
            w = NBitsWeight.from_dense_int8(torch.ones(ROWS_PROBE, GROUP), threads=1)
            return bool(torch.isfinite(w(torch.ones(1, GROUP))).all())
        except (ImportError, RuntimeError, ThorError):
            return False
        except Exception as e:  # onnxruntime's own exception types (Fail, InvalidGraph, ...)
            if type(e).__module__.startswith("onnxruntime"):
                return False
            raise


ROWS_PROBE = 8
