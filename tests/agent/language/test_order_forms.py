"""More ways a task says an order (agent/language/order_reading.py) and the goal that opens with it
(task_leads._order_lead): "once you've ...", "after you've ...", "before you ..." (said second),
an aside the words go on after, verbs in any form, a thing said again by another word, a pick-up
and a turn by an angle in the order, "go and dock" as one going whose end state may be left out."""
from __future__ import annotations

import pytest

from agent.language.amounts import angles
from evals.evaluation import load_eval_set
from agent.files.loader import alias_words
from agent.language.reading import read_task
from agent.symbolic.solver import complete
from agent.language.wording import tokens, verb_forms

from tests.helpers.reading import SET9, fits_goal, read_events


@pytest.fixture(scope="module")
def worlds():
    return load_eval_set(SET9)[1]


def test_words_of_numbers_and_forms():
    assert angles(tokens("turn round 180° please")) == [(2, 180.0)]
    assert angles(tokens("tip it about thirty degrees")) == [(3, 30.0)]
    assert angles(tokens("give it a quarter turn")) == [(2, 90.0)]
    assert {"drop"} <= verb_forms("dropped") and {"shut"} <= verb_forms("shutting") and {"place"} <= verb_forms("placed")
    assert alias_words("the top-up can") == ["topup", "can"] == tokens("top-up can")


def test_an_earlier_step_said_first_and_a_later_one_said_first(worlds):
    w = worlds["pottery_studio"][0]
    # "once ..." and "after you've ..." open an earlier step (no longer an aside)
    assert read_events("Once you've shut the damp cupboard, put the test tile on the kiln shelf.", w) == [
        "damp_cupboard_door closed", "test_tile at kiln_shelf"]
    assert read_events("After you've dropped the wire off at the glaze shelf, put the rib in the sink.", w) == [
        "cutting_wire at glaze_shelf", "wooden_rib at splash_sink"]
    # "before you ...": that step comes second
    assert read_events("Before you move the bisque bowl to the kiln shelf, have a look at it.", w) == [
        "look at bisque_bowl", "bisque_bowl at kiln_shelf"]


def test_an_aside_the_words_go_on_after(worlds):
    w = worlds["pottery_studio"][0]
    assert read_events("Open the kiln lid, leave it ten seconds so the heat can escape, and then close it again.", w) == [
        "kiln_lid open", "wait 10", "kiln_lid closed"]
    # an aside at the end still ends the request
    assert read_task("Open the kiln lid so the heat can escape.", w).toks == ("open", "the", "kiln", "lid")


def test_a_look_again_a_pick_up_and_a_turn_in_the_order(worlds):
    w, s = worlds["pottery_studio"]
    assert read_events("Have a look at the bisque bowl, wait 5 seconds, then look again.", w) == [
        "look at bisque_bowl", "wait 5", "look at bisque_bowl"]
    task = "Pick up the glaze jug, tip it about forty degrees over the bisque bowl, then stand the jug on the ware board."
    assert read_events(task, w) == ["hold glaze_jug", "turn 40 over bisque_bowl", "glaze_jug at ware_board"]
    goal = [{"before": [{"holding": "glaze_jug"}, {"do": "pour", "args": {"target": "bisque_bowl", "angle": 40}},
                        {"object": "glaze_jug", "at": "ware_board"}]}, {"object": "glaze_jug", "at": "ware_board"}]
    assert fits_goal(task, goal, w, s)
    plan = complete({"plan_id": "p1", "task": task, "goal": goal, "steps": []}, w, s)
    assert [st["skill"] for st in plan["steps"]].count("pour") == 1


def test_go_and_dock_is_one_going_its_end_state_may_be_left_out(worlds):
    w, s = worlds["sorting_office"]
    task = "Take the franking ink to the enquiry hatch, and after that go and dock at the charger."
    assert read_events(task, w) == ["franking_ink at enquiry_hatch", "go to mule_charger"]
    ordered = {"before": [{"object": "franking_ink", "at": "enquiry_hatch"}, {"do": "dock", "args": {"station": "mule_charger"}}]}
    ink = {"object": "franking_ink", "at": "enquiry_hatch"}
    assert fits_goal(task, [ordered, ink], w, s) and fits_goal(task, [ordered, ink, {"robot_at": "mule_charger"}], w, s)
    assert not fits_goal(task, [ordered], w, s)                    # the ink's end state is not the call's
    w, s = worlds["linen_store"]
    task = "Drive over to the goods lift and, once you're there, turn round 90 degrees."
    assert read_events(task, w) == ["go to goods_lift", "turn 90"]
    assert fits_goal(task, [{"before": [{"robot_at": "goods_lift"}, {"do": "rotate", "args": {"angle": 90}}]},
                            {"robot_at": "goods_lift"}], w, s)


def test_more_ways_to_say_the_next_thing(worlds):
    w = worlds["sorting_office"][0]
    # "when you're done" is the next step; a wait at a place is there first; a thing and a place
    # with no verb is the thing there; a verb of going said of a thing puts it there
    assert read_events("Take the ink to the enquiry hatch and, when you're done, dock at the charger.", w) == [
        "franking_ink at enquiry_hatch", "go to mule_charger"]
    assert read_events("Wait 20 seconds at the yard door, then bring the scales to the sorting frame.", w) == [
        "go to yard_door", "wait 20", "parcel_scales at sorting_frame"]
    assert read_events("First take the mail sack to the enquiry hatch, then the recorded tray to the yard door.", w) == [
        "mail_sack at enquiry_hatch", "recorded_tray at yard_door"]
    p = worlds["pottery_studio"][0]
    assert read_events("Check the bisque bowl for cracks first, then it can go on the kiln shelf.", p) == [
        "look at bisque_bowl", "bisque_bowl at kiln_shelf"]
    assert read_events("Inspect the test tile, leave it 10 seconds, then have another look.", p) == [
        "look at test_tile", "wait 10", "look at test_tile"]


def test_a_look_with_its_option_or_its_count_and_a_set_looked_at(worlds):
    w, s = worlds["linen_store"]
    both = {"do": "scan", "args": {"area": "folding_bench", "mode": "both"}}
    task = "Scan the folding bench - lidar and camera both."
    assert fits_goal(task, [both], w, s) and not fits_goal(task, [{"place": "folding_bench", "is": "inspected"}], w, s)
    assert not fits_goal(task, [{**both, "args": {**both["args"], "mode": "lidar"}}], w, s)
    task = "Give the folding bench three camera scans in a row."
    assert read_task(task, w).times == 3
    assert fits_goal(task, [{"do": "scan", "args": {"area": "folding_bench", "mode": "camera"}, "times": 3}], w, s)
    p, ps = worlds["pottery_studio"]
    task = "Could you inspect each of the tools on the wheel with the camera?"
    assert read_task(task, p).every is not None
    assert fits_goal("Have a look at each of the tools, please.", [{"every": {"type": "tool"}, "is": "inspected"}], p, ps)


def test_a_pour_a_wait_there_and_words_inside_a_place(worlds):
    p, ps = worlds["pottery_studio"]
    # a pour is a hold, then the pour, with no word of order; "over" or "into" says what it goes into
    task = "Pour the glaze jug into the bisque bowl at a twenty degree tilt."
    assert read_events(task, p) == ["hold glaze_jug", "turn 20 over bisque_bowl"]
    goal = [{"before": [{"holding": "glaze_jug"}, {"do": "pour", "args": {"target": "bisque_bowl", "angle": 20}}]}]
    assert fits_goal(task, goal, p, ps) and fits_goal(task, goal + [{"holding": "glaze_jug"}], p, ps)
    # "give it a once-over", then ...
    assert read_events("Give the test tile a once-over and after that put it on the kiln shelf.", p) == [
        "look at test_tile", "test_tile at kiln_shelf"]
    w, s = worlds["sorting_office"]
    # a wait "there" after a going needs no word of order; "hang about" is a wait, not a thing
    assert read_events("Go to the yard door and wait there for twenty seconds.", w) == ["go to yard_door", "wait 20"]
    r = read_task("Head to the yard door, hang about there for half a minute, then go to the van bay.", w)
    assert not r.lacking and [e.text() for e in r.events] == ["go to yard_door", "wait 30", "go to van_door"]
    # "whatever you can actually carry"
    assert read_task("Whatever you can actually carry from the inward bay goes to the sorting frame.", w).every.every() == {
        "at": "inward_bay", "carriable": True}
