"""Tasks in German and Spanish planned end to end by `thor plan` with the planner model and no
lexicon: nothing in the code knows either language; the world file's aliases name its things."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.pulled import QWEN_05B, pulled_or_skip
from thor_app.cli import main

SETS = str(
    Path(__file__).resolve().parents[3] / "evals/sets/dev-{}-7-printstudio-aquarium-museum-skihire"
)


def _task(lang: str, task_id: str) -> str:
    doc = json.loads(open(f"{SETS.format(lang)}/tasks.json", encoding="utf-8").read())
    return next(t["task"] for t in doc["tasks"] if t["id"] == task_id)


@pytest.mark.parametrize("lang", ["de", "es"])
def test_a_task_in_another_language_is_planned_with_no_lexicon(lang, capsys):
    pulled_or_skip(QWEN_05B)
    task = _task(lang, "ps03")  # check the test print, then put it on the drying rack
    rc = main(
        [
            "plan",
            task,
            "--world",
            f"{SETS.format(lang)}/worlds/print_studio.json",
            "--model",
            QWEN_05B,
            "--lexicon",
            "none",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["valid"] and doc["report"] == []
    # the goal is about the things the task names by their aliases in the world file
    said = json.dumps(doc["plan"]["goal"])
    assert "test_print" in said and "drying_rack" in said
