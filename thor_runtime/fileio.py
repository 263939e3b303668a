"""Small file helpers every loader shares: JSON with one-line errors, atomic writes,
and the list of pickle suffixes we refuse to open."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from thor_runtime.errors import ThorError

# Where prepared weights and compiled kernels are kept (the weight cache, the row kernel).
ENV_CACHE_DIR = "THOR_CACHE_DIR"


def default_cache_dir() -> Path:
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "thor-runtime" / "weights"


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks (model files are GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# Unpickling runs arbitrary code, so weights with these suffixes are refused unopened.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_json(path: str | Path, what: str, want_object: bool = True):
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError):
        raise ThorError(f"{what} not found: {p}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ThorError(f"{what} {p} is not valid JSON: {e}") from None
    if want_object and not isinstance(doc, dict):
        raise ThorError(f"{what} {p} must be a JSON object")
    return doc


def write_text_atomic(path: str | Path, text: str) -> None:
    """Temp file in the same directory, fsync, then rename: readers see the old file or the
    new one, never half of one, even across a power cut."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, doc, indent: int | None = 1) -> None:
    write_text_atomic(path, json.dumps(doc, indent=indent))
