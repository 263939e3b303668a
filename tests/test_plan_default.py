"""`thor plan` without --model: the planner-grade catalog model when it is pulled, else exit 2
naming both ways on (pull it, or --model default) — never a quiet fall-back to the 135M model."""
from __future__ import annotations

import json

import pytest
from test_agent import WORLDS, ScriptedRuntime, good_plan

from thor_app.cli import build_parser, main
from thor_app.commands import plan as plan_cli
from thor_runtime.errors import ThorError
from thor_runtime.models import CATALOG, MODELS_DIR_ENV, PLANNER_DEFAULT, model_path

TASK = "put the apple on the table"


def _argv(*extra):
    return ["plan", TASK, "--world", str(WORLDS["kitchen"]), "--spec", "none", "--no-thinking", "--json",
            "--attempts", "0", *extra]


@pytest.fixture
def seen_models(monkeypatch, tiny_llama):
    """build_runtime replaced by one that records the model it was asked for and plans a good plan."""
    seen = []

    def build(args):
        seen.append(args.model)
        return tiny_llama, ScriptedRuntime(tiny_llama.tokenizer, [json.dumps(good_plan())])
    monkeypatch.setattr(plan_cli, "build_runtime", build)
    return seen


def test_the_planner_default_is_a_catalog_model_and_generate_keeps_the_embedded_one():
    assert PLANNER_DEFAULT in CATALOG
    parser = build_parser()
    assert parser.parse_args(["plan", TASK, "--world", "w.json"]).model is None  # resolved after the inputs
    assert parser.parse_args(["generate", "hello"]).model == "default"


def test_not_installed_is_exit_2_with_both_ways_on(tmp_path, monkeypatch, capsys, seen_models):
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))  # an empty models directory
    assert main(_argv()) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and seen_models == []            # nothing loaded, nothing planned
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("thor: error:") and "Traceback" not in cap.err
    assert f"`thor models pull {PLANNER_DEFAULT}`" in lines[0] and "--model default" in lines[0]
    assert "not installed" in lines[0]


def test_bad_input_is_still_reported_first_when_the_model_is_missing(tmp_path, monkeypatch, capsys, seen_models):
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))
    argv = ["plan", TASK, "--world", str(tmp_path / "missing.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "world file not found" in err and "models pull" not in err and seen_models == []


def test_installed_default_is_used(tmp_path, monkeypatch, capsys, seen_models):
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))
    path = model_path(CATALOG[PLANNER_DEFAULT], tmp_path)  # what `thor models pull` leaves (loading verifies it)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF")
    assert main(_argv()) == 0, capsys.readouterr().err
    assert seen_models == [PLANNER_DEFAULT]
    assert json.loads(capsys.readouterr().out)["valid"] is True


@pytest.mark.parametrize("model", ["default", "some/dir"])
def test_an_explicit_model_needs_no_planner_model(tmp_path, monkeypatch, capsys, seen_models, model):
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))  # the planner model is absent: no matter
    assert main(_argv("--model", model)) == 0, capsys.readouterr().err
    assert seen_models == [model]


def test_planner_model_resolution(tmp_path):
    with pytest.raises(ThorError, match="--model default"):
        plan_cli.planner_model(None, tmp_path)
    assert plan_cli.planner_model("default", tmp_path) == "default"
    path = model_path(CATALOG[PLANNER_DEFAULT], tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert plan_cli.planner_model(None, tmp_path) == PLANNER_DEFAULT
