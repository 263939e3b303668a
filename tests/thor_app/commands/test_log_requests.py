"""--log-requests on `thor plan` and `thor serve` (and `[planner] log_requests` in the service's
file): without it a plan writes no request log anywhere; with it `thor plan` writes one record,
the plan it printed; the service's flag overrides its file."""

from __future__ import annotations

import json

import pytest

from calib.request_log import PART_GLOB, read_log
from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import WORLDS, good_plan
from thor_app.assembly import assembled_with
from thor_app.cli import build_parser, main
from thor_app.commands import plan as plan_cmd
from thor_app.commands.serve import serve_config

TASK = "put the apple on the table"


@pytest.fixture
def scripted(tiny_llama, monkeypatch, tmp_path):
    """`thor plan` over a runtime that answers the good plan, in a home and cache of its own."""
    for var, where in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("THOR_CACHE_DIR", "w")):
        monkeypatch.setenv(var, str(tmp_path / where))
    monkeypatch.chdir(tmp_path)
    rt = ScriptedRuntime(tiny_llama.tokenizer, [json.dumps(good_plan())])
    monkeypatch.setattr(
        plan_cmd, "build_runtime", lambda config: assembled_with(config, tiny_llama, rt)
    )
    return ["plan", TASK, "--world", str(WORLDS["kitchen"]), "--spec", "none", "--json"]


def test_thor_plan_logs_nothing_unless_asked(scripted, tmp_path, capsys):
    assert main(scripted) == 0
    assert json.loads(capsys.readouterr().out)["valid"]
    assert list(tmp_path.rglob(PART_GLOB)) == [] and not list(tmp_path.rglob(".lock"))


def test_thor_plan_logs_one_record_when_asked(scripted, tmp_path, capsys):
    assert main(scripted + ["--log-requests", "log", "--log-requests-max-mb", "2"]) == 0
    cap = capsys.readouterr()
    assert "logging plan requests to log (at most 2 MiB)" in cap.err
    got, skipped = read_log(tmp_path / "log")
    assert skipped == 0 and len(got) == 1 and got[0].task == TASK
    assert json.loads(got[0].record["response"]) == json.loads(cap.out)["plan"]


def test_thor_serve_flag_over_its_file(tmp_path):
    conf = tmp_path / "thor.toml"
    conf.write_text('[planner]\nlog_requests = "/from/file"\nlog_requests_max_mb = 8\n')
    parse = build_parser().parse_args
    assert serve_config(parse(["serve"])).planner.log_requests == ""  # off by default
    from_file = serve_config(parse(["serve", "--config", str(conf)])).planner
    assert (from_file.log_requests, from_file.log_requests_max_mb) == ("/from/file", 8)
    flag = ["serve", "--config", str(conf), "--log-requests", str(tmp_path / "x")]
    assert serve_config(parse(flag)).planner.log_requests == str(tmp_path / "x")
    off = serve_config(parse(["serve", "--config", str(conf), "--log-requests", ""])).planner
    assert off.log_requests == ""
