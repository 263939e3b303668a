"""`thor plan` without --model plans with the model `thor serve` hosts by default: the embedded
one, so neither needs a download. A pulled catalog model is chosen by name, never implicitly."""

from __future__ import annotations

import json

import pytest

from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import WORLDS, good_plan
from thor_app.assembly import assembled_with
from thor_app.cli import build_parser, main
from thor_app.commands import plan as plan_cli
from thor_app.flags import config_from_args
from thor_app.server.config import ServeConfig
from thor_runtime.catalog import MODELS_DIR_ENV

TASK = "put the apple on the table"


def _argv(*extra):
    return [
        "plan",
        TASK,
        "--world",
        str(WORLDS["kitchen"]),
        "--spec",
        "none",
        "--no-thinking",
        "--json",
        "--attempts",
        "0",
        *extra,
    ]


@pytest.fixture
def seen_models(monkeypatch, tiny_llama):
    """build_runtime replaced by one that records the model it was asked for and plans a good
    plan."""
    seen = []

    def build(config):
        seen.append(config.model.name)
        return assembled_with(
            config, tiny_llama, ScriptedRuntime(tiny_llama.tokenizer, [json.dumps(good_plan())])
        )

    monkeypatch.setattr(plan_cli, "build_runtime", build)
    return seen


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", TASK, "--world", "w.json"],
        ["generate", "hello"],
        ["bench"],
        ["selftest"],
        ["engines", "build"],
    ],
)
def test_every_command_defaults_to_the_service_model_and_settings(argv):
    served = ServeConfig().runtime
    got = config_from_args(build_parser().parse_args(argv))
    assert got.model.name == served.model.name == "default"
    assert got.model.device == served.model.device == "auto"
    if argv[0] in ("plan", "generate"):  # the runtime both run, field for field
        assert got.model == served.model and got.engine == served.engine


def test_the_default_model_needs_no_pull(tmp_path, monkeypatch, capsys, seen_models):
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))  # an empty models directory
    assert main(_argv()) == 0, capsys.readouterr().err
    assert seen_models == ["default"]
    assert json.loads(capsys.readouterr().out)["valid"] is True


def test_bad_input_is_reported_before_any_load(tmp_path, capsys, seen_models):
    assert main(["plan", TASK, "--world", str(tmp_path / "missing.json")]) == 2
    assert "world file not found" in capsys.readouterr().err and seen_models == []


@pytest.mark.parametrize("model", ["qwen2.5-coder-0.5b-instruct", "some/dir"])
def test_an_explicit_model_is_used(tmp_path, monkeypatch, capsys, seen_models, model):
    assert main(_argv("--model", model)) == 0, capsys.readouterr().err
    assert seen_models == [model]


def test_the_demo_and_the_installer_plan_with_the_planner_model():
    """`make demo` pulls the planner-grade model and plans with it, by name (thor plan's own
    default is the embedded model); the installer pulls the same one."""
    import re

    from tests.helpers.paths import ROOT
    from thor_runtime.catalog import PLANNER_DEFAULT

    root = ROOT
    make = (root / "Makefile").read_text()
    assert re.search(rf"^PLANNER_MODEL \?= {re.escape(PLANNER_DEFAULT)}$", make, re.M)
    demo = make.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "models pull $(PLANNER_MODEL)" in demo and "--model $(PLANNER_MODEL)" in demo
    assert f"PLANNER_MODEL={PLANNER_DEFAULT}" in (root / "deploy" / "install.sh").read_text()
