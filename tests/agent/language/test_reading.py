"""The task's reading on the words people use for things: aliases from the world file, a word of
a name that is not its head said as a whole noun, a place's word said as a verb, everyday verbs
of opening and closing, and a thing to carry that the world does not have."""
from __future__ import annotations

import pytest

from agent.files.loader import world_from_dict
from agent.language.task_match import grounding_findings
from agent.planner.prompt import describe_world
from agent.language.reading import read_task
from agent.schema.specialize import goal_schema
from thor_runtime.errors import ThorError

from tests.helpers.worlds import LIB, arm_and_mobile_skills, checks, small_world, with_goal

CLINIC = small_world([{"name": "guitar_case", "type": "case", "at": "reception"},
                      {"name": "fluid_pump", "type": "pump", "at": "stock_room"},
                      {"name": "rose_bouquet", "type": "bouquet", "at": "reception"},
                      {"name": "twine_drawer", "type": "drawer", "state": "open"},
                      {"name": "xray_cassette", "type": "cassette", "at": "stock_room"}],
                     ["reception", "stock_room", "customs_desk", "kennel_ward", "consult_room_1", "consult_room_2",
                      "quarantine_crate", "charge_dock", "xray_room"])


def test_a_word_of_a_name_said_as_a_whole_noun():
    r = read_task("Leave the guitar with customs, then go back to the dock.", CLINIC)
    assert r.referred == ("guitar_case",) and r.destinations("guitar_case") == ("customs_desk",)
    assert r.go_to == ("charge_dock",)
    r = read_task("The kennels want the pump.", CLINIC)
    assert r.referred == ("fluid_pump",) and r.places == ("kennel_ward",)
    # two consult rooms: the number decides; a number that is no room's decides nothing
    assert read_task("take the pump to consult 2", CLINIC).places == ("consult_room_2",)
    assert read_task("take the pump to consult 3", CLINIC).places == ()
    # followed by another word of a name, it is a modifier again; "X-ray" is written as a name writes it
    r = read_task("Put the guitar case in the X-ray room", CLINIC)
    assert r.referred == ("guitar_case",) and r.places == ("xray_room",)
    # a participle after another thing's name is no noun ("is the spine of the atlas damaged?")
    assert read_task("Is the spine of the picture book damaged? Take a look at it.", LIB).places == ()


def test_aliases_are_read_like_names_and_shown_to_the_model():
    w = world_from_dict({
        "name": "t", "objects": [{"name": "instrument_case", "type": "case", "position": [0.1, 0, 0.5],
                                  "mass_kg": 4, "at": "belt", "aliases": ["the cello"]}],
        "places": [{"name": "belt", "position": [0, 0, 0.5]},
                   {"name": "office_2", "position": [1, 0, 0.5], "aliases": ["Sam's office"]}],
        "robot": {"workspace": {"min": [-2, -2, 0], "max": [2, 2, 2]}, "max_payload_kg": 10}})
    r = read_task("Could the cello go to Sam's office?", w)
    assert r.referred == ("instrument_case",) and r.places == ("office_2",) and r.unknown == ()
    assert 'also called "the cello"' in describe_world(w) and 'also called "Sam\'s office"' in describe_world(w)


def test_an_alias_that_names_another_thing_is_refused():
    data = {"name": "t", "objects": [{"name": "cup", "type": "cup", "position": [0, 0, 0.5], "mass_kg": 0.2,
                                      "aliases": ["the mug"]},
                                     {"name": "mug", "type": "mug", "position": [0.1, 0, 0.5], "mass_kg": 0.2}],
            "places": [], "robot": {"workspace": {"min": [-1, -1, 0], "max": [1, 1, 1]}, "max_payload_kg": 1}}
    with pytest.raises(ThorError, match="alias 'the mug' of 'cup' also names 'mug'"):
        world_from_dict(data)
    data["objects"][0]["aliases"] = [""]
    with pytest.raises(ThorError, match="aliases"):
        world_from_dict(data)


def test_a_place_word_said_as_a_verb():
    r = read_task("There are moth larvae in that guitar case. Quarantine it straight away.", CLINIC)
    assert r.carry and r.destinations("guitar_case") == ("quarantine_crate",)
    r = read_task("Drop the cassette off in the X-ray room, then go and dock.", CLINIC)
    assert r.go_to == ("charge_dock",) and r.destinations("xray_cassette") == ("xray_room",)


def test_verbs_of_opening_and_closing():
    assert read_task("Somebody left the twine drawer hanging out; push it in, please.", CLINIC).wanted == {
        ("is", "closed")}
    assert read_task("Raise the lid for me", CLINIC).wanted == {("is", "open")}
    assert read_task("push the pump over to reception", CLINIC).wanted == set()


def test_a_thing_to_carry_that_is_not_here():
    r = read_task("Put a sunflower in with the roses, would you?", CLINIC)
    assert r.lacking == ("sunflower",) and r.only_missing and r.referred == ("rose_bouquet",)
    # the goal can only say it is missing, and the gate says what is missing whatever the goal says
    schema = goal_schema(CLINIC, arm_and_mobile_skills()[1], "Put a sunflower in with the roses, would you?")
    assert "prefixItems" not in schema and schema["items"]["anyOf"] == [
        {"type": "object", "properties": {"missing": {"enum": ["sunflower"]}}, "required": ["missing"],
         "additionalProperties": False}]
    f = grounding_findings("Put a sunflower in with the roses", with_goal({"object": "rose_bouquet", "at": "reception"}),
                           CLINIC)
    assert checks(f) == ["object"] and '"missing": "sunflower"' in f[0].message
    for task in ("take a photo of the roses", "put everything back in the stock room", "put it in the X-ray room",
                 "bring me a fresh guitar case", "take a look at the pump"):
        assert read_task(task, CLINIC).lacking == (), task
    assert read_task("Bring me a bottle of champagne", CLINIC).lacking == ("bottle", "champagne")


def test_a_set_or_a_short_word_this_world_lacks():
    """ "all the aprons" in a world without one is a thing it lacks, not a set of its things
    (even with a place: a set that picks nothing); "the pH meter" keeps its two-letter word."""
    r = read_task("Hang all the aprons on the kennel ward hooks", CLINIC)
    assert r.sets and r.places and r.lacking == ("aprons",) and r.only_missing
    r = read_task("Put the pH meter in the stock room", CLINIC)
    assert r.lacking == ("ph", "meter") and r.only_missing and "meter" in r.unknown
    schema = goal_schema(CLINIC, arm_and_mobile_skills()[1], "Put the pH meter in the stock room")
    assert [b["properties"] for b in schema["items"]["anyOf"]] == [{"missing": {"enum": list(r.unknown)}}]
    # a set of this world's things is still one
    for task in ("Put all the cassettes in the stock room", "put everything on the reception desk in the stock room"):
        r = read_task(task, CLINIC)
        assert r.sets and r.lacking == () and not r.only_missing, task


def test_asides_at_the_start_and_the_speakers_own_step():
    # an aside that opens the task ends at its comma; the request follows
    r = read_task("Before the next patient, can you check the X-ray room?", CLINIC)
    assert r.about_places == ("xray_room",) and r.wanted == {("is", "inspected")}
    # ", I want to check ..." is what the speaker will do, not what the robot is asked
    r = read_task("Lift the lid on the twine drawer, I want to check the twine.", CLINIC)
    assert r.wanted == {("is", "open")}
    # but "I need the pump ..." is the request itself
    assert read_task("I need the pump in the X-ray room", CLINIC).destinations("fluid_pump") == ("xray_room",)


def test_an_alias_after_to_is_somewhere_to_go():
    w = world_from_dict({
        "name": "t", "objects": [{"name": "flight_case", "type": "case", "position": [0, 0, 0.5], "mass_kg": 4}],
        "places": [{"name": "stage_right_wings", "position": [1, 0, 0.5], "aliases": ["OP side"]},
                   {"name": "dock", "position": [0, 1, 0.5]}],
        "robot": {"workspace": {"min": [-2, -2, 0], "max": [2, 2, 2]}, "max_payload_kg": 10}})
    r = read_task("Make your way to the OP side wings and stand by.", w)
    assert r.toward and not r.only_missing and r.about_places == ("stage_right_wings",)
    assert read_task("Bring the flight case from the OP side to the dock", w).sources == {"stage_right_wings"}


def test_a_state_the_task_describes_is_not_asked_for():
    r = read_task("The twine drawer's been left open; close it before something rolls in.", CLINIC)
    assert r.wanted == {("is", "closed")}
    assert read_task("Someone's left the twine drawer open again. Shut it, please.", CLINIC).wanted == {
        ("is", "closed")}
    # the clause ends at the semicolon: "left out; shut it" asks to shut it
    assert read_task("The twine drawer has been left out; shut it", CLINIC).wanted == {("is", "closed")}
    assert read_task("Open the twine drawer", CLINIC).wanted == {("is", "open")}


def test_going_to_a_place_is_asked_as_going_there():
    r = read_task("Make your way to the kennel ward and stand by.", CLINIC)
    assert r.about_places == ("kennel_ward",) and r.place_kinds == {"robot_at"}
    assert read_task("Have a look round the kennel ward", CLINIC).place_kinds == {"place_is"}
    assert read_task("The kennel ward, please", CLINIC).place_kinds == {"place_is", "robot_at"}
    # the gate holds a goal decoded under another schema to it
    looked = with_goal({"place": "kennel_ward", "is": "inspected"})
    kinds = {c.kind for s in arm_and_mobile_skills()[1].skills for c in s.effects}
    assert "robot_at" in kinds
    f = grounding_findings("Make your way to the kennel ward and stand by.", looked, CLINIC, arm_and_mobile_skills()[1])
    assert checks(f) == ["goal"] and "kennel_ward to be gone to" in f[0].message
    assert grounding_findings("Make your way to the kennel ward and stand by.", with_goal({"robot_at": "kennel_ward"}),
                              CLINIC, arm_and_mobile_skills()[1]) == []


BAR = small_world([{"name": "shaker_tin", "type": "tin", "at": "back_bar"},
                   {"name": "mixing_glass", "type": "glass", "at": "back_bar"},
                   {"name": "ultrasonic_lid", "type": "lid", "state": "closed"},
                   {"name": "jerry_can", "type": "can", "at": "back_bar"}],
                  ["back_bar", "bus_tub", "ultrasonic_basket", "cable_tray", "row_c", "robot_bay"])


def test_words_that_open_a_task_or_follow_open_and_shut():
    # a task may open with the thing itself; not with a verb ("Set it aside") or "Can you"
    r = read_task("Shaker and mixing glass are done, stick them in the bus tub.", BAR)
    assert r.referred == ("shaker_tin", "mixing_glass") and r.carry
    assert read_task("Can you bring the mixing glass to the bus tub?", BAR).referred == ("mixing_glass",)
    # "ultrasonic" is an object's and a place's word; what "open" takes is the object
    r = read_task("Open the ultrasonic and lower the mixing glass into its basket.", BAR)
    assert r.referred == ("ultrasonic_lid", "mixing_glass") and r.destinations("mixing_glass") == (
        "ultrasonic_basket",)
    assert "ultrasonic_lid" not in read_task("Scan the ultrasonic basket", BAR).referred


def test_a_place_that_locates_another_is_not_where_things_go():
    r = read_task("Put the shaker tin up on the cable tray over row C.", BAR)
    assert r.destinations("shaker_tin") == ("cable_tray",)
    r = read_task("Drop the shaker tin in the bus tub, then get back to your bay.", BAR)
    assert r.destinations("shaker_tin") == ("bus_tub",) and r.go_to == ("robot_bay",)
    assert read_task("Load the shaker tin and keep it on your deck", BAR).wanted == {("holding", None)}


def test_context_before_the_request_and_a_robot_wanted_somewhere():
    # "Pump one's a cylinder short": a name of its own, not the pump as the thing to move
    w = small_world([{"name": "portable_pump", "type": "pump", "at": "yard"},
                     {"name": "ba_cylinder", "type": "cylinder", "at": "yard"}], ["yard", "appliance_bay", "taproom"])
    r = read_task("Pump one's a cylinder short. Spare BA cylinder to the appliance bay, please.", w)
    assert r.referred == ("ba_cylinder",)
    r = read_task("The brewery tour starts in the taproom and they'd like you there.", w)
    assert r.about_places == ("taproom",) and r.place_kinds == {"robot_at"} and not r.only_missing


def test_a_verb_of_going_names_the_place_called_its_doer():
    """"go and charge" with a place called the charger (by name or alias) sends the robot there."""
    w = world_from_dict({
        "name": "t", "objects": [{"name": "hose", "type": "hose", "position": [0.1, 0, 0.5], "mass_kg": 4, "at": "yard"}],
        "places": [{"name": "yard", "position": [0, 0, 0.5]}, {"name": "wash", "position": [1, 0, 0.5]},
                   {"name": "robot_plug_in", "position": [2, 0, 0.5], "aliases": ["charger"]}],
        "robot": {"workspace": {"min": [-3, -3, 0], "max": [3, 3, 3]}, "max_payload_kg": 10}})
    r = read_task("Drop the hose at the wash, then go and charge.", w)
    assert r.go_to == ("robot_plug_in",) and r.destinations("hose") == ("wash",)
    # said as no verb of going, it names nothing
    assert read_task("Drop the hose at the wash; the charge is low.", w).go_to is None


def test_keep_it_on_you_asks_for_it_held():
    r = read_task("Load the guitar case and keep it on you while we go round.", CLINIC)
    assert ("holding", None) in r.wanted
    assert ("holding", None) not in read_task("Put the guitar case on the desk.", CLINIC).wanted
