"""`thor bench --tools`' reading of the function-calling leaderboard: its functions as the tools
the service takes, and its AST check, on entries written here in the leaderboard's shape."""

from __future__ import annotations

import pytest

from thor_app.tools.bench_tools import calls_in_text, schema_of, score, tools_of

AREA = {
    "name": "geometry.area",
    "description": "Area of a shape.",
    "parameters": {
        "type": "dict",
        "required": ["base", "height"],
        "properties": {
            "base": {"type": "float", "description": "The base."},
            "height": {"type": "integer", "description": "The height."},
            "unit": {"type": "string", "description": "The unit.", "default": "units"},
            "sides": {"type": "array", "items": {"type": "integer"}, "description": "Sides."},
        },
    },
}
ANSWER = [{"geometry.area": {"base": [10.0], "height": [5], "unit": ["units", ""], "sides": [""]}}]


def test_the_functions_become_tools_the_service_takes():
    from agent.schema.grammar import check_schema

    (tool,) = tools_of([AREA])
    f = tool["function"]
    assert f["name"] == "geometry_area" and f["parameters"]["type"] == "object"
    assert f["parameters"]["properties"]["base"]["type"] == "number"
    check_schema(f["parameters"])
    assert schema_of({"type": "tuple", "items": {"type": "any"}}) == {
        "type": "array",
        "items": {"type": "string"},
    }


@pytest.mark.parametrize(
    "args, why",
    [
        ({"base": 10, "height": 5}, None),  # an int where a float goes
        ({"base": 10.0, "height": 5, "unit": "Units"}, None),  # strings without case
        ({"base": 10.0, "height": 5, "unit": "cm"}, "wrong value for unit"),
        ({"base": 10.0}, "missing required height"),
        ({"base": 10.0, "height": 5, "color": "red"}, "unexpected parameter color"),
        ({"base": 10.0, "height": "5"}, "wrong type for height"),
        ({"base": 10.0, "height": 5, "sides": [1]}, "wrong value for sides"),  # only left out
    ],
)
def test_simple_is_checked_as_the_leaderboard_checks(args, why):
    assert score("simple", [AREA], [{"geometry.area": args}], ANSWER) == why


def test_parallel_in_any_order_multiple_one_call_irrelevance_none():
    two = [
        {"geometry.area": {"base": [1.0], "height": [2]}},
        {"geometry.area": {"base": [3.0], "height": [4]}},
    ]
    calls = [
        {"geometry.area": {"base": 3.0, "height": 4}},
        {"geometry.area": {"base": 1.0, "height": 2}},
    ]
    assert score("parallel", [AREA], calls, two) is None
    assert score("parallel", [AREA], calls[:1], two) == "1 calls for 2"
    assert score("multiple", [AREA], [{"geometry.area": {"base": 10, "height": 5}}], ANSWER) is None
    assert score("irrelevance", [AREA], [], None) is None
    assert score("irrelevance", [AREA], calls[:1], None) == "made a call"


def test_calls_read_from_text_without_the_grammar():
    call = '{"name": "f", "arguments": {"x": 1}}'
    want = [{"name": "f", "arguments": {"x": 1}}]
    assert calls_in_text(f"<tool_call>\n{call}\n</tool_call>") == want
    assert calls_in_text(f"```json\n{call}\n```") == want
    assert calls_in_text(call) == want
    assert calls_in_text("It is sunny.") == []
    assert calls_in_text('```json\n{"name": "f", "arguments": \n```') is None  # malformed
