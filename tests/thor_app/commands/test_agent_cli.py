"""`thor plan` in-process: exit codes 0 / 2 / 3, --json / --out, one real plan on the default model,
and a sweep of generated tasks over the sample worlds (exit code always matches validity)."""

from __future__ import annotations

import json
import random
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.files.loader import base_plan_schema
from agent.planner.planner import Planner
from agent.schema.specialize import specialize
from agent.schema.validator import PlanValidator
from agent.symbolic.executor import symbolic_findings
from agent.symbolic.gate import check_plan, gate_findings
from tests.helpers.strategies import JSON, PROPERTY, SCHEMA, SKILLS, WORLD, mostly
from tests.helpers.worlds import WORLDS, kitchen_dict, world_and_skills
from thor_app.assembly import assembled_with
from thor_app.cli import main
from thor_app.commands import plan as agent_cli
from thor_runtime.config import PlannerSettings
from thor_runtime.engine.generate import Runtime
from thor_runtime.speculative import SpecOptions, build_speculation


# ---- CLI ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_long(tiny_dirs, tmp_path_factory):
    """The tiny llama with a 4k context: its 320-token BPE spells a sample world's prompt in ~1.5k
    tokens."""
    d = tmp_path_factory.mktemp("tiny_long") / "llama"
    shutil.copytree(tiny_dirs["llama"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 4096
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture
def no_model(monkeypatch):
    def refuse(config):
        raise AssertionError("the model must not be loaded for bad input")

    monkeypatch.setattr(agent_cli, "build_runtime", refuse)


def _bad_files(tmp):
    d = kitchen_dict()
    d["robot"]["workspace"]["max"] = [0.6, 0.6]
    (tmp / "bad_world.json").write_text(json.dumps(d))
    (tmp / "bad_skills.json").write_text('{"skills": [{"name": "pick", "args": {}}]}')
    s = base_plan_schema()
    s["properties"]["steps"]["uniqueItems"] = True
    (tmp / "unique.json").write_text(json.dumps(s))
    (tmp / "notschema.json").write_text('{"type": 12}')
    d = kitchen_dict()
    d["skills"] = "skills\x00.json"
    (tmp / "nul_skills.json").write_text(json.dumps(d))
    (tmp / "deep.json").write_text("[" * 100_000)
    d = kitchen_dict()
    d["name"] = "\ud800"
    (tmp / "surrogate.json").write_text(json.dumps(d))  # the escape: valid JSON
    return tmp


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--world", "{tmp}/missing.json"], ["world file not found", "missing.json"]),
        (["--world", "{tmp}/bad_world.json"], ["bad_world.json", "robot/workspace/max"]),
        (
            ["--world", "{kitchen}", "--skills", "{tmp}/bad_skills.json"],
            ["bad_skills.json", "description"],
        ),
        (["--world", "{kitchen}", "--schema", "{tmp}/unique.json"], ["unique.json", "uniqueItems"]),
        (
            ["--world", "{kitchen}", "--schema", "{tmp}/notschema.json"],
            ["notschema.json", "not a valid JSON Schema"],
        ),
        (["--world", "{tmp}/nul_skills.json"], ["nul_skills.json", "not a usable path"]),
        (["--world", "{tmp}/deep.json"], ["deep.json", "nested too deeply"]),
        (["--world", "{tmp}/surrogate.json"], ["surrogate.json", "not valid Unicode"]),
        (["--world", "{kitchen}", "--attempts", "-1"], ["--attempts"]),
        (["--world", "{kitchen}", "--out", "{tmp}/no/such/dir/plan.json"], ["--out"]),
        (["--world", "{kitchen}", "--spec", "beam"], ["beam"]),
    ],
)
def test_cli_bad_input_exits_2_without_loading_the_model(tmp_path, capsys, no_model, extra, words):
    tmp = _bad_files(tmp_path)
    argv = ["plan", "pick up the apple"] + [
        a.format(tmp=tmp, kitchen=WORLDS["kitchen"]) for a in extra
    ]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("thor: error:") and "Traceback" not in out.err
    for w in words:
        assert w in out.err


def _impossible(tmp):
    """Nothing in this world is light enough to pick, and pick is the only skill: no plan passes."""
    d = kitchen_dict()
    d["robot"]["max_payload_kg"] = 0.01
    d.pop("skills")
    (tmp / "heavy.json").write_text(json.dumps(d))
    (tmp / "pick_only.json").write_text(
        json.dumps(
            {
                "skills": [
                    {
                        "name": "pick",
                        "description": "grasp and lift",
                        "args": {"object": {"type": "object", "payload": True}},
                        "effects": [{"holding": "$object"}],
                    }
                ]
            }
        )
    )
    return tmp / "heavy.json", tmp / "pick_only.json"


def test_cli_exit_3_with_report(tmp_path, capsys, tiny_long):
    world, skills = _impossible(tmp_path)
    out = tmp_path / "plan.json"
    rc = main(
        [
            "plan",
            "pick up the apple",
            "--world",
            str(world),
            "--skills",
            str(skills),
            "--model",
            str(tiny_long),
            "--max-tokens",
            "120",
            "--attempts",
            "1",
            "--no-thinking",
            "--json",
            "--out",
            str(out),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 3
    obj = json.loads(cap.out)
    assert (
        set(obj) == {"plan", "valid", "report", "expansion", "stats"}
        and obj["valid"] is False
        and obj["report"]
    )
    assert obj["stats"]["attempts"] == 2
    assert "no valid plan after 2 attempt(s)" in cap.err and "[" in cap.err
    assert not out.exists()  # an invalid plan is never written


def test_cli_exit_0_default_model_and_spec_exactness(tmp_path, capsys, monkeypatch, default_model):
    """One real plan end to end (ngram), then the same request with plain decoding: same plan."""
    rt = Runtime(default_model.model, default_model.tokenizer)
    monkeypatch.setattr(
        agent_cli, "build_runtime", lambda config: assembled_with(config, default_model, rt)
    )
    out = tmp_path / "plan.json"
    task = "put the apple on the table"
    rc = main(
        [
            "plan",
            task,
            "--world",
            str(WORLDS["kitchen"]),
            "--model",
            "default",
            "--spec",
            "ngram",
            "--max-tokens",
            "200",
            "--attempts",
            "0",
            "--json",
            "--out",
            str(out),
        ]
    )
    cap = capsys.readouterr()
    obj = json.loads(cap.out)
    assert rc == 0, cap.err
    assert obj["valid"] and obj["report"] == [] and json.loads(out.read_text()) == obj["plan"]
    st = obj["stats"]
    assert st["attempts"] == 1 and st["jump_forward_tokens"] > 0 and st["generated_tokens"] > 0
    assert st["spec"] == "ngram" and res_spec(rt, task) == "combined"
    w, s = world_and_skills("kitchen")
    assert check_plan(obj["plan"], specialize(base_plan_schema(), w, s), w, s).valid
    assert not list(tmp_path.glob(".plan.json.*"))  # the temp file was renamed away
    # the planner as the CLI builds it (the config's goal choice), with plain decoding
    plain = Planner(
        rt,
        default_model.tokenizer,
        max_tokens=200,
        attempts=0,
        goal_choice=PlannerSettings().goal_choice,
    )
    res = plain.plan(task, w, s)
    assert res.plan == obj["plan"] and res.stats["generated_tokens"] == st["generated_tokens"]
    assert st["cycles"] < res.stats["cycles"]  # ngram drafts were accepted


def res_spec(rt, task) -> str:
    """The proposer the planner's default (auto) runs on the default model."""
    w, s = world_and_skills("kitchen")
    auto = build_speculation(SpecOptions(method="auto"), rt.model)
    return Planner(rt, rt.tok, auto, max_tokens=16, attempts=0).plan(task, w, s).stats["spec"]


# ---- sweep -------------------------------------------------------------------------------------
TEMPLATES = [
    "pick up the {obj} and put it on the {place}",
    "move the {obj} to the {place}",
    "bring the {obj} to {place}",
    "open the {obj}",
    "wait 5 seconds, then pick up the {obj}",
    "scan {place} and report",
    "put the {obj} in the {place} carefully",
    "go to {place}",
]


def sweep_tasks(n=51, seed=7):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name = list(WORLDS)[i % 3]
        w, _ = world_and_skills(name)
        t = rng.choice(TEMPLATES).format(
            obj=rng.choice(w.objects).name.replace("_", " "),
            place=rng.choice(w.places).name.replace("_", " "),
        )
        out.append((name, t))
    return out


def tight_schema():
    """The real plan schema with short strings and one step, so the tiny random model
    finishes plans inside a small budget (one step) and the gate decides (both outcomes occur)."""
    s = base_plan_schema()
    s["properties"]["plan_id"]["pattern"] = "^p[0-9]$"
    s["properties"]["task"]["maxLength"] = 12
    s["properties"]["steps"]["maxItems"] = 1
    s["properties"].pop("rationale")
    # a user schema may leave the goal out (then only executability is checked symbolically);
    # a one-step random plan rarely states a goal its step reaches, and both outcomes must occur
    s["properties"].pop("goal")
    s["required"].remove("goal")
    s["$defs"]["notes"].update(maxItems=1)
    s["$defs"]["notes"]["items"]["maxLength"] = 8
    return s


def test_sweep_exit_codes_match_validity(tmp_path, capsys, tiny_long):
    schema_path = tmp_path / "tight.json"
    schema_path.write_text(json.dumps(tight_schema()))
    codes = []
    for i, (name, task) in enumerate(sweep_tasks()):
        argv = [
            "plan",
            task,
            "--world",
            str(WORLDS[name]),
            "--model",
            str(tiny_long),
            "--schema",
            str(schema_path),
            "--max-tokens",
            "240",
            "--attempts",
            str(int(i % 4 == 0)),
            "--json",
            "--spec",
            ["ngram", "none"][i % 2],
        ]
        if i % 3:
            argv.append("--no-thinking")
        rc = main(argv)
        cap = capsys.readouterr()
        obj = json.loads(cap.out)
        codes.append(rc)
        assert rc in (0, 3), cap.err
        w, s = world_and_skills(name)
        if rc == 0:
            spec = specialize(tight_schema(), w, s)
            assert obj["valid"] and obj["report"] == []
            assert not list(PlanValidator(spec).iter_errors(obj["plan"]))
            assert (
                gate_findings(obj["plan"], w, s) == []
                and symbolic_findings(obj["plan"], w, s) == []
            )
        else:
            assert not obj["valid"] and obj["report"], task
            assert "no valid plan" in cap.err
    assert len(codes) >= 50 and set(codes) == {0, 3}  # both outcomes exercised


def test_cli_any_world_skills_or_schema_file_exits_2_or_plans(tmp_path, capsys, monkeypatch):
    """Property-based (strategies.py): whatever a world, skills or schema file holds, `thor plan`
    either refuses it with exit 2 and a one-line error (no traceback, the model not loaded) or
    goes on to load the model."""

    class Loaded(Exception):
        pass

    def reached(config):
        raise Loaded

    monkeypatch.setattr(agent_cli, "build_runtime", reached)
    seen = {"refused": 0, "loaded": 0}

    @PROPERTY
    @given(
        world=mostly(WORLD, JSON),
        skills=st.none() | mostly(SKILLS, JSON),
        schema=st.none() | mostly(SCHEMA, JSON),
    )
    def one(world, skills, schema):
        argv = ["plan", "put the red cup in the sink"]
        for flag, doc in (("--world", world), ("--skills", skills), ("--schema", schema)):
            if doc is not None:
                (tmp_path / f"{flag[2:]}.json").write_text(json.dumps(doc))
                argv += [flag, str(tmp_path / f"{flag[2:]}.json")]
        capsys.readouterr()  # what an earlier example printed
        try:
            rc = main(argv)
        except Loaded:
            seen["loaded"] += 1
            return
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("thor: error:") and "Traceback" not in err, (
            rc,
            err[-600:],
        )
        seen["refused"] += 1

    one()
    assert seen["loaded"] >= 10 and seen["refused"] >= 10, seen  # both paths taken
