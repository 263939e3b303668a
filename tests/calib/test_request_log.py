"""The request log (calib/request_log.py): its documents load back to the same world and skills;
its parts never hold more than the configured bytes, however many records, threads or writers;
parts rotate and the oldest go first; a record is whole or absent (a short write is cut back, a
torn or damaged line is skipped by the reader)."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace

import pytest

from agent.files.loader import skills_from_dict, world_from_dict
from calib import request_log as rl
from calib.prompts import robot_requests
from calib.request_log import RequestLog, log_bytes, read_log, skills_doc, world_doc
from tests.helpers.worlds import WORLDS, world_and_skills
from thor_runtime.errors import ThorError

MAX, PART = 64 * 1024, 16 * 1024


@pytest.fixture(scope="module")
def kitchen():
    return world_and_skills("kitchen")


def _parts(d):
    return sorted(d.glob(rl.PART_GLOB))


@pytest.mark.parametrize("name", sorted(WORLDS))
def test_the_documents_load_back_to_the_same_world_and_skills(name):
    w, s = world_and_skills(name)
    assert world_from_dict(world_doc(w)) == replace(w, source="<memory>", skills_ref=None)
    assert skills_from_dict(skills_doc(s)) == replace(s, source="<memory>")


def test_generated_worlds_with_aliases_states_and_supports_load_back_too():
    seen = set()
    for r in robot_requests("train", 24, seed=3):
        want = replace(r.world, source="<memory>", skills_ref=None)
        assert world_from_dict(world_doc(r.world)) == want
        assert skills_from_dict(skills_doc(r.skills)) == replace(r.skills, source="<memory>")
        seen |= {k for o in world_doc(r.world)["objects"] for k in o}
    assert {"aliases", "at", "state"} <= seen


def test_never_more_than_the_configured_bytes_and_the_oldest_go_first(tmp_path, kitchen):
    log = RequestLog(tmp_path, MAX, PART)
    for i in range(300):
        assert log.append(*kitchen, f"task {i}", "{}", model="m", valid=True, attempts=1)
        assert log_bytes(tmp_path) <= MAX
    parts = _parts(tmp_path)
    assert 2 < len(parts) <= MAX // PART + 1 and all(p.stat().st_size <= PART for p in parts)
    got, skipped = read_log(tmp_path)
    tasks = [g.task for g in got]
    assert skipped == 0 and tasks[-1] == "task 299" and "task 0" not in tasks
    assert tasks == [f"task {i}" for i in range(300 - len(tasks), 300)]  # newest kept, in order
    # each part stands alone: its first lines are the documents its requests name
    first = [json.loads(line) for line in parts[0].read_text().splitlines()[:3]]
    assert [x["kind"] for x in first] == ["world", "skills", "request"]
    assert got[0].world == world_doc(kitchen[0]) and got[0].skills == skills_doc(kitchen[1])
    assert {p.stat().st_mode & 0o777 for p in parts} == {0o600}  # private to the service's user


def test_threads_and_two_writers_share_a_directory_within_the_bound(tmp_path, kitchen):
    logs = [RequestLog(tmp_path, MAX, PART), RequestLog(tmp_path, MAX, PART)]  # as two processes
    sizes = []  # what the parts held after each append (an assert in a thread fails nothing)

    def plan(n):
        for i in range(40):
            logs[n % 2].append(*kitchen, f"thread {n} task {i}", "{}")
            sizes.append(log_bytes(tmp_path))

    threads = [threading.Thread(target=plan, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got, skipped = read_log(tmp_path)
    assert len(sizes) == 240 and max(sizes) <= MAX
    assert skipped == 0 and len(got) > 10
    assert len({g.task for g in got}) == len(got)  # no record twice, none interleaved
    # a writer whose part another deleted opens a new one instead of writing into the void
    for p in _parts(tmp_path):
        p.unlink()
    assert logs[0].append(*kitchen, "after", "{}") and [g.task for g in read_log(tmp_path)[0]] == [
        "after"
    ]


def test_a_torn_or_damaged_line_is_skipped(tmp_path, kitchen):
    log = RequestLog(tmp_path, MAX, PART)
    log.append(*kitchen, "one", "{}")
    log.append(*kitchen, "two", "{}")
    part = _parts(tmp_path)[-1]
    with open(part, "ab") as f:
        f.write(b'{"kind": "request", "v": 1, "task": "torn')  # a crash mid-record
    got, skipped = read_log(tmp_path)
    assert [g.task for g in got] == ["one", "two"] and skipped == 1
    lines = part.read_bytes().split(b"\n")
    doc = json.loads(lines[0])
    doc["doc"]["name"] = "tampered"  # no longer the document its hash names
    lines[0] = json.dumps(doc).encode()
    lines.insert(2, b"\x00\x00 not json")
    part.write_bytes(b"\n".join(lines))
    got, skipped = read_log(tmp_path)
    assert got == [] and skipped == 5  # the world, the junk, two requests without it, the tail
    with pytest.raises(ThorError, match="no request log"):
        read_log(tmp_path / "nothing")


def test_a_short_write_leaves_no_half_record(tmp_path, kitchen, monkeypatch):
    log = RequestLog(tmp_path, MAX, PART)
    log.append(*kitchen, "whole", "{}")
    size = log_bytes(tmp_path)
    real = os.write
    monkeypatch.setattr(rl.os, "write", lambda fd, data: real(fd, data[: len(data) // 2]))
    with pytest.raises(OSError):
        log.append(*kitchen, "cut", "{}")
    monkeypatch.setattr(rl.os, "write", real)
    assert log_bytes(tmp_path) == size  # cut back to the last whole record
    log.append(*kitchen, "next", "{}")
    assert [g.task for g in read_log(tmp_path)[0]] == ["whole", "next"]


def test_a_record_larger_than_the_log_is_dropped(tmp_path, kitchen):
    log = RequestLog(tmp_path, rl.MIN_PART_BYTES)
    assert not log.append(*kitchen, "x" * rl.MIN_PART_BYTES, "{}")
    assert log_bytes(tmp_path) == 0 and read_log(tmp_path) == ([], 0)
    with pytest.raises(ThorError, match="at least"):
        RequestLog(tmp_path, 100)
