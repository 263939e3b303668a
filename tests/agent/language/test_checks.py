"""The checks that hold a goal to its task from the things it names and the amounts it says, in
any language (agent/language/checks.py)."""

from __future__ import annotations

import pytest

from agent.files.loader import DEFAULT_SKILLS, load_skills, world_from_dict
from agent.language.checks import absent, task_findings
from agent.language.lexicon import EMPTY, load_lexicon
from agent.language.mentions import read_words

WORLD = {
    "name": "studio",
    "objects": [
        {
            "name": "ink_tin",
            "type": "tin",
            "position": [0.3, 0.1, 0.9],
            "mass_kg": 0.3,
            "at": "bench",
            "aliases": ["Farbdose"],
        },
        {
            "name": "squeegee",
            "type": "tool",
            "position": [0.2, 0.0, 0.9],
            "mass_kg": 0.2,
            "at": "bench",
        },
    ],
    "places": [
        {"name": "bench", "position": [0.3, 0.0, 0.9]},
        {"name": "rack", "position": [0.1, 0.3, 1.0], "aliases": ["Regal"]},
    ],
    "robot": {"workspace": {"min": [-1, -1, 0], "max": [1, 1, 2]}, "max_payload_kg": 2.0},
}


@pytest.fixture(scope="module")
def ws():
    from pathlib import Path

    skills = load_skills(Path(DEFAULT_SKILLS).with_name("tabletop.json"))
    return world_from_dict(WORLD, source="<test>"), skills


def checks(task, goal, ws, lex=EMPTY):
    world, skills = ws
    return [
        f.check + ": " + f.message
        for f in task_findings(read_words(task, world, lex), {"goal": goal}, world, skills)
    ]


def test_a_goal_about_an_unnamed_object_is_held_to_the_task(ws):
    out = checks("Stell die Farbdose aufs Regal", [{"object": "squeegee", "at": "rack"}], ws)
    assert any(o.startswith("object: the goal is about squeegee") for o in out)
    assert any(o.startswith("goal: the task names ink_tin") for o in out)
    assert checks("Stell die Farbdose aufs Regal", [{"object": "ink_tin", "at": "rack"}], ws) == []


def test_missing_must_be_said_by_the_task(ws):
    assert checks("put the orchid on the rack", [{"missing": "orchid"}], ws) == []
    out = checks("put the orchid on the rack", [{"missing": "tulip"}], ws)
    assert out and out[0].startswith("object: the goal says 'tulip' is missing")


def test_a_thing_is_absent_only_where_the_task_says_it_and_the_world_has_no_such_thing(ws):
    world, _ = ws
    said = read_words("Bring die Orchidee zur Farbdose", world, EMPTY)
    assert absent(said, "Orchidee", world)
    assert absent(said, "orchidee", world)  # the words, not their case
    assert not absent(said, "tulip", world)  # not said: the model's own thing
    assert not absent(said, "Farbdose", world)  # an alias of ink_tin
    assert not absent(said, "ink_tin", world)  # the thing itself
    # part of a thing's name or alias, or more than one, is that thing, not a missing one
    said = read_words("put the ink tin and its lid on the rack", world, EMPTY)
    assert not absent(said, "ink", world) and not absent(said, "ink tin lid", world)
    assert absent(said, "lid", world)


def test_an_amount_said_with_a_known_unit_must_be_taken_by_a_call(ws):
    task = "schieb die Farbdose 5 cm nach rechts"
    lex = load_lexicon("en")  # knows "cm", not a word of German
    assert any(
        "says 0.05 m" in o for o in checks(task, [{"object": "ink_tin", "at": "bench"}], ws, lex)
    )
    push = {"do": "push", "args": {"object": "ink_tin", "direction": "right", "distance": 0.05}}
    assert checks(task, [push], ws, lex) == []
    # with no unit known the number asks for nothing (a count? a name?): it only ranks goals
    assert checks(task, [{"object": "ink_tin", "at": "bench"}], ws) == []
    # a lexicon that knows the unit holds the call to the converted amount only
    wrong = {"do": "push", "args": {"object": "ink_tin", "direction": "right", "distance": 5}}
    assert checks("shove the ink tin 5 cm right", [push], ws, lex) == []
    assert checks("shove the ink tin 5 cm right", [wrong], ws, lex) != []


def test_a_count_is_taken_by_times_and_an_amount_no_skill_takes_is_left_alone(ws):
    twice = {"do": "inspect", "args": {"object": "ink_tin"}, "times": 3}
    assert checks("inspect the ink tin 3 times", [twice], ws) == []
    # no argument of any skill takes 7777777 in any scale, and no call is asked for it
    assert (
        checks(
            "put the ink tin on the rack for order 7777777",
            [{"object": "ink_tin", "at": "rack"}],
            ws,
        )
        == []
    )


def test_grounding_ranks_the_goal_about_what_the_task_names(ws):
    from agent.language.checks import grounding

    world, skills = ws

    def g(task, goal):
        return grounding(read_words(task, world), goal, world, skills)

    task = "Stell die Farbdose aufs Regal"  # both things named by an alias, no lexicon
    assert g(task, [{"object": "ink_tin", "at": "rack"}]) == (2, 2)
    assert g(task, [{"do": "inspect", "args": {"object": "ink_tin"}}]) == (1, 1)
    # the goal writes a thing the task does not mention: it counts against it
    assert g(task, [{"object": "ink_tin", "at": "bench"}]) == (0, 1)
    assert g(task, [{"object": "squeegee", "at": "bench"}]) == (-2, 0)
    # a set covers the things it takes; a type the task says counts once, however many
    assert g("put the tin on the rack", [{"every": {"type": "tin"}, "at": "rack"}]) == (2, 2)
    assert g(task, [{"missing": "Pinsel"}]) == (0, 0)


def test_unnamed_runs_are_the_tasks_words_that_name_nothing_here(ws):
    world, _ = ws
    runs = read_words("Stell die Orchidee und 3 Tulpen aufs Regal", world, EMPTY).unnamed(2)
    texts = [t for _, t in runs]
    # no run says a thing of the world (Regal is the rack) or holds a number
    assert "regal" not in " ".join(texts) and not any("3" in t for t in texts)
    assert (2, "orchidee") in runs and (2, "orchidee und") in runs and (5, "tulpen") in runs
    assert all(len(t.split()) <= 2 for t in texts)
    # a word of a thing's name said alone is that thing's ("the tin")
    assert not any("tin" in t for _, t in read_words("move the tin", world, EMPTY).unnamed())
    # a script written without spaces: runs of characters, joined without them
    runs = read_words("把辣椒油拿到Regal", world, EMPTY).unnamed(3)
    assert (1, "辣椒油") in runs and all(" " not in t for _, t in runs)


def test_a_word_and_its_inflection_are_the_same_word():
    from agent.language.mentions import same_word

    assert same_word("tree", "trees") and same_word("becher", "bechers")
    assert same_word("tasse", "tassen") and same_word("regal", "regalen")
    # a short word takes one letter more at most; a three-letter one none
    assert not same_word("tree", "treetop") and not same_word("cup", "cups")
    assert not same_word("tree", "tray") and not same_word("辣椒", "辣椒油")
