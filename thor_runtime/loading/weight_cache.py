"""Prepared low-bit weights cached on disk, so a second start maps them instead of rebuilding.

An entry is a directory named after the source file's sha256 and the weight mode:
``weights.safetensors`` (the model's prepared tensors: packed int4 projections with their
group scales, the int8 head, the bf16 embedding, fp32 norms) and ``key.json`` (format,
mode, torch version, the source's sha256, the safetensors file's sha256, and the load-time
row-invariance verdicts per CPU environment). A hit is memory-mapped (safetensors'
``safe_open``): pages are read on first use and no second copy is made.

Integrity: the source's sha256 is computed once per (path, size, mtime) and remembered in
``sources.json``; every hit re-hashes the safetensors file (on a second thread, while the
model is built on the mapped file; nothing is handed out before it matches) and compares it
and the key with what the entry says. Any mismatch (another torch, a damaged or edited file, a
stale source) refuses the entry and rebuilds it. Writes go to a temporary directory renamed
into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import torch

from thor_runtime.errors import ThorError
from thor_runtime.fileio import ENV_CACHE_DIR, default_cache_dir
from thor_runtime.kernels.lowbit import FusedPart, Int4Weight

FORMAT = 2  # 2: the int4 kernel is part of the mode; q/k/v biases (qwen2) are stored
PROJECTIONS = {  # model field -> the HF tensors fused into it
    "wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "wo": ("self_attn.o_proj",),
    "w_gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "w_down": ("mlp.down_proj",),
}
NORMS = {
    "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
    "q_norm": "self_attn.q_norm",
    "k_norm": "self_attn.k_norm",
}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def source_sha256(root: Path, src: Path) -> str:
    """The source's sha256, hashed once per (path, size, mtime) and remembered under root."""
    st = src.stat()
    ident = f"{src.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    index_path = root / "sources.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if isinstance(index, dict) and isinstance(index.get(ident), str):
        return index[ident]
    digest = sha256_file(src)
    index = index if isinstance(index, dict) else {}
    index[ident] = digest
    _atomic_write_text(index_path, json.dumps(index, indent=1))
    return digest


def env_key(dtype: torch.dtype, kernel: str = "torch") -> str:
    """What a row-invariance verdict depends on besides kernel and shape."""
    key = (
        f"torch={torch.__version__}|cpu={torch.backends.cpu.get_cpu_capability()}|"
        f"threads={torch.get_num_threads()}|dtype={dtype}"
    )
    if kernel == "ort":
        import onnxruntime

        key += f"|onnxruntime={onnxruntime.__version__}"
    return key


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def entry_key(source_sha: str, mode: str) -> dict:
    return {"format": FORMAT, "mode": mode, "torch": torch.__version__, "source_sha256": source_sha}


def _entry_meta(entry: Path, key: dict) -> dict | None:
    """-> the entry's key.json when it matches ``key`` and names a weights file that is there,
    else None (refused). The file's hash is the caller's to check (_HashCheck)."""
    try:
        meta = json.loads((entry / "key.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or any(meta.get(k) != v for k, v in key.items()):
        return None
    if not (entry / "weights.safetensors").is_file() or not isinstance(
        meta.get("weights_sha256"), str
    ):
        return None
    return meta


class _HashCheck:
    """The weights file's sha256, computed on a thread of its own while the model is built on the
    mapped file (hashlib lets go of the GIL: ~0.5 s of a start on a second core); ``ok()`` waits
    for it. Nothing built from the file is handed out before ``ok()`` says it is the file the
    entry wrote."""

    def __init__(self, path: Path, want: str):
        self.want, self.digest = want, None
        self._t = threading.Thread(
            target=self._run, args=(path,), name="thor-weights-sha256", daemon=True
        )
        self._t.start()

    def _run(self, path: Path) -> None:
        try:
            self.digest = sha256_file(path)
        except OSError:
            self.digest = None

    def ok(self) -> bool:
        self._t.join()
        return self.digest == self.want


def _weight_tensors(prefix: str, w) -> dict[str, torch.Tensor]:
    """One low-bit projection's stored tensors, named ``prefix.<part>``."""
    from thor_runtime.kernels.lowbit_ort import NBitsWeight
    from thor_runtime.models.dense import Int8Weight

    w = (
        getattr(w, "w", w) if not isinstance(w, (Int4Weight, NBitsWeight, Int8Weight)) else w
    )  # RowLoop
    if isinstance(w, Int4Weight):
        parts = {"packed": w.packed, "sz": w.sz}
    elif isinstance(w, NBitsWeight):
        parts = w.tensors()
    elif isinstance(w, Int8Weight):
        parts = {"q": w.q, "s": w.s}
    else:
        raise ThorError(f"weight cache: cannot store a {type(w).__name__} projection")
    return {f"{prefix}.{k}": v for k, v in parts.items()}


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """A mapped tensor starts where the safetensors header puts it (8-byte aligned); torch's
    int8 weight kernel crashes (SIGSEGV) from 16 rows on with weights not on a 64-byte
    boundary (seen on an AVX-512 Xeon, torch 2.13): such a weight is copied."""
    return t if t.data_ptr() % 64 == 0 else t.clone()


def _weight_from(t: dict[str, torch.Tensor], prefix: str, rows: int | None = None):
    """Inverse of _weight_tensors (rows: the output size, which torch's int4 packing hides)."""
    from thor_runtime.kernels.lowbit_ort import NBitsWeight
    from thor_runtime.models.dense import Int8Weight

    if f"{prefix}.blob" in t:
        return NBitsWeight.from_tensors(
            {k: t[f"{prefix}.{k}"] for k in ("blob", "scale", "corr") if f"{prefix}.{k}" in t}
        )
    if f"{prefix}.packed" in t:
        sz = t[f"{prefix}.sz"]
        return Int4Weight(t[f"{prefix}.packed"], sz, (rows or sz.shape[1], sz.shape[0] * 32))
    w = Int8Weight.__new__(Int8Weight)
    w.q, w.s, w.dense, w.kernel = _aligned(t[f"{prefix}.q"]), t[f"{prefix}.s"], None, True
    w.shape = torch.Size(w.q.shape)
    try:  # as Int8Weight's constructor: dequantize where this torch has no int8 kernel
        torch._weight_int8pack_mm(torch.zeros(1, w.shape[1], dtype=torch.bfloat16), w.q, w.s)
    except (RuntimeError, NotImplementedError, AttributeError):
        w.kernel = False
    return w


def prepared_tensors(model) -> dict[str, torch.Tensor]:
    """The int4 model's prepared state as flat tensors (what an entry stores)."""
    out: dict[str, torch.Tensor] = {"embed": model.embed_w, "final_norm": model.final_norm}
    if model.lm_head is not model.embed_w:
        out["lm_head"] = model.lm_head
    out.update(_weight_tensors("head", model.head_w))
    for i, L in enumerate(model.layers):
        for field in PROJECTIONS:
            out.update(_weight_tensors(f"{i}.{field}", getattr(L, field)))
        for field in NORMS:
            if getattr(L, field) is not None:
                out[f"{i}.{field}"] = getattr(L, field)
        if L.bqkv is not None:
            out[f"{i}.bqkv"] = L.bqkv
    return {k: v.contiguous() for k, v in out.items()}


def weights_from_prepared(cfg, t: dict[str, torch.Tensor]) -> dict[str, object]:
    """Flat prepared tensors -> the HF-named weights dict TargetModel takes (FusedPart for
    projections, the head under PREPARED_HEAD)."""
    from thor_runtime.models.dense import PREPARED_HEAD

    w: dict[str, object] = {
        "model.embed_tokens.weight": t["embed"],
        "model.norm.weight": t["final_norm"],
        PREPARED_HEAD: _weight_from(t, "head"),
    }
    if "lm_head" in t:
        w["lm_head.weight"] = t["lm_head"]
    Dh = cfg.head_dim
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        for field, names in PROJECTIONS.items():
            if field == "wqkv":
                rows = [cfg.num_heads * Dh, cfg.num_kv_heads * Dh, cfg.num_kv_heads * Dh]
            elif field == "w_gate_up":
                rows = [cfg.intermediate_size] * 2
            else:
                rows = [cfg.hidden_size]
            fused = _weight_from(t, f"{i}.{field}", sum(rows))
            K = fused.shape[1]
            for n, r in zip(names, rows):
                w[f"{p}{n}.weight"] = FusedPart(fused, (r, K))
        for field, name in NORMS.items():
            if f"{i}.{field}" in t:
                w[f"{p}{name}.weight"] = t[f"{i}.{field}"]
        if f"{i}.bqkv" in t:
            bq = t[f"{i}.bqkv"].split(
                [cfg.num_heads * Dh, cfg.num_kv_heads * Dh, cfg.num_kv_heads * Dh]
            )
            for n, b in zip("qkv", bq):
                w[f"{p}self_attn.{n}_proj.bias"] = b
    return w


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class CachedFields:
    """The tokenizer's GGUF metadata as an entry keeps it (parsing a GGUF's 49k-string vocab
    with the gguf package takes seconds): duck-types the reader for Tokenizer.from_gguf_fields."""

    def __init__(self, fields: dict):
        self.fields = {k: _Field(v) for k, v in fields.items()}


def _plain(v):
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8", "replace")
    return v.item() if hasattr(v, "item") else v


def tokenizer_fields(reader) -> dict:
    return {k: _plain(f.contents()) for k, f in reader.fields.items() if k.startswith("tokenizer.")}


def cache_root(cache_dir) -> Path | None:
    return None if cache_dir == "" else Path(cache_dir) if cache_dir else default_cache_dir()


def has_entry(path: Path, cache_dir=None, mode: str = "int4") -> bool:
    """Whether an entry for this source exists (unverified: loading verifies it)."""
    root = cache_root(cache_dir)
    if root is None or not (root / "sources.json").is_file():
        return False
    try:
        sha = source_sha256(root, path)
    except OSError:
        return False
    return any(root.glob(f"{sha[:24]}-{mode}*/key.json"))  # any kernel's entry


def load_int4_gguf(path: Path, cache_dir=None, layout: str = "auto", int4_kernel: str = "auto"):
    """Load a GGUF as an int4 TargetModel through the cache (a hit reads no GGUF metadata)."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    from thor_runtime.engine.runner import attach
    from thor_runtime.kernels.lowbit_kernels import pick_int4_kernel
    from thor_runtime.loading.gguf_lowbit import gguf_weights_int4
    from thor_runtime.loading.loaded import Loaded, gguf_config_and_tokenizer
    from thor_runtime.loading.tokenizer import Tokenizer
    from thor_runtime.models.config import ModelConfig
    from thor_runtime.models.dense import TargetModel

    kernel = pick_int4_kernel(int4_kernel)
    root = cache_root(cache_dir)
    if root is None:
        reader, cfg, tok = gguf_config_and_tokenizer(path)
        model = attach(
            TargetModel(
                cfg,
                gguf_weights_int4(reader, cfg, path),
                torch.bfloat16,
                source=str(path),
                quant="int4",
                layout=layout,
                int4_kernel=kernel,
            )
        )
        return Loaded(model, tok, cfg, str(path))
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ThorError(
            f"weight cache directory {root} is not writable ({e}); set {ENV_CACHE_DIR} "
            "or pass --cache-dir"
        ) from None
    mode = f"int4-{kernel}"
    key = entry_key(source_sha256(root, path), mode)
    entry = root / f"{key['source_sha256'][:24]}-{mode}"
    meta = _entry_meta(entry, key)
    ek = env_key(torch.float32 if kernel == "ort" else torch.bfloat16, kernel)
    if meta is not None:
        hashed = _HashCheck(entry / "weights.safetensors", meta["weights_sha256"])
        try:
            cfg = ModelConfig(**meta["config"])
            tok = Tokenizer.from_gguf_fields(CachedFields(meta["tokenizer"]))
            model = _model_from_entry(path, entry, meta, cfg, ek, layout, kernel, hashed)
        except (KeyError, TypeError, ValueError, ThorError):
            model = None
        except Exception:
            if hashed.ok():
                raise
            model = None  # a damaged file the mapping or the kernel choked on
        if hashed.ok() and model is not None:
            return Loaded(model, tok, cfg, str(path))
        model = None  # refused: its memory goes before the rebuild below
    reader, cfg, tok = gguf_config_and_tokenizer(path)
    model = attach(
        TargetModel(
            cfg,
            gguf_weights_int4(reader, cfg, path),
            torch.bfloat16,
            source=str(path),
            quant="int4",
            layout=layout,
            int4_kernel=kernel,
        )
    )  # its probes go in the entry
    model.cache_hit = False
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
    try:
        save_file(prepared_tensors(model), str(tmp / "weights.safetensors"))
        meta = {
            **key,
            "weights_sha256": sha256_file(tmp / "weights.safetensors"),
            "verdicts": {ek: model.row_verdicts},
            "config": asdict(cfg),
            "tokenizer": tokenizer_fields(reader),
        }
        (tmp / "key.json").write_text(json.dumps(meta, indent=1))
        old = root / f".old-{entry.name}-{os.getpid()}"
        if entry.exists():
            entry.rename(old)
        tmp.rename(entry)
        shutil.rmtree(old, ignore_errors=True)
    except OSError:
        shutil.rmtree(
            tmp, ignore_errors=True
        )  # a cache that cannot be written only costs the next start
        return Loaded(model, tok, cfg, str(path))
    if kernel == "ort":
        # ORT may read the buffers its sessions were built on for as long as they live, so the
        # model built here keeps its own copy of every weight; the same model on the entry
        # just written (probes known: ~1 s) keeps them in the file, where they need no memory
        # (mapped_pages.py).
        probe_s, model = model.probe_s, None
        model = _model_from_entry(path, entry, meta, cfg, ek, layout, kernel)
        model.cache_hit, model.probe_s = False, probe_s
    return Loaded(model, tok, cfg, str(path))


def _model_from_entry(
    path: Path,
    entry: Path,
    meta: dict,
    cfg,
    ek: str,
    layout: str,
    kernel: str,
    hashed: _HashCheck | None = None,
):
    """The int4 TargetModel on an entry's memory-mapped weights. hashed: the file's check under
    way (None: the file was just written); the verdicts of a new CPU environment are added to
    key.json only once it passed."""
    from safetensors import safe_open

    from thor_runtime.engine.runner import attach
    from thor_runtime.models.dense import TargetModel

    with safe_open(str(entry / "weights.safetensors"), framework="pt") as f:  # memory-mapped
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    verdicts = dict(meta.get("verdicts", {}).get(ek, {}))
    known = set(verdicts)
    model = attach(
        TargetModel(
            cfg,
            weights_from_prepared(cfg, tensors),
            torch.bfloat16,
            source=str(path),
            quant="int4",
            layout=layout,
            row_verdicts=verdicts,
            int4_kernel=kernel,
        )
    )
    model.cache_hit = True
    if set(verdicts) != known and (
        hashed is None or hashed.ok()
    ):  # a new CPU environment: remember its probes too
        meta.setdefault("verdicts", {})[ek] = verdicts
        _atomic_write_text(entry / "key.json", json.dumps(meta, indent=1))
    return model
