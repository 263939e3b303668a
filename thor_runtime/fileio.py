"""Small file helpers every loader shares: JSON with one-line errors, atomic writes,
and the list of pickle suffixes we refuse to open."""
from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import ThorError

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
    """Write via a temp file in the same directory + rename: readers never see half a file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)


def write_json_atomic(path: str | Path, doc, indent: int | None = 1) -> None:
    write_text_atomic(path, json.dumps(doc, indent=indent))
