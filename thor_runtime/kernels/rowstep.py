"""Decode steps and verifies of a MatMulNBits model on our own CPU kernel (csrc/rowstep.c).

Why. On ONNX Runtime a 1-row step is padded to two rows (MLAS's 1-row GEMV path has other
bits than its GEMM path) and pays a per-node cost ~660 times; the kernel here runs each row on
its own with the same instructions whatever the row count, so a 1-row step needs no padding
and a verify row is a step's bits by construction (the load probe checks it like any kernel).
It reads the MatMulNBits blobs and scales in place (each block's minimum laid out again,
``s q + m``, [N, K/32] fp32), or, built for AVX-512 VNNI, its own copy of them regrouped 16
outputs side by side (csrc/rowstep_simd.h, ``gtile``: ~5x fewer vector operations per product,
which is what verify and prompt rows are bound by). Prompt rows run here or on ONNX Runtime's
step graph, whichever prefills faster on this machine (prefill_choice.py): a prefill row need
not be a step's bits, only the same bits however the prompt is split.

The library is compiled for this CPU (``-march=native``) on first use, into the kernel cache
(``kernels/`` in the weight cache), and loaded only when its sha256 matches the manifest
written when it was built. No compiler: the step graph runs, and ``kernel_status`` says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from thor_runtime.engine.constraint import RowReads, reads_part, split_reads
from thor_runtime.engine.exactness import EXACT_ROWS
from thor_runtime.engine.threads import FitWatch, adapt_mode
from thor_runtime.errors import ThorError
from thor_runtime.fileio import default_cache_dir
from thor_runtime.kernels.lowbit_ort import NBitsWeight
from thor_runtime.kernels.lowbit_step import in_calls

SOURCE = Path(__file__).with_name("csrc") / "rowstep.c"  # includes rowstep_*.h beside it
MAX_ROWS = 64  # the C side's scratch rows: a call's (longer inputs run in calls of it)
_ZERO_POINT = {4: 8, 8: 128}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


# THOR_CPU_ISA=avx2 builds the kernel for an AVX2-only x86 CPU (AVX2 + FMA, no AVX-512 or VNNI:
# an AMD Zen 2/3) on any x86, to measure and test it as one; unset, it follows the AVX2
# emulation of ATen (ATEN_CPU_CAPABILITY=avx2), so one setting emulates the whole runtime.
ISA_ENV = "THOR_CPU_ISA"
_ISA_MARCH = {"native": "-march=native", "avx2": "-march=x86-64-v3"}


def cpu_isa() -> str:
    isa = os.environ.get(ISA_ENV) or (
        "avx2" if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2" else "native"
    )
    if isa not in _ISA_MARCH:
        raise ThorError(f"{ISA_ENV}={isa!r}: expected one of {', '.join(_ISA_MARCH)}")
    return isa


def _flags() -> list[str]:
    if platform.machine() in ("aarch64", "arm64"):
        arch = "-mcpu=native"
    else:
        arch = _ISA_MARCH[cpu_isa()]
    return ["-O3", arch, "-fPIC", "-shared", "-std=c11", "-pthread"]


def _cpu_identity() -> str:
    """What -march=native compiles for: a library built on another CPU may not run here."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = ("model name", "flags", "Features", "CPU part", "CPU implementer")
    return "\n".join(sorted({ln for ln in lines if ln.split(":")[0].strip() in keep}))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_library(kernel_dir: Path | None) -> tuple[Path | None, str]:
    """-> (the compiled library, "") or (None, why not). Built once per source, compiler,
    flags and CPU; a library whose hash is not the manifest's is rebuilt, never loaded."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) on PATH"
    try:
        version = subprocess.run(
            [cc, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"the C compiler {cc} does not run: {e}"
    sources = [f.read_text() for f in sorted(SOURCE.parent.glob("rowstep*.[ch]"))]
    key = hashlib.sha256(
        "\n".join(
            [*sources, " ".join(_flags()), version, platform.machine(), _cpu_identity()]
        ).encode()
    ).hexdigest()[:24]
    d = (
        Path(kernel_dir)
        if kernel_dir is not None
        else Path(tempfile.mkdtemp(prefix="thor-kernels-"))
    )
    lib, manifest = d / f"rowstep-{key}.so", d / f"rowstep-{key}.json"
    if lib.exists() and manifest.exists():
        try:
            if json.loads(manifest.read_text()).get("sha256") == _sha256(lib):
                return lib, ""
        except (OSError, ValueError):
            pass
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".rowstep-{key}-{os.getpid()}.so"
    r = subprocess.run(
        [cc, *_flags(), "-o", str(tmp), str(SOURCE), "-lm"], capture_output=True, text=True
    )
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        return None, f"compiling {SOURCE.name} failed: {(r.stderr or r.stdout).strip()[-400:]}"
    digest = _sha256(tmp)
    os.replace(tmp, lib)
    mtmp = d / f".rowstep-{key}-{os.getpid()}.json"
    mtmp.write_text(
        json.dumps(
            {
                "sha256": digest,
                "compiler": version.splitlines()[0] if version else cc,
                "flags": _flags(),
            }
        )
    )
    os.replace(mtmp, manifest)
    return lib, ""


def _bind(path: Path):
    lib = ctypes.CDLL(str(path))
    lib.rowstep_new.restype = _P
    lib.rowstep_new.argtypes = [_I] * 7 + [_F, _I, _I]
    lib.rowstep_free.argtypes = [_P]
    lib.rowstep_set_layer.restype = _I
    lib.rowstep_set_layer.argtypes = [_P, _I] + [_P] * 15
    lib.rowstep_set_head.restype = _I
    lib.rowstep_set_head.argtypes = [_P, _P, _P, _P, _P, _I]
    lib.rowstep_forward.restype = _I
    lib.rowstep_forward.argtypes = [_P, _P, _I, _I, _P, _P, _I, _P, _P, _P, _P, _I, _P, _P, _I]
    lib.rowstep_forward_rows.restype = _I
    lib.rowstep_forward_rows.argtypes = [_P, _P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _I]
    lib.rowstep_head_at.restype = _I
    lib.rowstep_head_at.argtypes = [_P, _P, _P, _I, _P, _P, _P, _I]
    lib.rowstep_unit.restype = _I
    lib.rowstep_proj_new.restype = _P
    lib.rowstep_proj_new.argtypes = [_P, _P, _P, _I, _I, _I]
    lib.rowstep_proj_free.argtypes = [_P]
    lib.rowstep_linear.restype = _I
    lib.rowstep_linear.argtypes = [_P, _P, _P, _I, _P]
    lib.rowstep_set_threads.restype = _I
    lib.rowstep_set_threads.argtypes = [_P, _I]
    lib.rowstep_dflash_new.restype = _P  # a drafter's forwards (speculative/dflash_rows.py)
    lib.rowstep_dflash_new.argtypes = [_I] * 6 + [_F, _P, _P, _P]
    lib.rowstep_dflash_set_layer.argtypes = [_P, _I] + [_P] * 9
    lib.rowstep_dflash_free.argtypes = [_P]
    lib.rowstep_dflash_fits.restype = _I
    lib.rowstep_dflash_fits.argtypes = [_P, _P]
    lib.rowstep_dflash_append.restype = _I
    lib.rowstep_dflash_append.argtypes = [_P, _P, _P, _I, _P, _P, _P, _I, _P, _P, _P]
    lib.rowstep_dflash_block.restype = _I
    lib.rowstep_dflash_block.argtypes = [_P, _P, _P, _I, _I, _P, _I, _I, _P, _P]
    return lib


def supports(model) -> str:
    """ "" when this kernel runs ``model``, else the reason it does not."""
    cfg, L = model.cfg, model.layers
    if getattr(model, "int4_kernel", None) != "ort":
        return "weights are not MatMulNBits blocks"
    if cfg.qk_norm:
        return "q/k norms (qwen3) are not in the kernel"
    if not isinstance(model.head_w, NBitsWeight):
        return "the head is not on MatMulNBits"
    ws = [w for lay in L for w in (lay.wqkv, lay.wo, lay.w_gate_up, lay.w_down)]
    if not all(isinstance(w, NBitsWeight) and w.bits == 4 for w in ws):
        return "a projection is not 4-bit MatMulNBits"
    if cfg.num_heads % cfg.num_kv_heads or cfg.head_dim % 2:
        return "head layout not supported"
    return ""


class RowStep:
    """Same call as lowbit_step.StepGraph: h [T, D] (embedded ids; MAX_ROWS rows a call), an
    fp32 KVCache -> ({i: h after layer i} for taps, logits of h[rows] or None)."""

    def __init__(self, model, lib_path: Path, threads: int):
        cfg = model.cfg
        self.model, self.n = model, cfg.num_layers
        self._lib = _bind(lib_path)
        self.build = lib_path.stem  # source, flags, compiler and CPU (build_library)
        self._keep: list[torch.Tensor] = []  # every buffer the C side points into
        self._one = threading.Lock()  # one scratch: one forward at a time, whoever calls
        self._h = self._lib.rowstep_new(
            cfg.num_layers,
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.vocab_size,
            cfg.rms_eps,
            threads,
            cfg.max_position_embeddings,
        )
        if not self._h:
            raise MemoryError("rowstep: no memory for the kernel's scratch")
        # threads in use follow the idle cores (threads.py): exact, a part's bits do not depend
        # on the thread that computes it
        self.fit, self.threads = FitWatch(threads), max(1, threads)
        # a build that regroups the weights (rowstep_layout() > 0) copies them at set: the
        # blobs, scales and minimums passed need to live only until then
        self.group, failed, self._weights = self._lib.rowstep_layout(), 0, []
        self.unit = self._lib.rowstep_unit()  # head outputs per unit of a ``cols`` call
        for i, lay in enumerate(model.layers):
            args = [self._ptr(lay.attn_norm), self._ptr(lay.mlp_norm)]
            for w in (lay.wqkv, lay.wo, lay.w_gate_up, lay.w_down):
                args += self._proj(w)
                if w is lay.wqkv:
                    args.append(self._ptr(lay.bqkv))
            failed |= self._lib.rowstep_set_layer(self._h, i, *args)
            self._weights = []
        failed |= self._lib.rowstep_set_head(
            self._h, self._ptr(model.final_norm), *self._proj(model.head_w), model.head_w.bits
        )
        self._weights = []
        if failed:
            raise MemoryError("rowstep: no memory for the kernel's copy of the weights")

    def _ptr(self, t: torch.Tensor | None, weight: bool = False) -> int | None:
        if t is None:
            return None
        t = (
            t
            if t.dtype in (torch.float32, torch.uint8) and t.is_contiguous()
            else t.float().contiguous()
        )
        (self._weights if weight and self.group else self._keep).append(t)
        return t.data_ptr()

    def _proj(self, w: NBitsWeight) -> list:
        """blob, scale and the minimum per block m = corr - zp s ([N, K/32]), for the C side to
        read in place or to regroup"""
        zp = _ZERO_POINT[w.bits]
        m = -zp * w.scale if w.corr is None else w.corr.t() - zp * w.scale
        return [self._ptr(w.blob, True), self._ptr(w.scale, True), self._ptr(m.contiguous(), True)]

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.rowstep_free(self._h)
            self._h = None

    def _fit(self) -> None:
        """Before a forward: the pool's threads in use, from the idle cores (adapt_mode)."""
        if adapt_mode() == "off":
            self.fit.reset(self.fit.limit)
            want = self.fit.limit
        else:
            want = self.fit.poll()
        if want is not None and want != self.threads:
            self.threads = self._lib.rowstep_set_threads(self._h, want)

    def fits(self, cache, T: int) -> bool:
        return (
            cache.store_dtype == torch.float32
            and cache.k.is_contiguous()
            and cache.v.is_contiguous()
            and T >= 1
            and cache.length + T <= cache.k.shape[2]
        )

    def __call__(
        self,
        h: torch.Tensor,
        cache,
        taps: tuple[int, ...] = (),
        rows: slice | None = slice(None),
        cols=None,
    ):
        # rows are row-invariant: any split gives the same bits
        return in_calls(
            lambda s, e, want: self._call(h[s:e], cache, taps, want, reads_part(cols, s, e)),
            h.shape[0],
            rows,
            MAX_ROWS,
            tuple(taps),
        )

    def _heads(self, cols, T: int, want: np.ndarray) -> tuple[list, torch.Tensor]:
        """The head's work for rows ``want`` [R] of a T-row forward whose rows read ``cols``
        (read_ids'): the rows that read some ids over those ids' units, the rows that read every
        id over all, each into its own rows of one logits [R, V]. An id a row does not read stays
        at -inf; one it reads has the bits the whole head gives it (each output's operations are
        its own, rowstep.c). -> ([(rows of h [r], their logits rows [r], units [U] int32 or
        None: all)], logits)."""
        ids, wide = split_reads(cols, T)
        wide = wide[want]  # [R]
        # filled by numpy: torch's fill of this size wakes its thread pool (see _residual)
        logits = np.empty((len(want), self.model.cfg.vocab_size), np.float32)  # [R, V]
        heads = []
        if not wide.all():
            narrow = np.flatnonzero(~wide)
            if wide.any():
                logits[narrow] = -np.inf
            else:
                logits.fill(-np.inf)
            heads.append((want[narrow], narrow, np.unique(ids // self.unit).astype(np.int32)))
        if wide.any():
            rows = np.flatnonzero(wide)
            heads.append((want[rows], rows, None))
        return heads, torch.from_numpy(logits)

    def _run_heads(self, h: torch.Tensor, heads: list, logits: torch.Tensor) -> int:
        """The head calls after a forward that computed none (its rows left in ``h``)."""
        rc = 0
        for rows, at, units in heads:
            rows, at = np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(at, np.int64)
            rc = rc or self._lib.rowstep_head_at(
                self._h,
                h.data_ptr(),
                rows.ctypes.data,
                len(rows),
                logits.data_ptr(),
                at.ctypes.data,
                *_units_arg(units),
            )
        return rc

    def _call(
        self, h: torch.Tensor, cache, taps: tuple[int, ...], want: np.ndarray | None, cols=None
    ):
        """One call of T <= MAX_ROWS rows; ``want``: the rows whose logits are asked (None: none);
        ``cols``: the ids whose logits are read (None: all)."""
        T, start, cfg = h.shape[0], cache.length, self.model.cfg
        self.model.ensure_positions(start + T)
        h = _residual(h)  # [T, D]
        tap_out = {i: torch.empty(T, cfg.hidden_size) for i in taps}
        tap_ptrs = (_P * self.n)(
            *[tap_out[i].data_ptr() if i in tap_out else None for i in range(self.n)]
        )
        heads, logits = self._heads(cols, T, want) if want is not None else ([], None)
        # one head: in the forward, rows in order; two (rows inside a string beside others): after
        # it
        r, units = (heads[0][0], heads[0][2]) if len(heads) == 1 else (np.empty(0, np.int64), None)
        r = np.ascontiguousarray(r, np.int64)
        cos, sin = self.model.cos, self.model.sin
        with self._one:
            self._fit()
            rc = self._lib.rowstep_forward(
                self._h,
                h.data_ptr(),
                T,
                start,
                cache.k.data_ptr(),
                cache.v.data_ptr(),
                cache.k.shape[2],
                cos.data_ptr(),
                sin.data_ptr(),
                tap_ptrs,
                r.ctypes.data,
                len(r),
                None if logits is None else logits.data_ptr(),
                *_units_arg(units),
            )
            if len(heads) > 1:
                rc = rc or self._run_heads(h, heads, logits)
        if rc != 0:
            raise RuntimeError(f"rowstep: {T} rows at position {start} do not fit the kernel")
        cache.lengths = [start + T] * self.n
        return tap_out, logits

    def many(
        self,
        h: torch.Tensor,
        caches: list,
        counts: list[int],
        taps: tuple[int, ...] = (),
        cols=None,
    ):
        """Rows of several sequences in one call: h [N, D] holds ``counts[j]`` rows of the
        sequence in ``caches[j]`` after its cached ones, in that order (N <= MAX_ROWS). Each
        row runs what a 1-row call at its position runs; every cache grows by its count.
        ``cols[j]``: the ids whose logits sequence j reads (None: all; ``cols`` None: all for
        every one). -> ({i: [N, D]} for taps, [logits [counts[j], V] per sequence])."""
        N, cfg = h.shape[0], self.model.cfg
        cols = cols if cols is not None else [None] * len(caches)
        starts = [c.length for c in caches]
        pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, counts)]).astype(
            np.int32
        )  # [N]
        self.model.ensure_positions(int(pos.max()) + 1)
        owner = [j for j, n in enumerate(counts) for _ in range(n)]  # [N]
        ks = (_P * N)(*[caches[j].k.data_ptr() for j in owner])
        vs = (_P * N)(*[caches[j].v.data_ptr() for j in owner])
        Ss = np.ascontiguousarray([caches[j].k.shape[2] for j in owner], np.int32)
        h = _residual(h)  # [N, D]
        tap_out = {i: torch.empty(N, cfg.hidden_size) for i in taps}
        tap_ptrs = (_P * self.n)(
            *[tap_out[i].data_ptr() if i in tap_out else None for i in range(self.n)]
        )
        firsts = np.cumsum([0] + list(counts[:-1]))  # each sequence's first row
        # rows that read every logit (a sequence reading all, or rows inside a string) share one
        # full head, the others one over the union of their ids (else a wide forward computes all
        # 152 k ids for every row as soon as one row needs them)
        heads, logits = self._heads(_joined_reads(cols, counts), N, np.arange(N))
        r, units = (heads[0][0], heads[0][2]) if len(heads) == 1 else (np.empty(0, np.int64), None)
        r = np.ascontiguousarray(r, np.int64)
        with self._one:
            self._fit()
            rc = self._lib.rowstep_forward_rows(
                self._h,
                h.data_ptr(),
                N,
                pos.ctypes.data,
                ks,
                vs,
                Ss.ctypes.data,
                self.model.cos.data_ptr(),
                self.model.sin.data_ptr(),
                tap_ptrs,
                r.ctypes.data,
                len(r),
                logits.data_ptr(),
                *_units_arg(units),
            )
            if len(heads) > 1:
                rc = rc or self._run_heads(h, heads, logits)
        if rc != 0:
            raise RuntimeError(
                f"rowstep: {N} rows of {len(caches)} sequences do not fit the kernel"
            )
        for c, s, n in zip(caches, starts, counts):
            c.lengths = [s + n] * self.n
        return tap_out, [logits[a : a + n] for a, n in zip(firsts, counts)]


def _residual(h: torch.Tensor) -> torch.Tensor:
    """A copy of the rows for the kernel to overwrite (the residual stream), made by numpy: a
    torch copy this size wakes torch's thread pool, whose threads then spin on the cores the
    kernel's pool runs on."""
    return torch.from_numpy(np.array(h.float().numpy(), copy=True))


def _units_arg(units: np.ndarray | None) -> tuple:
    """The C side's (units, U): the head's units to compute, or (NULL, 0) for all of them."""
    return (None, 0) if units is None else (units.ctypes.data, len(units))


def _joined_reads(cols: list, counts: list[int]):
    """Several sequences' reads (read_ids' each, over its ``counts[j]`` rows) as one over their
    rows in order: the rows that read every logit, and the union of the others' ids."""
    parts = [split_reads(c, n) for c, n in zip(cols, counts)]
    wide = np.concatenate([w for _, w in parts])  # [N]
    if wide.all():
        return None
    ids = np.unique(np.concatenate([i for i, w in parts if i is not None and not w.all()]))
    return RowReads(ids, wide) if wide.any() else ids


def kernel_dir() -> Path:
    return default_cache_dir() / "kernels"


def row_step(
    model, verdict: dict[str, bool], threads: int | None = None
) -> tuple[RowStep | None, str]:
    """-> (the kernel for ``model``'s steps and verifies, "") or (None, why it does not run):
    not supported, no compiler, or rows not bit-identical here (probed once per CPU
    environment; verdict as in make_rows_exact)."""
    from thor_runtime.kernels.lowbit_step import rows_invariant

    why = supports(model)
    if why:
        return None, why
    lib, why = build_library(kernel_dir())
    if lib is None:
        return None, why
    g = RowStep(model, lib, threads or torch.get_num_threads())
    key = f"RowStep:{g.build}"
    if key not in verdict:
        verdict[key] = rows_invariant(g, model.cfg, EXACT_ROWS)
    return (g, "") if verdict[key] else (None, "rows are not bit-identical on this CPU")
