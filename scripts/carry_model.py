"""Carry a model file larger than one transfer to a machine that accepts at most 64 MiB of files
per command and keeps its disk between consecutive commands (docs/cuda.md, "Carrying a real
model to the GPU machine").

    python scripts/carry_model.py split --model qwen2.5-coder-0.5b-instruct --out build/carry/q05
    python scripts/carry_model.py plan build/carry/q05        # which parts go in which command
    python scripts/carry_model.py check build/carry/q05       # there, after each command
    python scripts/carry_model.py join build/carry/q05 --out models/q05.gguf

``split`` cuts a file (or a pulled catalog model, ``--model NAME``) into parts of at most 60 MiB
and writes ``manifest.json``: every part's size and sha256 and the whole file's. ``join`` writes
the file only when every part and the whole match the manifest, into a temporary file renamed
into place, so a file under its final name is always complete. ``check``, ``plan`` and ``join``
use the standard library only: the receiving side may not have the project's dependencies.

Exit status: 0 done; 1 (``check``) a part is missing, bad or unexpected; 2 bad input, with one
line on stderr saying why.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MIB = 1 << 20
# The machine accepts 64 MiB per command; 60 leaves room for the manifest and whatever else of
# the working tree travels in the same command.
MAX_PART = 60 * MIB
FORMAT = "thor-carry/1"
MANIFEST = "manifest.json"
PART_PREFIX = "part-"
_CHUNK = MIB  # read size: the file is never held in memory whole
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CarryError(Exception):
    """Bad input or a refused join: one line for stderr, exit 2."""


def part_name(i: int) -> str:
    return f"{PART_PREFIX}{i:03d}"


def mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / 1024:.1f} KiB"


@dataclass(frozen=True)
class PartEntry:
    name: str
    size: int  # bytes
    sha256: str


@dataclass(frozen=True)
class Manifest:
    file: str  # the whole file's name (what `join --out DIR` writes under DIR)
    size: int  # bytes of the whole file
    sha256: str  # of the whole file
    part_size: int  # bytes of every part but the last
    parts: tuple[PartEntry, ...]  # in file order

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "file": self.file,
            "size": self.size,
            "sha256": self.sha256,
            "part_size": self.part_size,
            "parts": [{"name": p.name, "size": p.size, "sha256": p.sha256} for p in self.parts],
        }
        return json.dumps(doc, indent=1) + "\n"


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_manifest(doc) -> Manifest:
    """The manifest's fields, each checked: the part names are dictated by their index, so a
    manifest cannot point outside its directory or reorder the file."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("format") != FORMAT:
        raise ValueError(f"format is {doc.get('format')!r}, expected {FORMAT!r}")
    name = doc.get("file")
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
        raise ValueError("file must be a plain file name")
    size, whole, part_size = doc.get("size"), doc.get("sha256"), doc.get("part_size")
    if not _int(size) or size <= 0:
        raise ValueError("size must be a positive integer")
    if not isinstance(whole, str) or not _HEX64.fullmatch(whole):
        raise ValueError("sha256 must be 64 lowercase hex digits")
    if not _int(part_size) or not 1 <= part_size <= MAX_PART:
        raise ValueError(f"part_size must be 1..{MAX_PART} bytes")
    raw = doc.get("parts")
    if not isinstance(raw, list) or not raw:
        raise ValueError("parts must be a non-empty list")
    parts = []
    for i, p in enumerate(raw):
        if not isinstance(p, dict) or p.get("name") != part_name(i):
            raise ValueError(f"parts[{i}] must be named {part_name(i)}")
        if not _int(p.get("size")) or not 1 <= p["size"] <= part_size:
            raise ValueError(f"{part_name(i)}: size must be 1..part_size bytes")
        if not isinstance(p.get("sha256"), str) or not _HEX64.fullmatch(p["sha256"]):
            raise ValueError(f"{part_name(i)}: sha256 must be 64 lowercase hex digits")
        parts.append(PartEntry(p["name"], p["size"], p["sha256"]))
    if sum(p.size for p in parts) != size:
        raise ValueError(f"the parts' sizes add up to {sum(p.size for p in parts)}, not {size}")
    return Manifest(name, size, whole, part_size, tuple(parts))


def read_manifest(folder: Path) -> Manifest:
    path = folder / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CarryError(f"{path}: no manifest (it travels with the first part)") from None
    except (OSError, ValueError) as e:
        raise CarryError(f"{path}: not a readable JSON manifest ({e})") from None
    try:
        return _parse_manifest(doc)
    except ValueError as e:
        raise CarryError(f"{path}: bad manifest: {e}") from None


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_part_size(part_size: int) -> None:
    if not 1 <= part_size <= MAX_PART:
        raise CarryError(
            f"part size {part_size} bytes: must be 1 byte to {mib(MAX_PART)} "
            "(the machine accepts at most 64 MiB per command)"
        )


def split(
    src: Path, out: Path, part_size: int = MAX_PART, say: Callable[[str], None] = print
) -> Manifest:
    """Write ``src`` as out/part-000, part-001, ... and out/manifest.json, streaming. The
    manifest is written last: a folder with one holds a finished split."""
    _check_part_size(part_size)
    if not src.is_file():
        raise CarryError(f"{src}: no such file")
    out.mkdir(parents=True, exist_ok=True)
    # Parts left from another split would be joined into this one (or refused as extras there)
    stale = sorted(
        p.name for p in out.iterdir() if p.name == MANIFEST or p.name.startswith(PART_PREFIX)
    )
    if stale:
        raise CarryError(f"{out} already holds {stale[0]}: split into an empty directory")
    whole, parts = hashlib.sha256(), []
    try:
        with open(src, "rb") as f:
            while True:
                path, h, n = out / part_name(len(parts)), hashlib.sha256(), 0
                with open(path, "wb") as w:
                    while n < part_size and (block := f.read(min(_CHUNK, part_size - n))):
                        w.write(block)
                        h.update(block)
                        whole.update(block)
                        n += len(block)
                if n == 0:  # the file ended on a part boundary
                    path.unlink()
                    break
                parts.append(PartEntry(path.name, n, h.hexdigest()))
                say(f"{path.name}  {n:>10} bytes  {mib(n):>9}  sha256 {parts[-1].sha256}")
                if n < part_size:
                    break
    except BaseException:
        # a half-written split would block the next one (its parts count as stale)
        for p in out.glob(f"{PART_PREFIX}*"):
            p.unlink(missing_ok=True)
        raise
    if not parts:
        raise CarryError(f"{src} is empty: nothing to carry")
    m = Manifest(src.name, sum(p.size for p in parts), whole.hexdigest(), part_size, tuple(parts))
    _write_atomic(out / MANIFEST, m.to_json())
    say(f"{src.name}: {m.size} bytes in {len(parts)} parts of at most {mib(part_size)}")
    say(f"sha256 {m.sha256}; manifest {out / MANIFEST}")
    return m


def plan_batches(m: Manifest, budget: int = MAX_PART) -> list[list[PartEntry]]:
    """Consecutive parts packed into commands of at most ``budget`` bytes of parts each."""
    if not 1 <= budget <= MAX_PART:
        raise CarryError(f"budget {budget} bytes: must be 1 byte to {mib(MAX_PART)}")
    batches: list[list[PartEntry]] = []
    load = budget  # forces a first batch
    for p in m.parts:
        if p.size > budget:
            raise CarryError(
                f"{p.name} is {mib(p.size)}, over the {mib(budget)} budget: split again "
                "with a smaller --part-mib"
            )
        if load + p.size > budget:
            batches.append([])
            load = 0
        batches[-1].append(p)
        load += p.size
    return batches


def extras(folder: Path, m: Manifest) -> list[str]:
    """Parts in ``folder`` the manifest does not name (left from another split, or a typo)."""
    named = {p.name for p in m.parts}
    return sorted(
        p.name for p in folder.iterdir() if p.name.startswith(PART_PREFIX) and p.name not in named
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def part_status_quick(folder: Path, p: PartEntry) -> str:
    """part_status without the hash: join hashes while it copies."""
    path = folder / p.name
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    return "ok" if size == p.size else f"bad: {size} bytes, the manifest says {p.size}"


def part_status(folder: Path, p: PartEntry) -> str:
    """'ok', 'missing', or 'bad: why'."""
    quick = part_status_quick(folder, p)
    if quick == "ok" and _sha256(folder / p.name) != p.sha256:
        return "bad: sha256 does not match the manifest"
    return quick


def check(folder: Path, say: Callable[[str], None] = print) -> bool:
    """Print each part's status; True when every part is present and valid and none is extra."""
    m = read_manifest(folder)
    statuses = [(p.name, part_status(folder, p)) for p in m.parts]
    extra = extras(folder, m)
    for name, status in statuses:
        say(f"{name}  {status}")
    for name in extra:
        say(f"{name}  unexpected: not in {MANIFEST}")
    ok = sum(s == "ok" for _, s in statuses)
    missing = [n for n, s in statuses if s == "missing"]
    bad = [n for n, s in statuses if s.startswith("bad")]
    if ok == len(statuses) and not extra:
        say(f"all {ok} parts of {m.file} present and valid: ready to join")
        return True
    say(
        f"{ok} of {len(statuses)} parts of {m.file} present and valid; missing {len(missing)}"
        + (f" (next: {missing[0]})" if missing else "")
        + f", bad {len(bad)}, unexpected {len(extra)}"
    )
    return False


def join(folder: Path, out: Path, into_dir: bool = False) -> Path:
    """Rebuild the file at ``out``, or at out/<file> when ``out`` is a directory or
    ``into_dir``. Every check passes before the rename, so a refused join leaves nothing at the
    target."""
    m = read_manifest(folder)
    extra = extras(folder, m)
    if extra:
        raise CarryError(f"{folder}: unexpected part {extra[0]} not named in {MANIFEST}")
    # presence and size first: cheap, and refuses before a byte is written
    for p in m.parts:
        status = part_status_quick(folder, p)
        if status != "ok":
            raise CarryError(f"{folder / p.name}: {status}")
    target = out / m.file if into_dir or out.is_dir() else out
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    try:
        whole, n = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as w:
            for p in m.parts:
                h = hashlib.sha256()
                with open(folder / p.name, "rb") as r:
                    while block := r.read(_CHUNK):
                        w.write(block)
                        h.update(block)
                        whole.update(block)
                        n += len(block)
                if h.hexdigest() != p.sha256:
                    raise CarryError(
                        f"{folder / p.name}: sha256 does not match the manifest; carry it again"
                    )
            w.flush()
            os.fsync(w.fileno())
        if n != m.size or whole.hexdigest() != m.sha256:
            raise CarryError(
                f"joined {m.file} has sha256 {whole.hexdigest()} ({n} bytes), the manifest says "
                f"{m.sha256} ({m.size} bytes); nothing written"
            )
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def resolve_model(name: str, models_dir: str | None) -> Path:
    """A catalog model's pulled, verified file, as `thor models pull NAME` left it."""
    # Imported here, with the checkout put on the path, so that the other subcommands need only
    # the standard library and the script runs by its path without the project installed.
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from thor_runtime.catalog import lookup, verified_path
    from thor_runtime.catalog import models_dir as default_models_dir
    from thor_runtime.errors import ThorError

    try:
        return verified_path(lookup(name), default_models_dir(models_dir))
    except ThorError as e:
        raise CarryError(str(e)) from None


def _print_plan(folder: Path, m: Manifest, budget: int) -> None:
    batches = plan_batches(m, budget)
    for i, batch in enumerate(batches, 1):
        paths = " ".join(str(folder / p.name) for p in batch)
        size = sum(p.size for p in batch)
        print(f"command {i}/{len(batches)}: {paths} {folder / MANIFEST}  ({mib(size)})")
    print(
        f"{len(batches)} command(s) of at most {mib(budget)} of parts each, the manifest "
        f"({len(m.to_json())} bytes) with every one; then join"
    )


def _cmd_split(args) -> int:
    if (args.src is None) == (args.model is None):
        raise CarryError("split takes a file or --model NAME, not both or neither")
    if args.part_bytes is None and not 1 <= args.part_mib <= MAX_PART // MIB:
        raise CarryError(f"--part-mib {args.part_mib}: must be 1 to {MAX_PART // MIB}")
    part_size = args.part_bytes if args.part_bytes is not None else args.part_mib * MIB
    src = Path(args.src) if args.src else resolve_model(args.model, args.models_dir)
    out = Path(args.out)
    m = split(src, out, part_size)
    _print_plan(out, m, MAX_PART)
    return 0


def _cmd_plan(args) -> int:
    if not 1 <= args.budget_mib <= MAX_PART // MIB:
        raise CarryError(f"--budget-mib {args.budget_mib}: must be 1 to {MAX_PART // MIB}")
    folder = Path(args.dir)
    _print_plan(folder, read_manifest(folder), args.budget_mib * MIB)
    return 0


def _cmd_check(args) -> int:
    return 0 if check(Path(args.dir)) else 1


def _cmd_join(args) -> int:
    # "DIR/" names a directory even before it exists (the catalog's layout: root/NAME/FILE)
    into_dir = args.out.endswith(("/", os.sep))
    target = join(Path(args.dir), Path(args.out), into_dir)
    print(f"{target}: joined and verified")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="carry_model.py",
        description="Split a model into parts of at most 60 MiB, check and join them again.",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("split", help="cut a file into parts and write manifest.json")
    sp.add_argument("src", nargs="?", help="the file to split")
    sp.add_argument("--model", help="a catalog model's pulled file (thor models list)")
    sp.add_argument("--models-dir", help="where pulled models live (default as `thor models`)")
    sp.add_argument("--out", required=True, help="an empty (or new) directory for the parts")
    sp.add_argument("--part-mib", type=int, default=60, help="part size in MiB, 1..60")
    sp.add_argument("--part-bytes", type=int, help=argparse.SUPPRESS)  # small parts for tests
    sp.set_defaults(func=_cmd_split)
    pp = sub.add_parser("plan", help="which parts travel in which command")
    pp.add_argument("dir", help="the split's directory")
    pp.add_argument("--budget-mib", type=int, default=60, help="MiB of parts per command")
    pp.set_defaults(func=_cmd_plan)
    cp = sub.add_parser("check", help="which parts are present and valid (exit 1 if any is not)")
    cp.add_argument("dir", help="the directory the parts are gathered in")
    cp.set_defaults(func=_cmd_check)
    jp = sub.add_parser("join", help="rebuild the file when every part and the whole match")
    jp.add_argument("dir", help="the directory the parts are gathered in")
    jp.add_argument(
        "--out",
        required=True,
        help="the file to write, or a directory (existing, or ending in /) for it",
    )
    jp.set_defaults(func=_cmd_join)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CarryError as e:
        print(f"carry_model: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # unreadable source, full disk: still one line, not a traceback
        print(f"carry_model: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
