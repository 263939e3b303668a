"""What the tool-call tests share: two tools (one with a $ref), answers in the call format, and
a scripted runtime whose every token passes through the request's grammar."""

from __future__ import annotations

from thor_runtime.engine.generate import Result
from thor_runtime.engine.stats import Stats
from thor_runtime.speculative import PLAIN

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
MOVE = {
    "type": "object",
    "properties": {
        "object": {"type": "string", "enum": ["red_cup", "blue_box"]},
        "dx_cm": {"type": "integer", "minimum": -20, "maximum": 20},
        "gentle": {"type": "boolean"},
        "via": {"type": "array", "items": {"$ref": "#/$defs/place"}, "maxItems": 2},
    },
    "required": ["object", "dx_cm", "gentle", "via"],
    "additionalProperties": False,
    "$defs": {"place": {"type": "string", "enum": ["sink", "shelf"]}},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": WEATHER,
            "description": "The weather in a city",
        },
    },
    {
        "type": "function",
        "function": {"name": "push_object", "parameters": MOVE, "description": "Push an object"},
    },
]
SCHEMAS = {"get_weather": WEATHER, "push_object": MOVE}
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
PARIS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    "\n</tool_call>"
)
PUSH = (
    '<tool_call>\n{"name": "push_object", "arguments": {"object": "red_cup", "dx_cm": -5, '
    '"gentle": true, "via": ["sink"]}}\n</tool_call>'
)


class Scripted:
    """Stands in for the runtime: each request's generation is the next scripted text, its tokens
    committed through the request's grammar (a token it refuses raises) and handed to on_token.
    The host's warm-up (no on_token) gets an empty answer."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.prompts = tok, list(texts), []

    def share(self, n):
        return 1

    def generate(
        self, prompt_ids, params, speculation=PLAIN, constraint=None, on_token=None, on_prefill=None
    ):
        if on_token is None:
            return Result([], "", "length", len(prompt_ids), Stats(prompt_tokens=len(prompt_ids)))
        self.prompts.append(self.tok.decode(prompt_ids, skip_special=False))
        ids = self.tok.encode(self.texts.pop(0), add_special=False) + [self.tok.eos_token_ids[0]]
        for t in ids:
            if constraint is not None:
                constraint.advance(t)
            on_token(t)
        return Result(
            ids,
            self.tok.decode(ids),
            "eos",
            len(prompt_ids),
            Stats(prompt_tokens=len(prompt_ids), generated=len(ids)),
        )


# the same call as a model may also write it where tool_choice is auto
FENCED = (
    '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n'
    '    "unit": "celsius"\n  }\n}\n```'
)
BARE = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
