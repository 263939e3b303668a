"""Requests from the fleet (calib/fleet.py): a logged request is read back as the very prompt the
robot planned from; repeats are one request; the held-out split never shares a world with the
train split; `gen-data --from-log` makes data `distill` reads, and refuses to resume on a log
that changed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from agent.planner.prompt import build_messages
from calib.datagen import GenConfig, generate_dataset
from calib.distill import read_data
from calib.fleet import fleet_items, fleet_requests, world_key, world_split
from calib.prompts import PromptSpec
from calib.request_log import RequestLog, world_doc
from tests.helpers.worlds import world_and_skills
from thor_runtime.errors import ThorError

MB = 1 << 20


def _renamed(world, name):
    return replace(world, name=name)


def test_a_logged_request_is_the_prompt_the_robot_planned_from(tmp_path):
    log = RequestLog(tmp_path, MB)
    asked = []
    for name in ("kitchen", "warehouse", "lab_bench"):
        w, s = world_and_skills(name)
        log.append(w, s, f"tidy the {name}", "{}")
        asked.append((w, s, f"tidy the {name}"))
    got = fleet_requests(tmp_path, "train") + _heldout(tmp_path)
    by_task = {r.task: r for r in got}
    for w, s, task in asked:
        r = by_task[task]
        assert r.messages == build_messages(task, w, s)
        assert r.world == replace(w, source=r.world.source, skills_ref=None)


def _heldout(d):
    try:
        return fleet_requests(d, "heldout")
    except ThorError:
        return []


def test_repeats_are_one_request(tmp_path):
    w, s = world_and_skills("kitchen")
    log = RequestLog(tmp_path, MB)
    for task in ("Put the apple  on the table", "put the apple on the table", "open the drawer"):
        log.append(w, s, task, "{}")
    log.append(w, s, "open the drawer", "another answer")
    moved = replace(w, objects=(replace(w.objects[0], position=(0.1, 0.1, 0.1)),) + w.objects[1:])
    log.append(moved, s, "open the drawer", "{}")  # another world document: another request
    split = world_split(world_doc(w))
    assert world_split(world_doc(moved)) == split  # the same site, things moved: same split
    got = fleet_requests(tmp_path, split)
    assert [r.task for r in got] == ["Put the apple  on the table"] + ["open the drawer"] * 2
    assert got[1].world != got[2].world
    assert len(fleet_requests(tmp_path, split, n=2)) == 2


def test_the_splits_never_share_a_world(tmp_path):
    w, s = world_and_skills("kitchen")
    log = RequestLog(tmp_path, 8 * MB)
    for i in range(48):
        for task in ("put the apple on the table", "open the drawer"):
            log.append(_renamed(w, f"kitchen_{i}"), s, task, "{}")
    train, held = fleet_requests(tmp_path, "train"), fleet_requests(tmp_path, "heldout")
    assert len(train) + len(held) == 96 and held and len(train) > len(held)
    train_worlds = {world_key(world_doc(r.world)) for r in train}
    held_worlds = {world_key(world_doc(r.world)) for r in held}
    assert train_worlds.isdisjoint(held_worlds)
    assert {r.world.name for r in train}.isdisjoint({r.world.name for r in held})
    assert [r.task for r in fleet_requests(tmp_path, "heldout")] == [r.task for r in held]


def test_an_empty_split_or_a_missing_log_is_said(tmp_path):
    with pytest.raises(ThorError, match="no request log"):
        PromptSpec("train", 4, from_log=str(tmp_path / "nothing"))
    w, s = world_and_skills("kitchen")
    RequestLog(tmp_path, MB).append(w, s, "open the drawer", "{}")
    other = "heldout" if world_split(world_doc(w)) == "train" else "train"
    with pytest.raises(ThorError, match=f"no logged requests in the {other} split"):
        fleet_requests(tmp_path, other)


def test_gen_data_from_the_log_is_data_distill_reads(tiny_llama_long, tmp_path):
    m, logdir, out = tiny_llama_long, tmp_path / "log", tmp_path / "data"
    log = RequestLog(logdir, MB)
    w, s = world_and_skills("kitchen")
    sites = [_renamed(w, f"site_{j}") for j in range(40)]
    sites = [site for site in sites if _train(site)][:3]  # worlds of the train split
    for i, site in enumerate(sites):
        log.append(site, s, f"put the apple on the table {i}", "{}")
    spec = PromptSpec("train", 8, from_log=str(logdir))
    items = fleet_items(spec)
    assert len(items) == 3 and all(req is not None for _, req in items)
    summary = generate_dataset(m.model, m.tokenizer, spec, GenConfig(3, 2), out, progress=False)
    assert summary["prompts"] == summary["generated_now"] == 3
    man, seqs = read_data([out])
    assert man["from_log"] is True and len(seqs) == 3
    for seq in seqs:
        assert seq["ids"][: seq["prompt_len"]] == m.tokenizer.encode_chat(items[seq["index"]][0])
    # resumed on the same log: nothing to do; on a log that grew: refused, not mixed
    assert (
        generate_dataset(m.model, m.tokenizer, spec, GenConfig(3, 2), out, progress=False)[
            "generated_now"
        ]
        == 0
    )
    log.append(sites[0], s, "open the drawer", "{}")
    with pytest.raises(ThorError, match="prompt_set_sha256"):
        generate_dataset(m.model, m.tokenizer, spec, GenConfig(3, 2), out, progress=False)
    assert json.loads((out / "manifest.json").read_text())["from_log"] is True


def _train(world) -> bool:
    return world_split(world_doc(world)) == "train"


def test_cli_gen_data_from_log(tiny_llama_long, tmp_path, monkeypatch, capsys):
    from thor_app.cli import main
    from thor_app.commands import calib as calib_cmd

    loads = []
    monkeypatch.setattr(calib_cmd, "_load_target", lambda args, **kw: loads.append(args) or m)
    m, logdir = tiny_llama_long, tmp_path / "log"
    base = ["calib", "gen-data", "--max-tokens", "2", "--quiet", "--out", str(tmp_path / "d")]
    assert main(base + ["--from-log", str(logdir)]) == 2  # no log: said before any model loads
    assert "no request log" in capsys.readouterr().err and loads == []
    w, s = world_and_skills("kitchen")
    RequestLog(logdir, MB).append(w, s, "open the drawer", "{}")
    split = world_split(world_doc(w))
    assert main(base + ["--from-log", str(logdir), "--split", split, "--constrained"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["prompts"] == 1 and doc["split"] == split
