"""The goal held to the task's words (agent/language/task_match.py), alone and inside the repair loop."""
from __future__ import annotations

from evals.evaluation import SETS_DIR

import json
from itertools import permutations

from evals.evaluation import load_eval_set
from agent.language.task_match import grounding_findings
from agent.planner.planner import Planner
from agent.planner.prompt import goal_forms, system_prompt
from agent.language.reading import mentions, names, read_task, words

from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import (
    LIB,
    arm_and_mobile_skills,
    checks,
    good_plan,
    small_world,
    with_goal,
    world_and_skills,
)


def test_words_and_names():
    tw = words("Put the Bolt Trays into drawer 1, then the batteries")
    assert {"bolt", "tray", "drawer", "1", "battery"} <= tw
    assert names(tw, "bolt_tray") and names(tw, "drawer_1") and not names(tw, "drawer_2")
    assert mentions(words("put the tool away"), "trowel", "tool")          # by its type
    assert mentions(words("the red pan"), "cast_iron_pan", "pan")
    assert not mentions(words("put the orchid on the bench"), "seedling_cup", "cup")
    assert not names(words("parcel 1"), "1")                              # a bare number names nothing


def test_the_right_goal_has_no_findings():
    w, _ = world_and_skills("kitchen")
    assert grounding_findings("put the apple on the table", good_plan(), w) == []
    # a thing the world lacks, said with `missing`: nothing to hold to the task
    assert grounding_findings("put the orchid on the table", with_goal({"missing": "orchid"}), w) == []
    # no goal: the gate reports that, not this check
    assert grounding_findings("put the apple on the table", {"steps": []}, w) == []


def test_a_swapped_object_is_named():
    w, _ = world_and_skills("kitchen")
    f = grounding_findings("put the orchid on the table", good_plan(), w)
    assert checks(f) == ["object"]
    # the orchid is what "put" takes: the finding names it, whatever the goal said instead
    assert "asks for orchid" in f[0].message and '"missing": "orchid"' in f[0].message


def test_an_object_the_task_names_but_the_goal_leaves_out():
    w, _ = world_and_skills("kitchen")
    task = "put the apple and the red cup on the table"
    assert "red_cup" in {o.name for o in w.objects}
    f = grounding_findings(task, good_plan(), w)
    assert checks(f) == ["goal"] and "red_cup" in f[0].message
    both = with_goal({"object": "apple", "at": "table"}, {"object": "red_cup", "at": "table"})
    assert grounding_findings(task, both, w) == []


def test_every_reference_goal_of_the_eval_set_passes():
    """The check must never flag the answers the evaluation itself counts as right."""
    tasks, worlds = load_eval_set()
    for t in tasks:
        if t.goal:
            plan = {"goal": ASKED_SINCE.get(t.id, t.goal.raw), "steps": []}
            assert grounding_findings(t.task, plan, worlds[t.world][0]) == [], t.id
        elif t.refuse == "object":   # a thing the world lacks: no world object is mentioned
            w = worlds[t.world][0]
            assert not [o.name for o in w.objects if mentions(words(t.task), o.name, o.type)], t.id


def test_repair_loop_feeds_grounding_back(tiny_llama):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    rt = ScriptedRuntime(tok, [json.dumps(good_plan()), json.dumps(with_goal({"missing": "orchid"}))])
    res = Planner(rt, tok, attempts=1, thinking=False).plan("put the orchid on the table", w, s)
    # first answer: a valid plan about the apple, rejected; the repair says the orchid is missing
    assert "asks for orchid" in rt.prompts[1]
    assert not res.valid and res.attempts == 2 and checks_of(res.report) == {"object"}
    # a model that insists on the apple is refused, never run
    rt = ScriptedRuntime(tok, [json.dumps(good_plan())] * 2)
    res = Planner(rt, tok, attempts=1, thinking=False).plan("put the orchid on the table", w, s)
    assert not res.valid and "object" in checks_of(res.report)


def checks_of(report) -> set[str]:
    return {r["check"] for r in report}


def test_prompt_shows_a_goal_for_each_kind_the_skills_can_reach():
    w, s = world_and_skills("kitchen")
    forms = goal_forms(s)
    for shown in ('{"object":"cup","at":"box"},{"object":"pen","at":"box"}', '{"object":"lid","is":"open"}',
                  '{"object":"pen","is":"inspected"}', '{"holding":"pen"}'):
        assert shown in forms
    assert "robot_at" not in forms                                    # no skill here moves the base
    assert forms in system_prompt(w, s)
    wh, sh = world_and_skills("warehouse")
    assert '{"robot_at":"dock"}' in goal_forms(sh) and '"is":"open"' not in goal_forms(sh)


def test_goal_schema_is_focused_on_the_task():
    from agent.files.loader import base_plan_schema
    from agent.schema.specialize import PlanValidator, specialize

    w, s = world_and_skills("kitchen")
    task = "put the apple and the red cup on the table"
    schema = specialize(base_plan_schema(), w, s, task=task)
    goal = schema["properties"]["goal"]
    assert goal["minItems"] == 2 and len(goal["prefixItems"]) == 2        # apple, then red_cup: the task's order
    ok = lambda g: not list(PlanValidator(schema).iter_errors({**good_plan(), "goal": g}))
    assert ok([{"object": "apple", "at": "table"}, {"object": "red_cup", "at": "table"}])
    assert not ok([{"object": "apple", "at": "table"}])                                  # half the task
    assert not ok([{"object": "red_cup", "at": "table"}, {"object": "apple", "at": "table"}])
    assert not ok([{"object": "apple", "at": "table"}, {"object": "plate", "at": "table"}])  # not mentioned
    assert ok([{"object": "apple", "at": "table"}, {"object": "red_cup", "at": "table"},
               {"object": "blue_mug", "is": "inspected"}])                              # a cup, by its type
    # states by type: a drawer opens, an apple does not
    assert not ok([{"object": "apple", "is": "open"}, {"object": "red_cup", "at": "table"}])
    drawer = specialize(base_plan_schema(), w, s, task="open the drawer")
    assert not list(PlanValidator(drawer).iter_errors({**good_plan(), "goal": [{"object": "drawer", "is": "open"}]}))
    # a task about a thing the world lacks: no condition about any object can be written
    orchid = specialize(base_plan_schema(), w, s, task="put the orchid on the table")["properties"]["goal"]
    assert "prefixItems" not in orchid
    assert all("object" not in b["properties"] and "holding" not in b["properties"] for b in orchid["items"]["anyOf"])
    # without a task, the whole world as before
    free = specialize(base_plan_schema(), w, s)["properties"]["goal"]
    assert "prefixItems" not in free and any("plate" in json.dumps(b) for b in free["items"]["anyOf"])


def test_task_verbs_choose_the_kind():
    from agent.files.loader import base_plan_schema
    from agent.schema.specialize import PlanValidator, specialize

    w, s = world_and_skills("kitchen")

    def ok(task, goal):
        schema = specialize(base_plan_schema(), w, s, task=task)
        return not list(PlanValidator(schema).iter_errors({**good_plan(), "goal": goal}))

    assert ok("open the drawer", [{"object": "drawer", "is": "open"}])
    assert not ok("open the drawer", [{"object": "drawer", "at": "table"}])
    assert ok("inspect the plate", [{"object": "plate", "is": "inspected"}])
    assert not ok("inspect the plate", [{"object": "plate", "at": "table"}])
    assert ok("hold the apple", [{"holding": "apple"}])
    # the verb goes to the object that can take it; the other stays free
    assert ok("open the drawer and put the apple on the table",
              [{"object": "drawer", "is": "open"}, {"object": "apple", "at": "table"}])
    # something to move, but nothing of this world mentioned: only `missing` is left
    assert ok("bring the orchid to the table", [{"missing": "orchid"}])
    assert not ok("bring the orchid to the table", [{"place": "table", "is": "inspected"}])
    # the gate says the same of a plan decoded under another schema
    f = grounding_findings("open the drawer", with_goal({"object": "drawer", "is": "closed"}), w, s)
    assert checks(f) == ["goal"] and "drawer open" in f[0].message
    f = grounding_findings("bring the orchid to the table", with_goal({"place": "table", "is": "inspected"}), w, s)
    assert checks(f) == ["object"]


# Answers written before goals had orders and calls, which the grammar now asks for in the form its
# words say (the plan for it reaches the plain answer): "check X for scratches, then file it on the
# shelf" is the order with the end state, as for the same words in set 7; "sweep bay 3 with the
# lidar" is the lidar scan
ASKED_SINCE = {
    "hw06": [{"do": "scan", "args": {"area": "bay_3", "mode": "lidar"}}],
    "lb08": [{"before": [{"do": "inspect", "args": {"object": "dvd_case"}}, {"object": "dvd_case", "at": "media_shelf"}]},
             {"object": "dvd_case", "at": "media_shelf"}],
    "sc06": [{"before": [{"do": "inspect", "args": {"object": "hand_lens"}}, {"object": "hand_lens", "at": "demo_desk"}]},
             {"object": "hand_lens", "at": "demo_desk"}],
}


# Reference goals of a held-out set that their task's grammar cannot write yet, kept as said:
# what the reading misses there is what the set measures (docs/goals.md, set 9).
CANNOT_WRITE = {
    "11-bindery-honeyhouse-hangar-seedbank": {
        "hh03": "a look asked \"before you move it\": the grammar's `before` holds only the frame's place, twice, no inspection",
        "hh04": "a pour from the bucket (holding it, then the pour) as one `before`: the grammar wants two entries opening with the jar's end state",
    },
    "13-darkroom-cheesemonger-stables-foodbank": {
        "dk05": "a set by type alone",
        "st07": "scanned place, then dock",
        "fb05": "scan, wait, scan again",
    },
    "14-candlemaker-barbershop-sawmill-observatory": {
        "sm02": "the type `ppe` said as \"safety gear\": the grammar asks for the set by where it rests",
    },
    "16-locksmith-tailor-brickyard-campsite": {
        "lk05": "\"a pin is sticking in that lock\" read as the lock put somewhere, so the order opens with it",
        "lk09": "\"the strongbox is in front of the pin drawer\" names the drawer, so no push of the one thing is read",
        "tr05": "the look in the order is written as the `inspect` call (the same plan), the answer as the drawer inspected",
    },
    "17-goldsmith-roastery-kennels-gymnasium": {
        "gd03": "the grammar puts the jug back in the sink inside the order as well; the answer orders the hold and the pour only",
        "ry01": "no order is read from \"grab the gooseneck and pour over cupping bowl 2\"; the bowl is paired with the kettle base",
        "ry05": "\"then do that once more\" is not read as a second push",
        "ry11": "the look in the order is written as the `inspect` call (the same plan), the answer as the trier inspected",
        "kn01": "\"0.3 metres a second\" is read as a wait of one second after the going; the drive's speed is not read",
        "kn05": "no order is read from \"wait a minute for the vet, then dock\" (a dock with no place said)",
    },
    "18-cobbler-soapery-quarry-ferry": {
        "cz05": "\"put the dye bottle back\" is read as the dish put back (the bottle said by another name)",
        "cz07": "\"twice over\" is not read as a count, and \"the welt stitching\" names the stitching awl",
        "cz09": "\"pull the nail drawer out by ten centimetres\" is read as the drawer open, not the `open` call by a distance",
        "sx01": "no set is read: \"bars\" is no type here and \"the lot\" is said in the next sentence",
        "sx03": "\"next to the mould\" makes the mould a second object the grammar asks a condition of",
        "qu09": "the drive's speed is not read: the grammar asks for the robot at the weighbridge",
    },
    "15-teahouse-fossillab-orchard-bowlingalley": {
        "fp05": "a pour said as \"squirt some over the nodule\", its angle as \"tip the bottle\": no order is read",
        "or02": "\"both crates sitting in row 7\": the grammar asks for the crates at row 7 (the same two), the answer "
                "for everything at row 7",
        "ba05": "\"plug yourself in\" said for docking: the grammar asks for the robot at the charger",
    },
}

# Reference goals the grammar can write but the gate holds to a word the task says in passing
# (kept as said: the set measures what the reading misses there).
HELD_BY_THE_GATE = {
    "17-goldsmith-roastery-kennels-gymnasium": {
        "kn02": "\"someone thinks a dog has got out of its run\": the dog bed taken as named",
        "gy04": "\"your camera's just staring at the wall\": the wall bars taken as where to look",
    },
}

# Things an infeasible task asks for whose every word is a word of its world, so that `missing`
# cannot take them from the words no name has (the set keeps the task as said).
UNNAMED = {
    "14-candlemaker-barbershop-sawmill-observatory": {
        "bs11": "\"a hot towel\": the hot water jug and the hot towel cabinet have both words",
        "ob11": "\"the star projector\": \"star\" is a word of the star charts (`missing` may say \"projector\")",
    },
    "15-teahouse-fossillab-orchard-bowlingalley": {
        "ba11": "\"the karaoke machine\": \"machine\" is a type here (`missing` may say \"karaoke\")",
    },
    "18-cobbler-soapery-quarry-ferry": {
        "sx11": "\"the peppermint oil\": \"oil\" is a word of this world (`missing` may say \"peppermint\")",
    },
}


def test_every_reference_goal_fits_its_task_schema():
    """The task-focused grammar must be able to write the answer each evaluation set counts as
    right, and the gate must accept it (both sets)."""
    from agent.files.loader import AGENT_DIR, base_plan_schema
    from agent.schema.specialize import PlanValidator, specialize

    sets = sorted(d for d in (SETS_DIR).iterdir() if (d / "tasks.json").is_file())
    assert len(sets) >= 2
    for d in sets:
        tasks, worlds = load_eval_set(d)
        for t in tasks:
            if not t.goal:
                continue
            w, s = worlds[t.world]
            # as written: calls, orders and sets too; three older tasks are now asked for in the
            # form their words say (ASKED_SINCE)
            goal = ASKED_SINCE.get(t.id, t.goal.raw)
            spec = specialize(base_plan_schema(), w, s, task=t.task)
            schema = PlanValidator({**spec["properties"]["goal"], "$defs": spec["$defs"]})
            # a goal is a set: the grammar fixes an order, so some order of the answer must fit
            fits = any(not list(schema.iter_errors(list(p))) for p in permutations(goal))
            if t.id in CANNOT_WRITE.get(d.name, {}):
                assert not fits, f"{t.id} fits its grammar now: take it off CANNOT_WRITE"
                continue
            assert fits, (t.id, t.task)
            findings = grounding_findings(t.task, {"goal": goal, "steps": []}, w, s)
            if t.id in HELD_BY_THE_GATE.get(d.name, {}):
                assert findings, f"{t.id} passes the gate now: take it off HELD_BY_THE_GATE"
                continue
            assert findings == [], t.id


# ---- the task's reading (agent/language/reading.py) ----------------------------------------------------
def test_reading_refers_by_a_head_word_only_as_a_noun():
    r = read_task("Load the paperback and the picture book onto the cart.", LIB)
    assert r.referred == ("mystery_paperback", "picture_book")        # task order; "paperback" is one thing
    assert r.places == ("book_cart",)                                 # "the cart": the one cart
    # "set" as a verb is not the audiobook set; "the book" is two things, so it refers to none
    assert read_task("set it aside on the hold shelf", LIB).referred == ()
    assert read_task("put the book on the cart", LIB).referred == ()
    # a word of another name before the head leaves it open: a red cup and a blue mug
    w, _ = world_and_skills("kitchen")
    r = read_task("Put the red mug in the dish rack.", w)
    assert r.referred == () and set(r.mentioned) == {"red_cup", "blue_mug"}
    assert read_task("Put the mug in the dish rack.", w).referred == ("blue_mug",)
    # a modifier is not a head: "the patient" is not the patient hoist (but it is mentioned)
    r = read_task("sweep bay 3 before the next patient arrives", LIB)
    assert r.referred == () and r.mentioned == ("patient_hoist",)


def test_reading_sources_and_destinations():
    r = read_task("Lift the audiobook set out of the drop box onto the returns desk.", LIB)
    assert r.sources == {"drop_box"} and r.destinations("audiobook_set") == ("returns_desk",)
    r = read_task("Bay 2 needs the mystery paperback from the returns desk", LIB)
    assert r.destinations("mystery_paperback") == ("bay_2",)
    # where a thing already is, is not where the task wants it
    r = read_task("The patient hoist in bay 2 is free; get it to bay 3", LIB)
    assert r.destinations("patient_hoist") == ("bay_3",) and r.sources == frozenset()
    # "drop it off at" says where it goes, "off the shelf" where it comes from
    assert read_task("drop the picture book off at the hold shelf", LIB).sources == frozenset()
    assert read_task("take the picture book off the hold shelf", LIB).sources == {"hold_shelf"}
    # no place said: no restriction
    assert read_task("put the picture book away", LIB).destinations("picture_book") == ()


def test_reading_verbs_and_tasks_about_places():
    assert read_task("Have a look at the picture book", LIB).wanted == {("is", "inspected")}
    assert read_task("Grab the picture book and keep it in your hand", LIB).wanted == {("holding", None)}
    assert read_task("Pick the picture book up with the gripper and put it on the cart", LIB).wanted == set()
    r = read_task("Sweep bay 3 with the lidar before the next patient arrives.", LIB)
    assert r.about_places == ("bay_3",) and not r.only_missing
    assert read_task("Head over to bay 3", LIB).about_places == ("bay_3",)
    # no object of this world, no going, no looking: what it asks for is not here
    for task in ("Today's newspaper goes on the returns desk.", "We need the defibrillator in bay 2",
                 "bring the orchid to the cart"):
        r = read_task(task, LIB)
        assert r.only_missing and r.about_places == (), task
    assert not read_task("put the picture book on the cart", LIB).only_missing
    # somewhere to go, said without a verb of going; a word of a place's name is not a verb
    lobby = small_world([{"name": "ice_bucket", "type": "bucket", "at": "pantry"}], ["lift_lobby", "pantry"])
    r = read_task("Make your way to the lift lobby.", lobby)
    assert not r.carry and r.toward and not r.only_missing and r.about_places == ("lift_lobby",)
    assert read_task("The newspaper goes on the lift lobby bench", lobby).only_missing


def _goal_fits(default_skills):
    """-> ok(task, goal, skills=default_skills): the task-focused goal schema on LIB admits goal."""
    from agent.files.loader import base_plan_schema
    from agent.schema.specialize import PlanValidator, specialize

    def ok(task, goal, skills=default_skills):
        spec = specialize(base_plan_schema(), LIB, skills, task=task)
        schema = {**spec["properties"]["goal"], "$defs": spec["$defs"]}     # the goal's calls and sets
        return not list(PlanValidator(schema).iter_errors(goal))
    return ok


def test_schema_and_gate_hold_the_goal_to_the_places_the_task_says():
    s, moves = arm_and_mobile_skills()
    ok = _goal_fits(s)

    task = "Lift the audiobook set out of the drop box onto the returns desk."
    assert ok(task, [{"object": "audiobook_set", "at": "returns_desk"}])
    assert not ok(task, [{"object": "audiobook_set", "at": "drop_box"}])          # the source
    assert not ok(task, [{"object": "audiobook_set", "at": "hold_shelf"}])        # a place never said
    f = grounding_findings(task, with_goal({"object": "audiobook_set", "at": "drop_box"}), LIB, s)
    assert checks(f) == ["goal"] and "returns_desk" in f[0].message
    # a task about a place alone opens with it, by its verb
    # ... with the call its option says, where a skill takes it ("with the lidar": the lidar scan)
    assert ok("Sweep bay 3 with the lidar", [{"do": "scan", "args": {"area": "bay_3", "mode": "lidar"}}], moves)
    assert not ok("Sweep bay 3 with the lidar", [{"place": "bay_3", "is": "inspected"}], moves)
    assert ok("Sweep bay 3", [{"place": "bay_3", "is": "inspected"}], moves)
    assert not ok("Sweep bay 3 with the lidar", [{"robot_at": "bay_3"}], moves)
    assert ok("Head over to bay 3", [{"robot_at": "bay_3"}], moves)
    assert not ok("Head over to bay 3", [{"robot_at": "bay_2"}], moves)
    f = grounding_findings("Head over to bay 3", with_goal({"robot_at": "bay_2"}), LIB, moves)
    assert checks(f) == ["goal"] and "bay_3" in f[0].message
    # nothing here, no going, no looking: only `missing`
    assert ok("We need the defibrillator in bay 2", [{"missing": "defibrillator"}], moves)
    assert not ok("We need the defibrillator in bay 2", [{"robot_at": "bay_2"}], moves)
    f = grounding_findings("We need the defibrillator in bay 2", with_goal({"robot_at": "bay_2"}), LIB, moves)
    assert checks(f) == ["object"]


def test_missing_names_a_thing_the_task_says_never_a_world_name():
    import json as _json

    from agent.files.loader import base_plan_schema
    from agent.schema.specialize import PlanValidator, specialize

    r = read_task("Today's newspaper goes on the returns desk.", LIB)
    assert r.unknown == ("newspaper",)                # no world name, type, verb or function word
    assert read_task("Put the soldering iron on the cart", LIB).unknown == ("soldering_iron", "soldering", "iron")
    _, s = world_and_skills("kitchen")
    goal = specialize(base_plan_schema(), LIB, s, task="Today's newspaper goes on the returns desk.")
    v = PlanValidator({**goal["properties"]["goal"], "$defs": goal["$defs"]})
    assert not list(v.iter_errors([{"missing": "newspaper"}]))
    assert list(v.iter_errors([{"missing": "hold_shelf"}]))          # a world name is no missing thing
    # a task whose every word is known keeps a free string (the gate still names world names)
    free = specialize(base_plan_schema(), LIB, s, task="put the picture book on the cart")["properties"]["goal"]
    assert any(b["properties"].get("missing") == {"type": "string", "minLength": 1, "maxLength": 40}
               for b in free["items"]["anyOf"])
    # every evaluation set: what an infeasible task lacks is among the words `missing` may use
    for d in sorted(x for x in (SETS_DIR).iterdir() if (x / "tasks.json").is_file()):
        doc = _json.loads((d / "tasks.json").read_text())
        tasks, worlds = load_eval_set(d)
        lacks = {t["id"]: t["asks"][0]["missing"] for t in doc.get("tasks", doc) if "asks" in t
                 and t.get("refuse") == "object"}
        for t in tasks:
            if t.id in lacks and t.id not in UNNAMED.get(d.name, {}):
                assert lacks[t.id] in read_task(t.task, worlds[t.world][0]).unknown, (d.name, t.id)


def test_two_part_tasks_pair_places_and_end_with_the_robot():
    r = read_task("The picture book goes on the cart and the mystery paperback on the hold shelf.", LIB)
    assert r.paired == {"picture_book": ("book_cart",), "mystery_paperback": ("hold_shelf",)}
    assert r.destinations("picture_book") == ("book_cart",) and r.go_to is None
    # a state, then a place
    r = read_task("Check the picture book for damage, then leave it on the cart.", LIB)
    assert r.verbs_for("picture_book") == {("is", "inspected")} and r.also_at("picture_book") == ("book_cart",)
    # the robot goes on at the end; "needs to go" is the book's, not the robot's
    r = read_task("Drop the picture book at the cart, then head back to bay 3.", LIB)
    assert r.paired["picture_book"] == ("book_cart",) and r.go_to == ("bay_3",)
    assert read_task("The picture book needs to go on the cart.", LIB).go_to is None
    assert read_task("Leave the picture book on the cart and go back and charge", LIB).go_to == ()
    # a place said and no state asked: the book should be there, not held nor inspected
    assert read_task("The picture book goes on the cart", LIB).verbs_for("picture_book") == {("at", None)}
    # held, said other ways; but not when the task says where it goes
    for task in ("Pick up the picture book and hang on to it", "Load the picture book and keep it on board",
                 "keep the picture book in your hand"):
        assert read_task(task, LIB).verbs_for("picture_book") == {("holding", None)}, task
    assert read_task("keep the picture book on the cart", LIB).verbs_for("picture_book") == {("at", None)}
    # an aside is not asked for: "so I can photograph it", "before I start on the paperback"
    r = read_task("Move the picture book to the cart so I can photograph it", LIB)
    assert r.verbs_for("picture_book") == {("at", None)}
    r = read_task("I need the picture book on the cart before I start on the paperback", LIB)
    assert r.referred == ("picture_book",) and "mystery_paperback" in r.mentioned
    # a thing to bring, said by a word that is not its head, is still not a task about places
    assert read_task("could you bring the mystery round to the cart?", LIB).about_places == ()


def test_two_part_goals_in_schema_and_gate():
    s, moves = arm_and_mobile_skills()
    ok = _goal_fits(s)

    task = "The picture book goes on the cart and the mystery paperback on the hold shelf."
    right = [{"object": "picture_book", "at": "book_cart"}, {"object": "mystery_paperback", "at": "hold_shelf"}]
    assert ok(task, right) and not ok(task, right[::-1])
    assert not ok(task, [{"object": "picture_book", "at": "hold_shelf"}, {"object": "mystery_paperback", "at": "book_cart"}])
    assert not ok(task, [{"holding": "picture_book"}, right[1]])
    f = grounding_findings(task, with_goal({"object": "picture_book", "at": "hold_shelf"}, right[1]), LIB, s)
    assert checks(f) == ["goal"] and "book_cart" in f[0].message
    task = "Check the picture book for damage, then leave it on the cart."
    both = [{"object": "picture_book", "is": "inspected"}, {"object": "picture_book", "at": "book_cart"}]
    # the task orders a look before a place: the goal opens with that order (tests/test_order_rule.py)
    ordered = [{"before": [{"do": "inspect", "args": {"object": "picture_book"}}, both[1]]}, both[1]]
    assert ok(task, ordered) and not ok(task, ordered[:1]) and not ok(task, both)
    f = grounding_findings(task, with_goal(*both[:1]), LIB, s)
    assert set(checks(f)) == {"goal"} and any("also puts picture_book at book_cart" in x.message for x in f)
    assert grounding_findings(task, with_goal(*ordered), LIB, s) == []
    task = "Drop the picture book at the cart, then head back to bay 3."
    end = [{"object": "picture_book", "at": "book_cart"}, {"robot_at": "bay_3"}]
    # "..., then head back": the two end states in that order
    ordered = [{"before": end}] + end
    assert ok(task, ordered, moves) and not ok(task, end, moves) and not ok(task, end[:1], moves)
    assert not ok(task, [{"before": [end[0], {"robot_at": "bay_2"}]}, end[0], {"robot_at": "bay_2"}], moves)
    f = grounding_findings(task, with_goal(end[0]), LIB, moves)
    assert set(checks(f)) == {"goal"} and any("bay_3" in x.message for x in f)
    assert grounding_findings(task, with_goal(*ordered), LIB, moves) == []
    # an arm cannot drive: neither the grammar nor the gate asks it for an end place
    assert ok(task, end[:1]) and grounding_findings(task, with_goal(end[0]), LIB, s) == []
