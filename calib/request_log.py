"""The request log: the robots' own plan requests, kept as calibration data (opt-in).

Off unless ``planner.log_requests`` (``--log-requests DIR``) names a directory; then every plan
the session makes (thor_app/session.py: `thor plan`, the service, `thor ros`) appends one record.
`thor calib gen-data --from-log DIR` reads them back (calib/fleet.py).

On disk: JSON Lines parts ``requests-<ns>-<pid>-<n>.jsonl``, oldest name first. A line is one of

    {"kind": "world",   "v": 1, "sha256": H, "doc": {world document}}
    {"kind": "skills",  "v": 1, "sha256": H, "doc": {skills document}}
    {"kind": "request", "v": 1, "time": ISO, "model": M, "world": H, "skills": H,
     "task": T, "response": the model's text to the first attempt, "valid": bool, "attempts": n}

A world or skill set is written once per part, before the first request that names it, so a
part stands alone: dropping the oldest part never strands a record in another.

Bounded and atomic: a record and the documents it needs go out as one ``os.write`` on an
O_APPEND descriptor, under a lock on ``.lock`` (threads and processes sharing the directory
take turns). Before it, the part rotates when the record would take it past the part size, and
the oldest parts are deleted until the parts plus the record fit ``max_bytes``, so the parts
never hold more. A record that cannot fit at all is dropped. A crash or a short write can leave
at most a partial last line, which the writer cuts back and a reader skips (a line counts only
once its newline is written). No fsync per record: a power cut may lose the last records, never
mix two.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from dataclasses import MISSING, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from thor_runtime.errors import ThorError

VERSION = 1
PART_GLOB = "requests-*.jsonl"
LOCK_NAME = ".lock"
# a part rotates at this share of the whole budget: the oldest eighth goes at a time
PARTS = 8
MIN_PART_BYTES = 4096


# ---- documents ------------------------------------------------------------------------------
def _plain(obj) -> dict:
    """A loader dataclass as its file spells it: fields left at their default are left out, and
    tuples become lists (the world and skill files' keys are the fields' names)."""
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if f.default is not MISSING and v == f.default:
            continue
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def world_doc(world) -> dict:
    """A World (agent.files.loader) as a world file that loads back to it. Its `skills` path
    is left out: it names a file on the robot, and the record names its skills itself."""
    r = world.robot
    robot = {
        "workspace": {"min": list(r.workspace_min), "max": list(r.workspace_max)},
        "max_payload_kg": r.max_payload_kg,
    }
    if r.at is not None:
        robot["at"] = r.at
    return {
        "name": world.name,
        "objects": [_plain(o) for o in world.objects],
        "places": [_plain(p) for p in world.places],
        "robot": robot,
    }


def skills_doc(skills) -> dict:
    """A SkillSet as a skills file that loads back to it."""
    out = []
    for s in skills.skills:
        d = {
            "name": s.name,
            "description": s.description,
            "args": {a.name: {k: v for k, v in _plain(a).items() if k != "name"} for a in s.args},
        }
        if s.timeout_s is not None:
            d["timeout_s"] = s.timeout_s
        for key in ("preconditions", "effects"):
            if getattr(s, key):
                d[key] = [c.to_dict() for c in getattr(s, key)]
        if s.unchanged:
            d["unchanged"] = list(s.unchanged)
        out.append(d)
    doc = {"skills": out}
    if skills.max_steps is not None:
        doc["max_steps"] = skills.max_steps
    return doc


def doc_hash(doc: dict) -> str:
    """The content hash of a document: sha256 of its canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(_canonical(doc).encode("utf-8")).hexdigest()


def _canonical(doc) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _line(doc: dict) -> bytes:
    return (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


# ---- writing --------------------------------------------------------------------------------
class RequestLog:
    """Appends plan requests to ``directory``, whose parts never hold more than ``max_bytes``.
    ``part_bytes``: the size a part rotates at (default: an eighth of ``max_bytes``). Threads
    may share one; other logs on the directory (other processes) keep to the same bound."""

    def __init__(self, directory, max_bytes: int, part_bytes: int | None = None):
        if max_bytes < MIN_PART_BYTES:
            raise ThorError(f"the request log needs at least {MIN_PART_BYTES} bytes")
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.part_bytes = min(max_bytes, part_bytes or max(MIN_PART_BYTES, max_bytes // PARTS))
        try:
            # what robots were asked may be private: only this user reads it
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            with _Locked(self.dir):  # can be written: said now, not at the first plan
                pass
        except OSError as e:
            raise ThorError(f"request log {self.dir}: {e.strerror or e}") from None
        self._mutex = threading.Lock()
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._docs: set[str] = set()  # the documents the current part holds
        self._serial = 0

    def append(self, world, skills, task: str, response: str, **extra) -> bool:
        """One plan request: its World and SkillSet, the task, the model's text; ``extra``: more
        of the record (model, valid, attempts). -> False when the record cannot fit the log.
        Raises OSError when the disk refuses it (the caller says so and goes on)."""
        docs = [("world", world_doc(world)), ("skills", skills_doc(skills))]
        docs = [(kind, doc_hash(d), d) for kind, d in docs]
        record = {
            "kind": "request",
            "v": VERSION,
            "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            **extra,
            "world": docs[0][1],
            "skills": docs[1][1],
            "task": task,
            "response": response,
        }
        with self._mutex, _Locked(self.dir):
            if self._fd is None or os.fstat(self._fd).st_nlink == 0:  # another took it away
                self._new_part()
            data = self._payload(docs, record)
            if self._size and self._size + len(data) > self.part_bytes:
                self._new_part()
                data = self._payload(docs, record)
            if len(data) > self.max_bytes:  # alone in a fresh part by now, and still too big
                return False
            self._make_room(len(data))
            self._write(data)
            self._docs |= {h for _, h, _ in docs}
            return True

    def close(self) -> None:
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self):  # a raw descriptor is not closed by the garbage collector
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)

    def _payload(self, docs, record) -> bytes:
        head = [
            {"kind": kind, "v": VERSION, "sha256": h, "doc": d}
            for kind, h, d in docs
            if h not in self._docs
        ]
        return b"".join(_line(x) for x in head + [record])

    def _new_part(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._serial += 1
        name = f"requests-{time.time_ns():020d}-{os.getpid()}-{self._serial}.jsonl"
        self._path = self.dir / name
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        self._size, self._docs = 0, set()

    def _make_room(self, need: int) -> None:
        """Delete the oldest parts (never the current one) until the parts and ``need`` more
        bytes fit. That always comes to pass: the current part is empty, or it plus ``need`` is
        at most ``part_bytes`` <= ``max_bytes``."""
        parts = [(p, _size(p)) for p in sorted(self.dir.glob(PART_GLOB))]
        total = sum(s for _, s in parts) + need
        for p, s in parts:
            if total <= self.max_bytes:
                break
            if p != self._path:
                p.unlink(missing_ok=True)
                total -= s

    def _write(self, data: bytes) -> None:
        try:
            n = os.write(self._fd, data)
        except OSError:
            self._cut_back()
            raise
        if n != len(data):  # a full disk takes part of it: no half record stays behind
            self._cut_back()
            raise OSError(28, "short write (disk full?)")
        self._size += n

    def _cut_back(self) -> None:
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            pass  # the reader skips what is left: it has no newline or does not parse


class _Locked:
    """flock on the directory's lock file: one writer at a time, across processes. Opened per
    use, so a log holds no descriptor for it (each open is its own lock, threads included)."""

    def __init__(self, directory: Path):
        self.path = directory / LOCK_NAME

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        os.close(self.fd)  # closing releases the lock


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:  # deleted meanwhile by another writer
        return 0


def log_bytes(directory) -> int:
    """What the log's parts hold now, in bytes: counted between two writes, as one sees it."""
    d = Path(directory)
    with _Locked(d):
        return sum(_size(p) for p in d.glob(PART_GLOB))


# ---- reading --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Logged:
    """One logged request with its documents resolved."""

    record: dict
    world: dict  # the world document
    skills: dict  # the skills document

    @property
    def task(self) -> str:
        return self.record["task"]


def read_log(directory) -> tuple[list[Logged], int]:
    """Every whole request in ``directory``, oldest first. -> (requests, lines skipped): a line
    cut short (no newline yet, or a crash), one that does not parse, a document whose hash does
    not match it, or a request whose documents its part lacks."""
    d = Path(directory)
    if not d.is_dir():
        raise ThorError(f"no request log at {d}")
    out, skipped = [], 0
    for part in sorted(d.glob(PART_GLOB)):
        try:
            data = part.read_bytes()
        except FileNotFoundError:  # rotated away while we read
            continue
        lines = data.split(b"\n")
        skipped += bool(lines[-1])  # the last line is whole only once its newline is there
        docs: dict[str, dict] = {}
        for raw in lines[:-1]:
            rec = _parse(raw)
            if rec is None:
                skipped += 1
            elif rec.get("kind") in ("world", "skills"):
                if isinstance(rec.get("doc"), dict) and doc_hash(rec["doc"]) == rec.get("sha256"):
                    docs[rec["sha256"]] = rec["doc"]
                else:
                    skipped += 1
            elif rec.get("kind") == "request":
                w, s = docs.get(rec.get("world")), docs.get(rec.get("skills"))
                if w is None or s is None or not isinstance(rec.get("task"), str):
                    skipped += 1
                else:
                    out.append(Logged(rec, w, s))
    return out, skipped


def _parse(raw: bytes) -> dict | None:
    try:
        rec = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) and rec.get("v") == VERSION else None
