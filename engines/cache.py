"""The engine cache: one directory per key, each file pinned by sha256 in our own manifest.

Layout::

    ROOT/
      KEY/                    a usable entry (KEY = sha256 of the key fields, 32 hex chars)
        manifest.json         format, key, key fields, graphs, {file: {sha256, bytes}}
        embed.onnx            graphs (+ NAME.onnx.data external weights), engines (NAME.plan)
        ...
      .build-<random>/        a build in progress (or one that was killed): never listed as usable
      timing-*.cache          TensorRT timing caches (tactic timings, rebuilt when unreadable)

A build writes everything into ``.build-*``, hashes it, writes the manifest last, fsyncs and
renames the directory to KEY in one step, so a reader sees a whole entry or none, and a build
killed at any point leaves only a ``.build-*`` directory that ``prune`` removes. Loading reads
each file into memory, checks its sha256 against the manifest and only then hands the bytes
to ONNX Runtime or TensorRT: a file that does not match is refused before it is deserialized
(engines are code), and the checked bytes are the ones that run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from thor_runtime.errors import ThorError
from thor_runtime.fileio import sha256_file

MANIFEST = "manifest.json"
FORMAT = "thor-engine/1"
BUILD_PREFIX = ".build-"


class EngineRefused(ThorError):
    """A cache file that does not match our manifest (or a manifest we cannot trust)."""


def make_key(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def sha256_bytes(b) -> str:
    return hashlib.sha256(b).hexdigest()


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Entry:
    """A cache entry whose manifest parsed. ``read`` returns a file's bytes only when they
    match the manifest."""

    path: Path
    manifest: dict

    @property
    def key(self) -> str:
        return self.path.name

    @property
    def graphs(self) -> list[dict]:
        return self.manifest["graphs"]

    def read(self, name: str) -> bytes:
        files = self.manifest["files"]
        if name not in files:
            raise EngineRefused(
                f"engine cache entry {self.key}: {name} is not in its manifest; refusing to load it"
            )
        p = self.path / name
        try:
            data = p.read_bytes()
        except OSError as e:
            raise EngineRefused(
                f"engine cache entry {self.key}: cannot read {name}: {e.strerror}"
            ) from None
        got = sha256_bytes(data)
        if got != files[name]["sha256"]:
            raise EngineRefused(
                f"engine file {p} does not match its manifest hash (sha256 {got[:16]}..., "
                f"expected {files[name]['sha256'][:16]}...); refusing to load it. "
                "Run `thor engines prune` and rebuild"
            )
        return data

    def problems(self) -> list[str]:
        """Every way this entry's files disagree with its manifest (empty = verified)."""
        out = []
        files = self.manifest["files"]
        for name, want in files.items():
            p = self.path / name
            if not p.is_file():
                out.append(f"{name}: missing")
            elif sha256_file(p) != want["sha256"]:
                out.append(f"{name}: sha256 mismatch")
        for p in self.path.iterdir():
            if p.name != MANIFEST and p.name not in files:
                out.append(f"{p.name}: not in the manifest")
        return out


class EngineCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def lookup(self, key: str) -> Entry | None:
        """The entry for ``key`` if one was completed (its files are checked when read)."""
        d = self.root / key
        return self._entry(d) if (d / MANIFEST).is_file() else None

    def _entry(self, d: Path) -> Entry:
        try:
            m = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise EngineRefused(f"engine cache entry {d.name}: unreadable manifest ({e})") from None
        if (
            not isinstance(m, dict)
            or m.get("format") != FORMAT
            or m.get("key") != d.name
            or not isinstance(m.get("files"), dict)
            or not isinstance(m.get("graphs"), list)
        ):
            raise EngineRefused(
                f"engine cache entry {d.name}: manifest is not a {FORMAT} manifest for this key"
            )
        return Entry(d, m)

    def build(self, key: str, fields: dict, write: Callable[[Path], dict]) -> Entry:
        """``write(tmpdir) -> extra manifest fields`` (must include ``graphs``) fills a fresh
        directory; the entry appears under ``key`` only once it is complete."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=BUILD_PREFIX, dir=self.root))
        try:
            extra = write(tmp)
            files = {
                p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
                for p in sorted(tmp.iterdir())
                if p.is_file()
            }
            manifest = {
                "format": FORMAT,
                "key": key,
                "fields": fields,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                **extra,
                "files": files,
            }
            with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            for p in tmp.iterdir():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
            _fsync_dir(tmp)
            final = self.root / key
            if final.exists():  # an earlier or concurrent build of the same key; replace it whole
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self._entry(final)

    def scan(self) -> list[dict]:
        """Every directory under the root: {key, status, ...}; status 'ok' (manifest parsed),
        'bad-manifest' or 'partial' (an interrupted build). Hashes are checked by ``verify``."""
        rows = []
        if not self.root.is_dir():
            return rows
        for d in sorted(self.root.iterdir()):
            if not d.is_dir():
                continue
            if d.name.startswith(BUILD_PREFIX):
                rows.append({"key": d.name, "status": "partial", "path": str(d)})
                continue
            try:
                e = self._entry(d)
            except EngineRefused as err:
                rows.append(
                    {"key": d.name, "status": "bad-manifest", "path": str(d), "error": str(err)}
                )
                continue
            size = sum(f["bytes"] for f in e.manifest["files"].values())
            rows.append(
                {
                    "key": d.name,
                    "status": "ok",
                    "path": str(d),
                    "bytes": size,
                    "created": e.manifest.get("created"),
                    **{
                        k: e.manifest["fields"].get(k)
                        for k in ("backend", "form", "precision", "model", "runtime")
                    },
                }
            )
        return rows

    def verify(self, key: str | None = None) -> dict[str, list[str]]:
        """{key: problems} for one entry or all of them (partial builds count as a problem)."""
        out = {}
        for row in self.scan():
            if key is not None and row["key"] != key:
                continue
            if row["status"] == "partial":
                out[row["key"]] = ["interrupted build (never usable)"]
            elif row["status"] == "bad-manifest":
                out[row["key"]] = [row["error"]]
            else:
                out[row["key"]] = self._entry(Path(row["path"])).problems()
        if key is not None and key not in out:
            raise ThorError(f"no engine cache entry {key} under {self.root}")
        return out

    def prune(self, everything: bool = False) -> list[str]:
        """Remove interrupted builds and entries that fail verification (all entries with
        ``everything``). -> the removed keys."""
        removed = []
        for k, problems in self.verify().items():
            if everything or problems:
                shutil.rmtree(self.root / k, ignore_errors=True)
                removed.append(k)
        return removed
