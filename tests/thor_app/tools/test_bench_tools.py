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


class FakeLlama:
    """Greedy decoding over a script of text pieces, one per token; with a grammar, the pieces
    of the grammar's script instead (what the constrained decoder would pick)."""

    def __init__(self, free: list[str], constrained: list[str]):
        self.free, self.constrained, self.calls = free, constrained, []
        self.vocab = {}

    def _id(self, piece: str) -> int:
        return self.vocab.setdefault(piece, len(self.vocab) + 1)

    def generate(self, ids, top_k, temp, reset, grammar=None):
        self.calls.append((list(ids), grammar))
        yield from (self._id(p) for p in (self.constrained if grammar else self.free))
        yield 0  # the end of the turn

    def detokenize(self, out, special):
        text = {v: k for k, v in self.vocab.items()}
        return "".join(text[t] for t in out).encode()


def _answer(llm, mode, max_tokens=64):
    from thor_app.tools.peers.llama_tools import answer

    return answer(llm, [7, 8], mode, max_tokens, lambda: "GRAMMAR", lambda tok: tok == 0)


def test_llama_cpp_decodes_a_call_under_its_grammar_once_the_model_opens_one():
    call = '\n{"name": "f", "arguments": {}}\n</tool_call>'
    llm = FakeLlama(["Sure", ". ", "<tool_call>", "ignored"], [call])
    a = _answer(llm, "grammar")
    assert a["text"] == "Sure. <tool_call>" + call and a["completion_tokens"] == 4
    # the second pass continues from the prompt and the free part, under the grammar
    assert llm.calls[1][1] == "GRAMMAR" and len(llm.calls[1][0]) == 2 + 3
    assert calls_in_text(a["text"]) == [{"name": "f", "arguments": {}}]


def test_llama_cpp_without_a_call_or_grammar_answers_freely():
    llm = FakeLlama(["No", " call", "."], ["unused"])
    assert _answer(llm, "grammar")["text"] == "No call." and len(llm.calls) == 1
    llm = FakeLlama(["a", "<tool_call>", "b"], ["unused"])
    assert _answer(llm, "plain")["text"] == "a<tool_call>b" and len(llm.calls) == 1
    assert _answer(FakeLlama(["a", "b", "c"], []), "plain", max_tokens=2)["text"] == "ab"


def test_the_table_sets_llama_cpp_beside_thor_with_the_latency_ratio():
    from thor_app.tools.bench_tools import markdown, summarize

    def row(engine, mode, verdict, latency):
        return {
            "engine": engine,
            "id": "simple_0",
            "category": "simple",
            "mode": mode,
            "status": 200,
            "latency_s": latency,
            "malformed": 0,
            "prompt_tokens": 10,
            "verdict": verdict,
        }

    rows = [row("thor", "grammar", None, 1.0), row("llama.cpp", "grammar", "wrong function", 3.0)]
    table = summarize(rows)
    assert table["simple"]["grammar"]["correct"] == 1
    assert table["simple"]["llama.cpp grammar"]["correct"] == 0
    meta = {"model": "m", "spec": "auto", "limit": 1, "max_tokens": 8}
    md = markdown(table, meta)
    assert "| simple | llama.cpp grammar | 0/1 (0%) |" in md
    assert "simple grammar: 3.00x" in md


def test_without_the_peers_venv_llama_cpp_is_skipped_with_the_reason(tmp_path):
    from types import SimpleNamespace

    from thor_app.tools.bench_tools import run_llama

    args = SimpleNamespace(peers_python=str(tmp_path / "none"), threads=1, max_tokens=8)
    rows, meta = run_llama(args, "default", {}, ["grammar"])
    assert rows == [] and "make bench-peers" in meta["peer_skipped"]
