"""Word knowledge as data: the lexicon files, their schema, the merge of several, and what a
task's words name in a world in any language (mentions.py)."""

from __future__ import annotations

import json

import pytest

from agent.files.loader import world_from_dict
from agent.files.names import words
from agent.language.lexicon import EMPTY, LEXICON_DIR, NONE, cues, load_lexicon, read_lexicon
from agent.language.mentions import read_words
from thor_runtime.errors import ThorError

WORLD = {
    "name": "workshop",
    "objects": [
        {
            "name": "ink_tin",
            "type": "tin",
            "position": [0.3, 0.1, 0.9],
            "mass_kg": 0.3,
            "at": "bench",
            "aliases": ["Farbdose", "油墨罐"],
        },
        {
            "name": "red_cup",
            "type": "cup",
            "position": [0.2, 0.0, 0.9],
            "mass_kg": 0.2,
            "at": "bench",
            "aliases": ["taza roja"],
        },
    ],
    "places": [
        {"name": "bench", "position": [0.3, 0.0, 0.9], "aliases": ["Werkbank", "工作台"]},
        {"name": "shelf_2", "position": [0.1, 0.3, 1.0]},
    ],
    "robot": {"workspace": {"min": [-1, -1, 0], "max": [1, 1, 2]}, "max_payload_kg": 2.0},
}


@pytest.fixture(scope="module")
def world():
    return world_from_dict(WORLD, source="<test>")


def test_every_shipped_lexicon_is_valid_against_the_schema():
    files = sorted(LEXICON_DIR.glob("*.json"))
    assert [f.stem for f in files] == ["en"]
    for f in files:
        assert read_lexicon(f)["language"] == f.stem


def test_a_lexicon_off_its_schema_is_refused_with_the_file_named(tmp_path):
    bad = tmp_path / "xx.json"
    bad.write_text(json.dumps({"language": "xx", "numbers": {"eins": "one"}}))
    with pytest.raises(ThorError, match="xx.json: numbers/eins"):
        read_lexicon(bad)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ThorError, match="not a JSON lexicon"):
        read_lexicon(tmp_path / "broken.json")
    with pytest.raises(ThorError, match="not found"):
        load_lexicon(str(tmp_path / "absent.json"))


def test_a_deployment_adds_a_language_by_a_file(tmp_path, world):
    de = tmp_path / "de.json"
    de.write_text(
        json.dumps(
            {
                "language": "de",
                "ignore": ["die", "der", "das"],
                "numbers": {"fünf": 5},
                "units": {"zentimeter": {"unit": "m", "factor": 0.01}},
                "skills": {"push": ["schieb"]},
            }
        )
    )
    lex = load_lexicon(f"en,{de}")
    assert lex.languages == ("en", "de")
    t = read_words("Schieb die Farbdose fünf Zentimeter nach rechts", world, lex)
    assert t.named == {"ink_tin": 2}
    assert [(a.value, a.unit) for a in t.amounts] == [(0.05, "m")]
    assert "push" in t.hints["skills"]


def test_no_lexicon_knows_no_words(world):
    assert load_lexicon(NONE) is EMPTY and EMPTY.empty
    t = read_words("give the ink tin a shove five cm, then check it", world, EMPTY)
    assert t.named == {"ink_tin": 2} and t.amounts == ()
    assert all(not v for v in t.hints.values())


def test_english_hints_are_hints_of_forms_skills_and_amounts(world):
    lex = load_lexicon("shipped")
    t = read_words(
        "Give the ink tin a shove 5 cm, wait half a minute, then check it twice", world, lex
    )
    assert {"before", "times"} <= t.hints["forms"] and {"push", "wait", "inspect"} <= t.hints[
        "skills"
    ]
    assert [(a.value, a.unit) for a in t.amounts] == [(0.05, "m"), (30.0, "s"), (2.0, None)]
    assert cues(lex, words("put everything on the bench"))["forms"] == {"every"}


def test_things_are_named_by_name_alias_or_type_in_any_script(world):
    assert read_words("把油墨罐放到工作台上", world).named == {"ink_tin": 1, "bench": 6}
    assert read_words("Stell die Farbdosen auf die Werkbank", world).named == {
        "ink_tin": 2,
        "bench": 5,
    }
    assert read_words("pon la taza roja en el estante", world).named == {"red_cup": 2}
    t = read_words("move the cup to shelf 2", world)
    assert t.typed == {"red_cup": 2} and t.named == {"shelf_2": 4}
    assert t.amounts == ()  # the 2 is the shelf's name, no amount


def test_words_split_every_script_alike():
    assert words("Top-up the 5cm tin's, 2,5 s") == [
        "top",
        "up",
        "the",
        "5",
        "cm",
        "tin",
        "s",
        "2.5",
        "s",
    ]
    assert words("把红色杯子") == ["把", "红", "色", "杯", "子"]
    assert words("ÜBER Straße") == ["über", "strasse"]
