"""A task that orders things gets a goal that opens with that `before` (reading.ordered_events,
task_leads._order_lead), and the gate holds a goal to it (grounding.py); a task whose order word
joins no second thing keeps its plain goal.
And a call the task fixes with its numbers (a push with its length and direction, a look repeated
N times) opens the goal the same way."""
from __future__ import annotations

from evals.evaluation import SETS_DIR

import json
from types import SimpleNamespace

import pytest

from evals.evaluation import load_eval_set, score
from agent.files.loader import AGENT_DIR, base_plan_schema
from agent.symbolic.gate import check_plan
from agent.language.task_match import grounding_findings
from agent.language.reading import read_task
from agent.symbolic.solver import complete, goal_reasons
from agent.schema.specialize import specialize
from agent.language.amounts import durations
from agent.language.wording import tokens

from tests.helpers.reading import read_events, task_goal_schema

SETS = SETS_DIR


@pytest.fixture(scope="module")
def worlds():
    out = {}     # world name -> (world, skills)
    for d in ("1-greenhouse-workshop-pharmacy-depot", "2-bakery-library-repair-ward", "3-recycling-science-hotel-garage",
              "5-watchmaker-bar-backstage-datahall", "7-printstudio-aquarium-museum-skihire"):
        out.update(load_eval_set(SETS / d)[1])
    return out


def test_durations_in_words_and_digits():
    said = lambda t: [s for _, s in durations(tokens(t))]       # noqa: E731
    assert said("wait 20 seconds") == [20] and said("hold on for 45 seconds") == [45]
    assert said("with a ten second pause in between") == [10] and said("a ten-second pause") == [10]
    assert said("twice, a minute apart") == [60] and said("half a minute") == [30]
    assert said("forty five seconds") == [45] and said("forty-five seconds") == [45] and said("30s") == [30]
    assert said("push it 5 cm left") == [] and said("the second shelf") == []


def test_ordered_tasks_are_read_as_their_events(worlds):
    studio, aquarium, museum, ski = (worlds[n][0] for n in ("print_studio", "aquarium_backroom", "museum_storeroom",
                                                            "ski_hire"))
    assert read_events("Check the test print, then lay it on the drying rack.", studio) == [
        "look at test_print", "test_print at drying_rack"]
    assert read_events("Open the exposure unit, wait 20 seconds, and close it again.", studio) == [
        "exposure_unit_lid open", "wait 20", "exposure_unit_lid closed"]
    assert read_events("Look over the screen twice, with a ten second pause in between.", studio) == [
        "look at screen_frame", "wait 10", "look at screen_frame"]
    assert read_events("Top up time: lift the quarantine lid, give it five seconds, then shut it again.", aquarium) == [
        "quarantine_lid open", "wait 5", "quarantine_lid closed"]
    assert read_events("Scan the vault, wait 30 seconds, and scan it again.", museum) == [
        "look at vault", "wait 30", "look at vault"]
    assert read_events("Go to the vault, wait there ten seconds, then head back to the charging nook.", museum) == [
        "go to vault", "wait 10", "go to charging_nook"]
    # "before you ...": the robot's own next step, not an aside
    assert read_events("Sweep the quarantine room with the lidar before you move the textile box to the vault.",
                       museum) == ["look at quarantine_room", "textile_box at vault"]
    assert read_events("Give the garage bay a camera scan, then take the helmet crate there.", ski) == [
        "look at garage_bay", "helmet_crate at garage_bay"]
    assert read_events("Scan the boot room twice, a minute apart.", ski) == ["look at boot_room", "wait 60",
                                                                             "look at boot_room"]


def test_an_order_word_that_orders_nothing_is_no_order(worlds):
    ward, depot, green, bar = (worlds[n][0] for n in ("hospital_ward", "parcel_depot", "greenhouse", "cocktail_bar"))
    # joins no second thing of the task's
    assert read_events("Sweep bay 3 with the lidar before the next patient arrives.", ward) == []
    assert read_events("Someone's left the glasswasher open again. Shut it, please.", bar) == []
    # a thing the order leaves out (no verb the reading knows, a thing and no place) leaves it unread
    assert read_events("Check the test print, wait 10 seconds, then the squeegee please.", worlds["print_studio"][0]) == []
    # a verb of going said of a thing puts it there
    assert read_events("Check the test print, wait 10 seconds, then the squeegee goes up on the rail.",
                       worlds["print_studio"][0]) == ["look at test_print", "wait 10", "squeegee at squeegee_rail"]
    # no word of order: a list is not read as one
    assert read_events("Scan the vault and wait 30 seconds.", worlds["museum_storeroom"][0]) == []
    goal, _ = task_goal_schema("Sweep bay 3 with the lidar before the next patient arrives.", *worlds["hospital_ward"])
    # no order opens the goal (one is still allowed, as for any task: through goal_process)
    assert all("before" not in b.get("properties", {}) for p in goal.get("prefixItems", []) for b in p["anyOf"])


def test_an_order_of_end_states_is_an_order(worlds):
    """"Lift the lid, and then load the tile" asks for the lid open first, which the two end
    states alone do not say; "after that" orders (it is no aside); a place said after "to" is
    where the robot goes, whatever the verb ("run over to"); a name's word is no verb ("the
    goods lift" lifts nothing)."""
    depot, green = (worlds[n][0] for n in ("parcel_depot", "greenhouse"))
    assert read_events("Take parcel 1 to the outbound dock, then go back to the charging bay.", depot) == [
        "parcel_1 at outbound_dock", "go to charging_bay"]
    assert read_events("Open the supply cabinet, then put the trowel on the low shelf.", green) == [
        "supply_cabinet open", "trowel at shelf_low"]
    assert read_events("Open the supply cabinet, and after that put the trowel on the low shelf.", green) == [
        "supply_cabinet open", "trowel at shelf_low"]
    assert read_events("Run over to the outbound dock, wait there 20 seconds, then return to the charging bay.", depot) == [
        "go to outbound_dock", "wait 20", "go to charging_bay"]
    goal, _ = task_goal_schema("Take parcel 1 to the outbound dock, then go back to the charging bay.", *worlds["parcel_depot"])
    first = goal["prefixItems"][0]["anyOf"]
    assert len(first) == 1 and "before" in first[0]["properties"]


def test_the_grammar_opens_an_ordered_task_with_its_before(worlds):
    tasks, ws = load_eval_set(SETS / "7-printstudio-aquarium-museum-skihire")
    by = {t.id: t for t in tasks}
    for tid in ("ps03", "ps04", "ps07", "aq01", "aq03", "aq08", "ms01", "ms03", "ms07", "ms09", "sk02", "sk03", "sk07"):
        t = by[tid]
        w, s = ws[t.world]
        goal, v = task_goal_schema(t.task, w, s)
        assert "before" in goal["prefixItems"][0]["anyOf"][0]["properties"], tid
        assert v.is_valid(t.goal.raw), tid           # the set's answer, in the grammar's order
        first = [x for x in t.goal.raw if "before" in x][0]
        if first["before"][::-1] != first["before"]:      # not another order
            assert not v.is_valid([{"before": first["before"][::-1]}, *t.goal.raw[1:]]), tid
        assert not v.is_valid([x for x in t.goal.raw if "before" not in x] or [{"robot_at": "vault"}]), tid
    # and nothing after the end states: the order takes in every thing the task speaks of (the
    # model otherwise added "screen frame at the drying rack" to "look over the screen twice")
    t = by["ps07"]
    w, s = ws[t.world]
    goal, v = task_goal_schema(t.task, w, s)
    assert goal["minItems"] == goal["maxItems"] == 1
    assert not v.is_valid([*t.goal.raw, {"object": "screen_frame", "at": "drying_rack"}])
    # the wait is the time the task says: "wait there ten seconds" is 10, not 10.5
    t = by["ms03"]
    w, s = ws[t.world]
    goal, v = task_goal_schema(t.task, w, s)
    bad = json.loads(json.dumps(t.goal.raw).replace('"duration": 10', '"duration": 10.5'))
    assert v.is_valid(t.goal.raw) and not v.is_valid(bad)


def test_a_wait_the_robot_cannot_make_is_refused_not_shortened(worlds):
    w, s = worlds["print_studio"]
    task = "Open the exposure unit, wait 90 seconds, and close it again."     # the arm's wait: 30 s at most
    goal, v = task_goal_schema(task, w, s)
    wrote = [{"before": [{"object": "exposure_unit_lid", "is": "open"}, {"do": "wait", "args": {"duration": 90}},
                         {"object": "exposure_unit_lid", "is": "closed"}]}, {"object": "exposure_unit_lid", "is": "closed"}]
    assert v.is_valid(wrote)
    assert any("above the maximum 30" in f.message for f in goal_reasons({"goal": wrote}, w, s))


def test_the_gate_holds_a_goal_to_the_order(worlds):
    w, s = worlds["museum_storeroom"]
    task = "Scan the vault, wait 30 seconds, and scan it again."
    plain = {"goal": [{"place": "vault", "is": "inspected"}], "steps": []}
    f = grounding_findings(task, plain, w, s)
    assert [x.check for x in f] == ["goal"] and "look at vault, then wait 30, then look at vault" in f[0].message
    ordered = {"goal": [{"before": [{"do": "scan", "args": {"area": "vault"}}, {"do": "wait", "args": {"duration": 30}},
                                    {"do": "scan", "args": {"area": "vault"}}]}], "steps": []}
    assert grounding_findings(task, ordered, w, s) == []


@pytest.mark.parametrize("directory,tid", [("2-bakery-library-repair-ward", "lb08"),
                                           ("3-recycling-science-hotel-garage", "sc06")])
def test_an_older_look_then_place_task_still_reaches_its_plain_answer(directory, tid):
    """Written before goals had orders ("check the lens, then leave it on the desk": inspected and
    at the desk), these now get the order; its plan still reaches the set's answer."""
    tasks, ws = load_eval_set(SETS / directory)
    t = {x.id: x for x in tasks}[tid]
    w, s = ws[t.world]
    goal, v = task_goal_schema(t.task, w, s)
    assert not v.is_valid(t.goal.raw)
    ev = read_task(t.task, w).events
    obj, place = ev[1].subject, ev[1].value
    ordered = [{"before": [{"do": "inspect", "args": {"object": obj}}, {"object": obj, "at": place}]},
               {"object": obj, "at": place}]
    assert v.is_valid(ordered)
    plan = complete({"plan_id": "p1", "task": t.task, "goal": ordered, "steps": []}, w, s)
    g = check_plan(plan, specialize(base_plan_schema(), w, s, task=t.task), w, s)
    res = SimpleNamespace(plan=plan, valid=g.valid, report=g.report(), attempts=1, stats={"plan_latency_s": 0.1})
    assert score(t, res, w, s)["success"]


# ---- a call the task fixes with its own numbers (task_leads._call_lead) ----------------------
def test_lengths_and_counts_in_words():
    from agent.language.amounts import lengths, times_said
    assert lengths(tokens("a shove 5 cm to the right")) == [0.05] and lengths(tokens("3cm forward")) == [0.03]
    assert lengths(tokens("back a couple of centimetres")) == [0.02] and lengths(tokens("30 mm left")) == [0.03]
    assert lengths(tokens("put it on the second shelf")) == []
    assert times_said(tokens("three times")) == 3 and times_said(tokens("scan it twice")) == 2
    assert times_said(tokens("the first time")) == 1 and times_said(tokens("once")) == 1


def test_a_push_with_its_length_and_a_repeated_look_open_the_goal(worlds):
    tasks, ws = load_eval_set(SETS / "7-printstudio-aquarium-museum-skihire")
    by = {t.id: t for t in tasks}
    for tid in ("ps01", "ps08", "aq04", "aq06"):
        t = by[tid]
        w, s = ws[t.world]
        goal, v = task_goal_schema(t.task, w, s)
        assert goal["minItems"] == goal["maxItems"] == 1 and v.is_valid(t.goal.raw), tid
    w, s = ws["print_studio"]
    goal, v = task_goal_schema("Nudge the screen frame back a couple of centimetres.", w, s)
    assert not v.is_valid([{"object": "screen_frame", "at": "drying_rack"}])       # what the model wrote
    assert not v.is_valid([{"do": "push", "args": {"object": "screen_frame", "direction": "back", "distance": 0.2}}])
    # no length, no direction said, two things, or where it goes: the grammar is what it was
    for task in ("Push the flat file drawer shut.", "Give the ink tin a shove 5 cm.",
                 "Push the ink tin and the test print 5 cm to the right.",
                 "Put the ink tin back on the supply shelf, 5 cm from the edge."):     # a place: a carry
        goal, _ = task_goal_schema(task, w, s)
        assert all(b.get("properties", {}).get("do", {}).get("const") != "push"
                   for p in goal.get("prefixItems", []) for b in p["anyOf"]), task
    w, s = ws["aquarium_backroom"]
    goal, v = task_goal_schema("Read the thermometer three times.", w, s)
    assert not v.is_valid([{"do": "inspect", "args": {"object": "thermometer"}, "times": 2}])


def test_the_gate_holds_a_goal_to_the_call_the_task_fixes(worlds):
    w, s = worlds["print_studio"]
    task = "Give the ink tin a shove 5 cm to the right so I can get at the registration marks."
    f = grounding_findings(task, {"goal": [{"object": "ink_tin", "at": "press_bed"}], "steps": []}, w, s)
    assert [x.check for x in f] == ["goal"] and "push ink_tin right 0.05" in f[0].message
    push = {"do": "push", "args": {"object": "ink_tin", "direction": "right", "distance": 0.05}}
    assert grounding_findings(task, {"goal": [push], "steps": []}, w, s) == []
    far = {"do": "push", "args": {"object": "ink_tin", "direction": "right", "distance": 0.5}}
    assert [x.check for x in grounding_findings(task, {"goal": [far], "steps": []}, w, s)] == ["goal"]
    w, s = worlds["aquarium_backroom"]
    twice = {"do": "inspect", "args": {"object": "thermometer"}, "times": 2}
    f = grounding_findings("Read the thermometer three times.", {"goal": [twice], "steps": []}, w, s)
    assert [x.check for x in f] == ["goal"] and "inspect thermometer x3" in f[0].message
