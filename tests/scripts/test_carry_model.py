"""scripts/carry_model.py: a file split into parts comes back byte for byte, and every way a
carried part can go wrong (missing, corrupted, truncated, extra, a manifest that lies) is
refused with exit 2 and nothing at the target. Small files, parts of a few KB."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys

import pytest

from scripts.carry_model import (
    MANIFEST,
    MAX_PART,
    CarryError,
    main,
    plan_batches,
    read_manifest,
)
from tests.helpers.paths import ROOT

PART = 3000  # bytes: 10,000-byte files make four parts, the last one short


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(random.Random(7).randbytes(10_000))
    return path


@pytest.fixture
def parts(src, tmp_path):
    out = tmp_path / "parts"
    assert main(["split", str(src), "--out", str(out), "--part-bytes", str(PART)]) == 0
    return out


def join(parts, target) -> int:
    return main(["join", str(parts), "--out", str(target)])


def refused(capsys, parts, target, words: str) -> None:
    """join exits 2 with one line naming the fault, and leaves no file, temporary or final."""
    capsys.readouterr()
    assert join(parts, target) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err
    assert not target.parent.exists() or list(target.parent.iterdir()) == []


def test_split_then_join_gives_back_the_same_bytes(src, tmp_path, capsys):
    parts = tmp_path / "parts"
    assert main(["split", str(src), "--out", str(parts), "--part-bytes", str(PART)]) == 0
    m = read_manifest(parts)
    assert [p.name for p in m.parts] == ["part-000", "part-001", "part-002", "part-003"]
    assert [p.size for p in m.parts] == [PART, PART, PART, 1000]
    assert all((parts / p.name).stat().st_size <= PART for p in m.parts)
    assert m.file == "model.gguf" and m.size == 10_000
    assert m.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[:4]] == [p.name for p in m.parts]
    assert all(p.sha256 in line for p, line in zip(m.parts, out))
    assert "4 parts" in out[4] and "command 1/1" in out[6]
    target = tmp_path / "there" / "model.gguf"
    assert join(parts, target) == 0
    assert target.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.gguf"]  # no temp left


def test_a_file_ending_on_a_part_boundary_has_no_empty_part(tmp_path):
    src = tmp_path / "even.gguf"
    src.write_bytes(bytes(range(256)) * 12)  # 3072 bytes
    out = tmp_path / "parts"
    assert main(["split", str(src), "--out", str(out), "--part-bytes", "1024"]) == 0
    assert [p.size for p in read_manifest(out).parts] == [1024] * 3
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "part-000", "part-001", "part-002"]
    assert join(out, tmp_path / "dir") == 0  # a new path: the file itself
    assert (tmp_path / "dir").read_bytes() == src.read_bytes()


def test_join_into_a_directory_uses_the_manifests_file_name(src, parts, tmp_path):
    (tmp_path / "models").mkdir()
    assert join(parts, tmp_path / "models") == 0
    assert (tmp_path / "models" / "model.gguf").read_bytes() == src.read_bytes()
    # a trailing slash names a directory not made yet: the catalog's root/NAME/FILE layout
    assert main(["join", str(parts), "--out", f"{tmp_path}/root/name/"]) == 0
    assert (tmp_path / "root" / "name" / "model.gguf").read_bytes() == src.read_bytes()


def test_a_missing_part_is_refused(parts, tmp_path, capsys):
    (parts / "part-002").unlink()
    refused(capsys, parts, tmp_path / "out" / "model.gguf", "part-002: missing")


def test_a_corrupted_part_is_refused(parts, tmp_path, capsys):
    data = bytearray((parts / "part-001").read_bytes())
    data[100] ^= 1  # same size, one bit off
    (parts / "part-001").write_bytes(bytes(data))
    refused(capsys, parts, tmp_path / "out" / "model.gguf", "part-001: sha256")


def test_a_truncated_part_is_refused(parts, tmp_path, capsys):
    (parts / "part-000").write_bytes((parts / "part-000").read_bytes()[:-1])
    refused(capsys, parts, tmp_path / "out" / "model.gguf", "2999 bytes")


def test_a_manifest_naming_another_whole_hash_is_refused(parts, tmp_path, capsys):
    doc = json.loads((parts / MANIFEST).read_text())
    doc["sha256"] = "0" * 64  # every part still matches its own hash
    (parts / MANIFEST).write_text(json.dumps(doc))
    refused(capsys, parts, tmp_path / "out" / "model.gguf", "nothing written")


def test_an_extra_part_is_refused(parts, tmp_path, capsys):
    (parts / "part-004").write_bytes(b"left from another split")
    refused(capsys, parts, tmp_path / "out" / "model.gguf", "unexpected part part-004")


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda d: "not json", "not a readable JSON manifest"),
        (lambda d: {**d, "format": "other/9"}, "format"),
        (lambda d: {**d, "file": "../model.gguf"}, "plain file name"),
        (lambda d: {**d, "size": d["size"] + 1}, "add up to"),
        (lambda d: {**d, "parts": [{**d["parts"][0], "name": "../x"}] + d["parts"][1:]}, "named"),
        (lambda d: {**d, "parts": d["parts"][::-1]}, "named"),
    ],
    ids=["not-json", "format", "file-path", "size", "part-path", "order"],
)
def test_a_bad_manifest_is_refused(parts, tmp_path, capsys, edit, words):
    doc = edit(json.loads((parts / MANIFEST).read_text()))
    (parts / MANIFEST).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    refused(capsys, parts, tmp_path / "out" / "model.gguf", words)


def test_a_missing_manifest_is_refused(parts, tmp_path, capsys):
    (parts / MANIFEST).unlink()
    refused(capsys, parts, tmp_path / "out" / "model.gguf", "no manifest")


def test_a_refused_join_leaves_an_existing_target_alone(parts, tmp_path):
    target = tmp_path / "model.gguf.old"
    target.write_bytes(b"previous")
    (parts / "part-003").unlink()
    assert join(parts, target) == 2
    assert target.read_bytes() == b"previous"


def test_check_reports_each_part_as_they_arrive(parts, tmp_path, capsys):
    there = tmp_path / "there"
    there.mkdir()
    (there / MANIFEST).write_bytes((parts / MANIFEST).read_bytes())
    (there / "part-000").write_bytes((parts / "part-000").read_bytes())
    (there / "part-001").write_bytes((parts / "part-001").read_bytes()[:10])
    capsys.readouterr()
    assert main(["check", str(there)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == [
        "part-000  ok",
        f"part-001  bad: 10 bytes, the manifest says {PART}",
        "part-002  missing",
        "part-003  missing",
    ]
    assert "1 of 4" in lines[-1] and "next: part-002" in lines[-1]
    for name in ("part-001", "part-002", "part-003"):
        (there / name).write_bytes((parts / name).read_bytes())
    (there / "part-009").write_bytes(b"x")
    assert main(["check", str(there)]) == 1
    assert "part-009  unexpected" in capsys.readouterr().out
    (there / "part-009").unlink()
    assert main(["check", str(there)]) == 0
    assert "all 4 parts" in capsys.readouterr().out


def test_check_sees_a_corrupted_part_of_the_right_size(parts, capsys):
    data = (parts / "part-003").read_bytes()
    (parts / "part-003").write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    assert main(["check", str(parts)]) == 1
    assert "part-003  bad: sha256" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [["--part-mib", "61"], ["--part-mib", "0"], ["--part-bytes", str(MAX_PART + 1)]],
    ids=["61-mib", "0-mib", "bytes-over"],
)
def test_a_part_size_the_machine_cannot_take_is_refused(src, tmp_path, capsys, args):
    out = tmp_path / "parts"
    assert main(["split", str(src), "--out", str(out), *args]) == 2
    assert "must be 1" in capsys.readouterr().err
    assert not out.exists() or list(out.iterdir()) == []


def test_split_refuses_a_folder_holding_another_split(src, parts, capsys):
    assert main(["split", str(src), "--out", str(parts), "--part-bytes", "5000"]) == 2
    assert "already holds" in capsys.readouterr().err
    assert [p.size for p in read_manifest(parts).parts] == [PART, PART, PART, 1000]


def test_split_refuses_an_empty_file_and_leaves_no_part(tmp_path, capsys):
    (tmp_path / "empty.gguf").write_bytes(b"")
    out = tmp_path / "parts"
    assert main(["split", str(tmp_path / "empty.gguf"), "--out", str(out)]) == 2
    assert "nothing to carry" in capsys.readouterr().err and list(out.iterdir()) == []


def test_plan_packs_consecutive_parts_into_each_commands_budget(parts, capsys):
    m = read_manifest(parts)
    batches = plan_batches(m, budget=7000)
    assert [[p.name for p in b] for b in batches] == [
        ["part-000", "part-001"],
        ["part-002", "part-003"],
    ]
    assert [len(b) for b in plan_batches(m, budget=PART)] == [1, 1, 1, 1]
    assert main(["plan", str(parts)]) == 0  # 60 MiB: all four in one command
    assert "command 1/1" in capsys.readouterr().out
    with pytest.raises(CarryError, match="over the"):
        plan_batches(m, budget=PART - 1)
    assert main(["plan", str(parts), "--budget-mib", "61"]) == 2


def test_an_unknown_catalog_model_is_refused(tmp_path, capsys):
    assert main(["split", "--model", "no-such-model", "--out", str(tmp_path / "p")]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_the_script_runs_by_its_path_with_the_standard_library(parts, tmp_path):
    """The receiving side runs it as a file, from any folder."""
    script = ROOT / "scripts" / "carry_model.py"
    run = subprocess.run(
        [sys.executable, "-S", str(script), "check", str(parts)],  # -S: no site-packages
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    assert "all 4 parts" in run.stdout
