"""A set of things read from what the task's words say of its members (agent/language/set_reading.py) and
the goal that opens with it (task_leads._set_lead); a push repeated and the option said nearest
its length (task_leads._call_lead); a going in an order written as the skill the clause names."""
from __future__ import annotations

import pytest

from evals.evaluation import load_eval_set
from agent.files.loader import AGENT_DIR
from agent.language.task_match import grounding_findings
from agent.language.reading import read_task
from agent.symbolic.solver import complete

from tests.helpers.reading import SET9, fits_goal, read_set


@pytest.fixture(scope="module")
def shop():
    return load_eval_set(SET9)[1]["cycle_shop"]


@pytest.fixture(scope="module")
def linen():
    return load_eval_set(SET9)[1]["linen_store"]


def test_a_set_is_read_by_what_its_words_say_of_its_members(shop):
    w, _ = shop
    # a type in the plural, or after a word of a set
    assert read_set("Hang every tool up on the pegboard.", w) == ({"type": "tool"}, ("tool_pegboard",))
    assert read_set("Could you put the tools on the pegboard, all of them?", w) == ({"type": "tool"}, ("tool_pegboard",))
    # where they rest: cleared, said after a set word with a place after it, or a source
    assert read_set("Clear the service bench; it all goes on the spares shelf.", w) == (
        {"at": "service_bench"}, ("spares_shelf",))
    assert read_set("Anything on the degreaser tray should end up in the parts dish.", w) == (
        {"at": "degreaser_tray"}, ("parts_dish",))
    assert read_set("Every tool on the service bench goes on the pegboard.", w) == (
        {"at": "service_bench", "type": "tool"}, ("tool_pegboard",))
    assert read_set("Whatever you can lift from the spares shelf, take it to the service bench.", w) == (
        {"at": "spares_shelf", "carriable": True}, ("service_bench",))
    # "put all the tools on the pegboard": the place after the set is where they go
    assert read_set("Put all the tools on the pegboard.", w) == ({"type": "tool"}, ("tool_pegboard",))


def test_no_set_where_the_words_name_their_things_or_say_none(shop):
    w, _ = shop
    assert read_set("Put the chain lube and the tyre levers on the spares shelf.", w) is None      # no set word
    assert read_set("Put both the chain lube and the tyre levers on the spares shelf.", w) is None  # named things
    assert read_set("Move everything to the spares shelf.", w) is None        # neither a type nor a place of rest
    assert read_set("All done with the spoke wrench, hang it on the pegboard.", w) is None


def test_the_goal_opens_with_the_set_and_the_solver_reaches_it(shop):
    w, s = shop
    task = "Clear the service bench; it all goes on the spares shelf."
    said = [{"every": {"at": "service_bench"}, "at": "spares_shelf"}]
    assert fits_goal(task, said, w, s)
    # the members one by one, or another set, are not what the words say
    assert not fits_goal(task, [{"object": "chain_lube", "at": "spares_shelf"}], w, s)
    assert not fits_goal(task, [{"every": {"type": "tool"}, "at": "spares_shelf"}], w, s)
    assert grounding_findings(task, {"goal": said, "steps": []}, w, s) == []
    # the front wheel is too heavy for the arm (1.4 kg of 2.0 is not; the set is whatever rests there)
    plan = complete({"plan_id": "p1", "task": task, "goal": said, "steps": []}, w, s)
    placed = sorted(st["args"]["object"] for st in plan["steps"] if st["skill"] == "place")
    assert placed == ["chain_checker", "chain_lube", "front_wheel", "tyre_levers"]


def test_a_push_repeated_and_its_direction_said_nearest_its_length(shop):
    w, s = shop
    push = {"do": "push", "args": {"object": "chain_lube", "direction": "left", "distance": 0.05}}
    task = "Nudge the chain lube 5 cm to the left - it's right by the edge."
    assert fits_goal(task, [push], w, s)
    assert not fits_goal(task, [{**push, "args": {**push["args"], "direction": "right"}}], w, s)
    task = "Nudge the chain lube to the left 5 cm, three times."
    assert fits_goal(task, [{**push, "times": 3}], w, s) and not fits_goal(task, [push], w, s)
    assert grounding_findings(task, {"goal": [push], "steps": []}, w, s)          # the gate asks for the three


def test_a_going_in_an_order_is_the_skill_the_clause_names(linen):
    w, s = linen
    task = "Drive to the goods lift, then dock on your charger."
    r = read_task(task, w)
    assert [e.text() for e in r.events] == ["go to goods_lift", "go to linen_charger"]
    dock = [{"before": [{"robot_at": "goods_lift"}, {"do": "dock", "args": {"station": "linen_charger"}}]},
            {"robot_at": "linen_charger"}]
    drive = [{"before": [{"robot_at": "goods_lift"}, {"robot_at": "linen_charger"}]}, {"robot_at": "linen_charger"}]
    assert fits_goal(task, dock, w, s) and not fits_goal(task, drive, w, s)
    # said with a verb of going, it is the place
    task = "Drive to the goods lift, then head back to your charger."
    assert fits_goal(task, drive, w, s) and not fits_goal(task, dock, w, s)


def test_a_goal_opens_with_a_call_only_where_the_words_may_ask_for_one(shop):
    w, s = shop
    task = "Grab the chain checker and hang on to it for me."
    guess = [{"before": [{"do": "pick", "args": {"object": "chain_checker", "grasp": "top"}},
                         {"object": "chain_checker", "at": "service_bench"}]}, {"object": "chain_checker", "at": "service_bench"}]
    assert fits_goal(task, [{"holding": "chain_checker"}], w, s) and not fits_goal(task, guess, w, s)
    # a time (or a word of order or of a set, a skill's name, a look, a length, a count) lets it open with one
    assert fits_goal("Grab the chain checker and hang on to it for ten seconds.", guess, w, s)


def test_a_state_the_verb_asks_is_the_things_one_end_state(shop):
    w, s = shop
    task = "Close the bearing drawer or the dust gets in."
    closed = {"object": "bearing_drawer", "is": "closed"}
    assert fits_goal(task, [closed], w, s)
    assert not fits_goal(task, [closed, {"object": "bearing_drawer", "is": "open"}], w, s)


def test_a_thing_to_carry_that_is_not_here_is_only_missing(shop, linen):
    w, s = shop
    task = "Where has the sponge gone? Put it on the service bench."
    assert fits_goal(task, [{"missing": "sponge"}], w, s)
    assert not fits_goal(task, [{"do": "move_arm", "args": {"position": [0.1, 0.1, 0.9], "speed": 0.05}}], w, s)
    # a place's name that reads as a verb of carrying ("shelves") carries nothing
    assert not read_task("Give the clean shelves a look.", linen[0]).carry
