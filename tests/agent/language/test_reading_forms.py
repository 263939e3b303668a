"""Forms of a task the reading follows (agent/language/reading.py, order_reading.py, set_reading.py,
task_leads.py), each on a small world of its own: an aside that goes on, a thing carried nowhere,
"stay there", a going by the skill it names, a state kept for a time, a pour said from its
source or over two sentences, of what is held, or from a named source with what it pours said
too, a set said by a type several things have (by their number, or by the last word of their
aliases), a word that is part of another name, a turn or a wait alone, phrasal goings and
waits, asides of the speaker's or of a reason.""" 
from __future__ import annotations

import pytest

from agent.language.amounts import angles
from agent.files.loader import AGENT_DIR, load_skills, world_from_dict
from agent.language.reading import read_task
from agent.symbolic.solver import complete
from agent.language.wording import tokens

from tests.helpers.reading import fits_goal, read_events, read_set


def _world(objects, places, skills):
    return world_from_dict({
        "name": "t", "skills": str(AGENT_DIR / "skills" / f"{skills}.json"),
        "objects": [{"position": [0.1, 0.0, 0.9], "mass_kg": 0.5, **o} for o in objects],
        "places": [{"name": p, "position": [0.2, 0.1, 0.9], **({"aliases": a} if a else {})} for p, a in places],
        "robot": {"workspace": {"min": [-1, -1, 0], "max": [1, 1, 2]}, "max_payload_kg": 3.0}})


@pytest.fixture(scope="module")
def bench():
    w = _world([{"name": "oil_can", "type": "can", "at": "tool_shelf"},
                {"name": "funnel_cup", "type": "cup", "at": "tool_shelf"},
                {"name": "fuse_drawer", "type": "drawer", "state": "closed"},
                {"name": "fuse_box", "type": "box", "at": "tool_shelf", "aliases": ["fuse"]},
                {"name": "red_spanner", "type": "spanner", "at": "tool_shelf"},
                {"name": "blue_spanner", "type": "spanner", "at": "parts_tray"},
                {"name": "gauge_case", "type": "case", "at": "parts_tray"}],
               [("tool_shelf", None), ("parts_tray", None), ("gauge_rack", None), ("wash_basin", ["basin"])],
               "tabletop")
    return w, load_skills(AGENT_DIR / "skills" / "tabletop.json")


@pytest.fixture(scope="module")
def yard():
    w = _world([{"name": "cone_stack", "type": "cone", "at": "gate_hut"},
                {"name": "spill_kit", "type": "kit", "at": "gate_hut"}],
               [("gate_hut", None), ("weigh_bridge", None), ("loading_bay", None), ("yard_charger", ["charging point"])],
               "mobile")
    return w, load_skills(AGENT_DIR / "skills" / "mobile.json")


def test_an_aside_that_goes_on_and_a_speakers_own_step(bench):
    w, _ = bench
    r = read_task("Open the fuse drawer, and while you're at it put the oil can on the gauge rack.", w)
    assert r.referred == ("fuse_drawer", "oil_can") and r.destinations("oil_can") == ("gauge_rack",)
    # "; I'll grab ... myself" is the speaker's step, not a thing the robot carries
    r = read_task("Open the fuse drawer; I'll grab the torque wrench myself.", w)
    assert not r.lacking and not r.only_missing and r.referred == ("fuse_drawer",)


def test_a_thing_carried_nowhere_is_held(bench, yard):
    w, s = bench
    r = read_task("Grab the oil can from the tool shelf.", w)
    assert r.verbs_for("oil_can") == {("holding", None)}
    assert fits_goal("Grab the oil can from the tool shelf.", [{"holding": "oil_can"}], w, s)
    assert not fits_goal("Grab the oil can from the tool shelf.", [{"object": "oil_can", "at": "tool_shelf"}], w, s)
    # a verb that moves a thing somewhere, said with nowhere, does not make it held
    assert read_task("Move the oil can.", w).verbs_for("oil_can") != {("holding", None)}
    # a thing that opens and shuts may be "popped" open; a place said is where it goes
    assert read_task("Pop the fuse drawer for me.", w).verbs_for("fuse_drawer") != {("holding", None)}
    assert read_task("Grab the oil can and put it on the gauge rack.", w).verbs_for("oil_can") == {("at", None)}
    # "onto your deck", "hang onto it": the robot keeps it
    w, _ = yard
    assert read_task("Load the spill kit onto your deck and keep it there.", w).verbs_for("spill_kit") == {
        ("holding", None)}


def test_stay_there_and_a_going_by_the_skill_it_names(yard):
    w, s = yard
    r = read_task("Take the spill kit to the weigh bridge and stay there with it.", w)
    assert r.go_to == ("weigh_bridge",)
    task = "Battery's nearly flat, go and dock at the charging point."
    assert fits_goal(task, [{"do": "dock", "args": {"station": "yard_charger"}}], w, s)
    assert not fits_goal(task, [{"robot_at": "yard_charger"}], w, s)
    assert fits_goal("Head over to the loading bay.", [{"robot_at": "loading_bay"}], w, s)
    # there for a time, then on
    assert read_events("Park at the gate hut for thirty seconds, then come back to the charging point.", w) == [
        "go to gate_hut", "wait 30", "go to yard_charger"]


def test_a_state_kept_for_a_time_is_a_wait(bench):
    w, s = bench
    task = "Open the fuse drawer, hold it open five seconds, then shut it."
    assert read_events(task, w) == ["fuse_drawer open", "wait 5", "fuse_drawer closed"]
    goal = [{"before": [{"object": "fuse_drawer", "is": "open"}, {"do": "wait", "args": {"duration": 5}},
                        {"object": "fuse_drawer", "is": "closed"}]}, {"object": "fuse_drawer", "is": "closed"}]
    assert fits_goal(task, goal, w, s)
    assert complete({"plan_id": "p", "task": task, "goal": goal, "steps": []}, w, s) is not None


def test_a_pour_from_its_source_and_over_two_sentences(bench):
    w, s = bench
    pour = ["hold oil_can", "turn 30 over funnel_cup"]
    assert read_events("The cup is empty. Pour from the oil can into the funnel cup at thirty degrees.", w) == pour
    assert read_events("Pour the oil can into the funnel cup. Tip it to about 30 degrees.", w) == pour
    assert read_events("Fill the funnel cup from the oil can, tilting it - thirty degrees will do.", w) == pour
    goal = [{"before": [{"holding": "oil_can"}, {"do": "pour", "args": {"target": "funnel_cup", "angle": 30}}]}]
    assert fits_goal("Fill the funnel cup from the oil can, tilting it - thirty degrees will do.", goal, w, s)


def test_a_set_said_by_a_type_several_things_have(bench):
    w, s = bench
    # "both spanners": the type, though one spanner's name ends in it
    assert read_set("Put both spanners in the wash basin.", w) == ({"type": "spanner"}, ("wash_basin",))
    assert read_task("Put both spanners in the wash basin.", w).referred == ()
    # "the two spanners": as many as there are here
    assert read_set("Put the two spanners in the wash basin.", w) == ({"type": "spanner"}, ("wash_basin",))
    assert read_set("Put the three spanners in the wash basin.", w) is None
    # named whole, they are those things
    assert read_set("Put both the red spanner and the blue spanner in the wash basin.", w) is None
    # the type, then where they rest; "everything on it" after the place
    assert read_set("The spanners on the tool shelf are dirty. Move all of them to the wash basin.", w) == (
        {"at": "tool_shelf", "type": "spanner"}, ("wash_basin",))
    assert read_set("I need the parts tray clear. Everything on it goes onto the gauge rack.", w) == (
        {"at": "parts_tray"}, ("gauge_rack",))
    assert read_set("Whatever you're able to lift off the parts tray, move it onto the gauge rack.", w) == (
        {"at": "parts_tray", "carriable": True}, ("gauge_rack",))


def test_a_word_inside_another_name_names_nothing_else(bench):
    w, _ = bench
    # "fuse" is the fuse box's alias, but "the fuse drawer" is the drawer
    assert read_task("Open the fuse drawer.", w).referred == ("fuse_drawer",)
    # "a look round the ..." is no round thing; a place's whole name lends no word to an object
    r = read_task("Where's the blow torch got to? Bring it over to the wash basin.", w)
    assert r.only_missing and "torch" in r.unknown


@pytest.fixture(scope="module")
def tea():
    w = _world([{"name": "iron_kettle", "type": "kettle", "at": "brew_board"},
                {"name": "clay_teapot", "type": "teapot", "at": "brew_board", "aliases": ["clay pot"]},
                {"name": "serving_jug", "type": "jug", "at": "brew_board"},
                {"name": "tea_spoon", "type": "spoon", "at": "brew_board"},
                {"name": "green_caddy", "type": "caddy", "at": "back_shelf", "aliases": ["green tin"]},
                {"name": "black_caddy", "type": "caddy", "at": "back_shelf", "aliases": ["black tin"]}],
               [("brew_board", None), ("back_shelf", None), ("guest_counter", None), ("rinse_bowl", None)], "tabletop")
    return w, load_skills(AGENT_DIR / "skills" / "tabletop.json")


def test_a_pour_of_what_is_held_and_from_a_named_source(tea):
    w, s = tea
    assert read_events("Pick up the iron kettle and pour a splash into the clay teapot, tilting it about 45 degrees.", w) == [
        "hold iron_kettle", "turn 45 over clay_teapot"]
    # "the tea" is what is poured, not the tea spoon; "the pot" is the clay teapot by its alias
    task = "Pour the tea from the clay pot into the serving jug, and after that the pot goes in the rinse bowl."
    assert read_events(task, w) == ["hold clay_teapot", "turn over serving_jug", "clay_teapot at rinse_bowl"]
    assert "tea_spoon" not in read_task(task, w).referred
    assert angles(tokens("a hundred and eighty degrees")) == [(0, 180.0)]


def test_a_set_by_the_last_word_of_its_aliases(tea):
    w, _ = tea
    assert read_set("Both tea tins need to come out to the guest counter.", w) == ({"type": "caddy"}, ("guest_counter",))


def test_a_turn_or_a_wait_alone_is_its_call(yard):
    w, s = yard
    assert fits_goal("Turn 45 degrees. Then again, and once more: 3 turns in total.",
                     [{"do": "rotate", "args": {"angle": 45}, "times": 3}], w, s)
    assert not fits_goal("Turn 45 degrees. Then again, and once more: 3 turns in total.",
                         [{"do": "rotate", "args": {"angle": 45}}], w, s)
    task = "Just hold still for 20 seconds, the gate hut's being locked."
    assert fits_goal(task, [{"do": "wait", "args": {"duration": 20}}], w, s)
    assert not fits_goal(task, [{"robot_at": "gate_hut"}], w, s)


def test_goings_waits_and_asides_said_in_phrases(yard, bench):
    w, _ = yard
    assert read_events("Stop by the gate hut first, then carry on to the weigh bridge.", w) == [
        "go to gate_hut", "go to weigh_bridge"]
    assert read_events("Take the spill kit out to the weigh bridge. When it's down, wait thirty seconds.", w) == [
        "spill_kit at weigh_bridge", "wait 30"]
    w, _ = bench
    r = read_task("Pass me the blow torch, I need to strip this paint.", w)
    assert r.lacking and r.only_missing
    assert read_task("Put the oil can on the gauge rack; I'm starting on the spanners after lunch.", w).referred == (
        "oil_can",)


def test_round_eight_forms(yard, bench, tea):
    w, s = yard
    # "go and charge" at the place named for charging: the docking call, or the robot there
    task = "Drop the spill kit off at the weigh bridge, then go and charge."
    for last in ({"do": "dock", "args": {"station": "yard_charger"}}, {"robot_at": "yard_charger"}):
        assert fits_goal(task, [{"before": [{"object": "spill_kit", "at": "weigh_bridge"}, last]},
                                {"object": "spill_kit", "at": "weigh_bridge"}], w, s)
    assert read_events("Pop over to the gate hut and wait there for 45 seconds while I check the boiler.", w) == [
        "go to gate_hut", "wait 45"]
    # a look with no thing said is about the last thing
    w, _ = bench
    assert read_events("Open the fuse drawer, have a look inside with the camera, and shut it again.", w) == [
        "fuse_drawer open", "look at fuse_drawer", "fuse_drawer closed"]
    # the angle said of the held jug is the pour's
    w, _ = tea
    assert read_events("Fill up the clay teapot from the iron kettle; tip the kettle to about 45 degrees.", w) == [
        "hold iron_kettle", "turn 45 over clay_teapot"]
    # "both brick moulds": a whole name in the plural after a word of a set is the set
    moulds = _world([{"name": "brick_mould", "type": "mould", "at": "drying_shed"},
                     {"name": "tile_mould", "type": "mould", "at": "drying_shed"}],
                    [("drying_shed", None), ("clay_pit", None)], "mobile")
    assert read_set("Both brick moulds are caked. Take them down to the clay pit.", moulds) == (
        {"type": "mould"}, ("clay_pit",))
    assert read_set("Take the brick mould down to the clay pit.", moulds) is None
    assert read_task("Fetch the first aid kit, quick.", w).unknown[:1] == ("first_aid_kit",)
