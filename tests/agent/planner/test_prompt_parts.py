"""Where a plan prompt's tokens go (agent/planner/prompt_parts.py, `thor bench --prompt-parts`):
the parts cover the prompt, the shared ones are the stored prefix, and each moves with what it
counts."""

from __future__ import annotations

import json

from agent.planner.prompt_parts import PARTS, prompt_parts, summarize
from tests.helpers.worlds import world_and_skills
from thor_app.cli import main
from thor_app.session import shared_prefix_ids


def test_the_parts_cover_the_prompt(default_model):
    tok = default_model.tokenizer
    w, s = world_and_skills("kitchen")
    p = prompt_parts(tok, "put the apple on the table", w, s)
    assert set(p) == {*PARTS, "total"} and all(p[k] > 0 for k in PARTS if k != "template")
    assert 0 <= p["template"] <= 40  # role markers and seams only: no text left uncounted
    shared = p["instructions"] + p["example"] + p["goal_forms"] + p["skills"]
    assert abs(shared - len(shared_prefix_ids(tok, s))) <= 20  # what the disk prefix holds
    longer = prompt_parts(
        tok, "put the apple on the table and then wipe the counter twice, carefully", w, s
    )
    assert (
        longer["task"] > p["task"]
        and longer["world"] == p["world"]
        and longer["skills"] == p["skills"]
    )
    fewer = type(s)(skills=s.skills[:2], source=s.source)
    q = prompt_parts(tok, "put the apple on the table", w, fewer)
    assert q["skills"] < p["skills"] and q["total"] < p["total"]


def test_summary_medians_and_shares():
    rows = [{**{k: 10 for k in PARTS}, "total": 70}, {**{k: 20 for k in PARTS}, "total": 140}]
    m = summarize(rows)
    assert (
        m["world"] == {"median": 15.0, "share": round(1 / 7, 3)} and m["total"]["median"] == 105.0
    )


def test_bench_prompt_parts_end_to_end(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["bench", "--prompt-parts", "--model", "default", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert "sample worlds" in doc["sets"] and any(
        k.startswith("8-blocksworld") for k in doc["sets"]
    )
    assert all(r["requests"] == len(r["rows"]) > 0 for r in doc["sets"].values())
    assert "| sample worlds |" in capsys.readouterr().out


def test_the_world_says_where_things_are_in_names_and_coordinates_only_where_they_earn_tokens():
    """Objects on a place or a support are located by its name; coordinates (the workspace, the
    places', an unplaced object's) appear only when a skill takes a position; mass only for what
    can be carried. The gate still checks reach and payload from the world file."""
    from agent.planner.prompt import describe_world

    w, s = world_and_skills("kitchen")  # manipulation skills: move_arm takes a position
    text = describe_world(w, s)
    assert "red_cup (cup, 0.25 kg, at counter)" in text and "[0.3,0.1,0.92]" not in text
    assert "drawer (drawer, [0.2,-0.4,0.7], closed, fixed)" in text  # nothing else locates it
    assert (
        "counter [0,0,0.9]" in text
        and "workspace x -0.6..0.6" in text
        and "max payload 2 kg" in text
    )
    no_positions = type(s)(
        skills=tuple(k for k in s.skills if all(a.type != "position" for a in k.args)),
        source=s.source,
    )
    bare = describe_world(w, no_positions)
    assert "[" not in bare and "workspace" not in bare and "Places: counter; sink;" in bare
    assert "drawer (drawer, closed, fixed)" in bare and "max payload 2 kg" in bare
    assert describe_world(w) == text  # no skills given: as if one took positions
