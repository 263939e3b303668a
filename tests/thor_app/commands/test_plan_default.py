"""`thor plan` without --model plans with the model `thor serve` hosts by default: the embedded
one, so neither needs a download. A pulled catalog model is chosen by name, or on a CUDA device
by the measured rule (thor_app/default_model.py), said in one line on stderr."""

from __future__ import annotations

import json

import pytest

from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import WORLDS, good_plan
from thor_app import default_model
from thor_app.assembly import assembled_with
from thor_app.cli import build_parser, main
from thor_app.commands import plan as plan_cli
from thor_app.flags import config_from_args
from thor_app.server.config import ServeConfig
from thor_runtime.catalog import CATALOG, MODELS_DIR_ENV, model_path
from thor_runtime.model_choice import CACHE_FILE, Measured

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


# ---- on a CUDA device: the measured choice ---------------------------------------------------
Q05, Q15 = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"


@pytest.fixture
def cuda_pulled(tmp_path, monkeypatch):
    """Both catalog models pulled (empty files; build_runtime is faked), the device a CUDA card,
    and each warm plan's time set by the test: {model: seconds}. -> (seconds, timed models)."""
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))
    for name in (Q05, Q15):
        p = model_path(CATALOG[name], tmp_path)
        p.parent.mkdir(parents=True)
        p.write_bytes(b"")
    seconds, timed = {}, []

    def measure(config, name):
        timed.append(name)
        return Measured(seconds[name], 3)

    monkeypatch.setattr(default_model, "cuda_card", lambda config: "NVIDIA Test Card")
    monkeypatch.setattr(default_model, "time_warm_plan", measure)
    return seconds, timed


def _decisions(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("thor plan: default model: ")]


def test_on_cuda_the_largest_model_within_the_goal_plans(capsys, seen_models, cuda_pulled):
    seconds, timed = cuda_pulled
    seconds.update({Q15: 1.4, Q05: 0.5})
    assert main(_argv()) == 0
    out, err = capsys.readouterr()
    assert seen_models == [Q15] and timed == [Q15]
    (line,) = _decisions(err)  # one line, on stderr
    assert Q15 in line and "1.40 s" in line and "2.00 s goal" in line
    assert json.loads(out)["valid"] is True  # --json: stdout holds the document alone


def test_on_cuda_a_slow_large_model_gives_way_and_the_figures_are_reused(
    capsys, seen_models, cuda_pulled
):
    seconds, timed = cuda_pulled
    seconds.update({Q15: 2.6, Q05: 0.5})
    assert main(_argv()) == 0
    assert seen_models == [Q05] and timed == [Q15, Q05]
    (line,) = _decisions(capsys.readouterr().err)
    assert f"{Q15} 2.60 s" in line
    seconds.update({Q15: 0.1})  # what a new measurement would say: it is not taken
    assert main(_argv()) == 0
    assert seen_models == [Q05, Q05] and timed == [Q15, Q05]
    assert "measured before" in _decisions(capsys.readouterr().err)[0]


def test_the_latency_goal_flag_sets_the_bar(capsys, seen_models, cuda_pulled):
    seconds, _ = cuda_pulled
    seconds.update({Q15: 1.4, Q05: 0.5})
    assert main(_argv("--latency-goal", "1.0")) == 0
    assert seen_models == [Q05] and "1.00 s goal" in _decisions(capsys.readouterr().err)[0]
    assert main(_argv("--latency-goal", "0")) == 0  # off: the embedded model, said so
    assert seen_models == [Q05, "default"]
    assert "latency_goal_s is 0" in _decisions(capsys.readouterr().err)[0]


def test_on_cuda_none_within_the_goal_keeps_the_embedded_model(capsys, seen_models, cuda_pulled):
    seconds, _ = cuda_pulled
    seconds.update({Q15: 5.0, Q05: 3.0})
    assert main(_argv()) == 0
    assert seen_models == ["default"]
    assert "no pulled catalog model plans within" in _decisions(capsys.readouterr().err)[0]


def test_on_cuda_with_nothing_pulled_the_embedded_model_plans(
    tmp_path, monkeypatch, capsys, seen_models, cuda_pulled
):
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path / "empty"))
    assert main(_argv()) == 0
    assert seen_models == ["default"] and cuda_pulled[1] == []
    assert "no catalog model is pulled" in _decisions(capsys.readouterr().err)[0]


@pytest.mark.parametrize("model", [Q05, "some/dir"])
def test_on_cuda_an_explicit_model_always_wins(capsys, seen_models, cuda_pulled, model):
    seconds, timed = cuda_pulled
    seconds.update({Q15: 0.9, Q05: 0.5})
    assert main(_argv("--model", model)) == 0
    assert seen_models == [model] and timed == [] and _decisions(capsys.readouterr().err) == []


def test_default_spelled_out_is_the_rule(capsys, seen_models, cuda_pulled):
    """`default` names the rule, not the 135M file: the installed thor.toml spells it, and a
    service installed that way must choose as one with no name does."""
    seconds, _ = cuda_pulled
    seconds.update({Q15: 0.9, Q05: 0.5})
    assert main(_argv("--model", "default")) == 0
    assert seen_models == [Q15] and len(_decisions(capsys.readouterr().err)) == 1


def test_on_the_cpu_nothing_changes(tmp_path, monkeypatch, capsys, seen_models, cuda_pulled):
    monkeypatch.setattr(default_model, "cuda_card", lambda config: None)
    assert main(_argv()) == 0
    assert seen_models == ["default"] and cuda_pulled[1] == []
    assert _decisions(capsys.readouterr().err) == [] and not (tmp_path / CACHE_FILE).exists()
