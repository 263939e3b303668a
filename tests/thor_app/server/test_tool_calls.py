"""The tool-call grammar and the reader of its answers, without the service: what a request's
grammar lets through is a well-formed call (or content where it allows content), and the text
of an answer reads the same whole or in any pieces."""

from __future__ import annotations

import json

import pytest

from tests.helpers.tool_calls import BARE, FENCED, MSG, PARIS, PUSH, SCHEMAS, TOOLS


@pytest.mark.parametrize(
    "extra, text",
    [
        ({"parallel_tool_calls": False}, PARIS + "\n" + PUSH),
        ({"tool_choice": "none"}, PARIS),
        ({"tool_choice": "required"}, "Sunny."),
        ({"tool_choice": {"type": "function", "function": {"name": "push_object"}}}, PARIS),
        ({}, PARIS.replace("celsius", "kelvin")),
        ({}, PARIS.replace('"city": "Paris"', '"city": "Paris", "x": 1')),
        ({}, PARIS.replace('"Paris"', '"Paris, the capital"')),  # maxLength 12
        ({}, PARIS.replace("get_weather", "get_time")),
        ({}, PARIS.replace('{"city"', '{ "city"')),  # whitespace the format has not
        ({}, "  " + PARIS),  # content that opens a call
        ({}, FENCED.replace('"Paris"', "5")),  # another form: its arguments too
        ({}, BARE.replace("celsius", "kelvin")),
        ({}, FENCED + "\nThat is the call."),  # nothing but calls after a call
        ({"tool_choice": "required"}, FENCED),  # the template's form where it decides
    ],
)
def test_the_grammar_refuses_what_the_request_does_not_allow(tok, gtok, extra, text):
    """What the grammar of a request lets through ends well-formed; these answers it refuses
    before their end: a second call where parallel_tool_calls is false, a call where tool_choice
    is none or names another function, content where a call is required, arguments outside
    the schema, a function that is not a tool."""
    from thor_app.server.openai_api import parse_chat
    from thor_app.server.tool_calls import tool_grammar

    req = parse_chat({"messages": MSG, "tools": TOOLS, **extra})
    ids = tok.encode(text, add_special=False) + [tok.eos_token_ids[0]]
    assert tool_grammar(gtok, tok, req).constraint().valid_prefix(ids) < len(ids)
    ok = parse_chat({"messages": MSG, "tools": TOOLS})
    good = tok.encode(PARIS + "\n" + PUSH, add_special=False) + [tok.eos_token_ids[0]]
    assert tool_grammar(gtok, tok, ok).constraint().valid_prefix(good) == len(good)


@pytest.mark.parametrize(
    "text, calls",
    [
        (FENCED, 1),
        (BARE, 1),
        (FENCED + "\n\n" + FENCED, 2),
        (FENCED.replace("get_weather", "get_forecast"), 0),  # no tool of that name: content
        (BARE.replace("get_weather", "get_weather_now"), 0),
        ("```json\n[1, 2]\n```", 0),
        ("Sunny, 18 degrees.", 0),
    ],
)
def test_auto_reads_the_forms_models_also_write(tok, gtok, text, calls):
    """Where the model decides, a call may also come fenced or bare, as Qwen2.5-Coder writes
    them: text that opens one with a tool's name is that call, under its schema; any other text
    is content."""
    from thor_app.server.openai_api import parse_chat
    from thor_app.server.tool_calls import CallReader, CallShape, auto_forms, tool_grammar

    req = parse_chat({"messages": MSG, "tools": TOOLS})
    ids = tok.encode(text, add_special=False) + [tok.eos_token_ids[0]]
    assert tool_grammar(gtok, tok, req).constraint().valid_prefix(ids) == len(ids)
    reader = CallReader(CallShape("auto", frozenset(SCHEMAS), auto_forms(None)))
    streamed = []
    for i in range(0, len(text), 3):
        streamed += reader.push(text[i : i + 3])
    deltas, finish = reader.finish("", "eos")
    streamed += deltas
    assert len(reader.calls) == calls and finish == ("tool_calls" if calls else "eos")
    if calls:
        assert not reader.text
        for c in reader.calls:
            assert json.loads(c["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
        args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in streamed)
        assert args == "".join(c["function"]["arguments"] for c in reader.calls)
    else:
        assert reader.text == text and "".join(d["content"] for d in streamed) == text


@pytest.mark.parametrize("cut", [1, 2, 3, 7])
def test_reader_gives_the_same_answer_in_any_pieces(cut):
    from thor_app.server.tool_calls import CallReader, CallShape

    shape = CallShape("auto", frozenset(SCHEMAS))
    text = PARIS + "\n" + PUSH
    whole = CallReader(shape)
    whole.push(text)
    assert whole.finish("", "eos")[1] == "tool_calls" and len(whole.calls) == 2
    ids = iter(range(100))
    pieces = CallReader(shape, new_id=lambda: f"call_{next(ids)}")
    deltas = []
    for i in range(0, len(text), cut):
        deltas += pieces.push(text[i : i + cut])
    args: dict[int, str] = {}
    for d in deltas:
        (tc,) = d["tool_calls"]
        args[tc["index"]] = args.get(tc["index"], "") + tc["function"]["arguments"]
    want = [json.loads(c["function"]["arguments"]) for c in whole.calls]
    assert [json.loads(a) for a in args.values()] == want
    cut_short = CallReader(shape)
    cut_short.push(text[:-20])
    # the open call is left out
    assert cut_short.finish("", "length")[1] == "length" and len(cut_short.calls) == 1
    plain = CallReader(shape)
    plain.push("<tool")
    assert plain.finish(" is a word", "eos") == ([{"content": "<tool is a word"}], "eos")


# ---- any tools body: never a 5xx ---------------------------------------------------------------
def _tool_bodies():
    from hypothesis import strategies as st

    from tests.helpers.strategies import JSON, NAMES, SCHEMA, TEXT, mostly

    name = mostly(st.sampled_from(["get_weather", "push_object", "f", "a-b_c"]), NAMES | JSON)
    function = st.fixed_dictionaries(
        {"name": name},
        optional={
            "description": TEXT,
            "parameters": mostly(SCHEMA, JSON),
            "strict": st.booleans() | JSON,
        },
    )
    tool = st.fixed_dictionaries(
        {"type": mostly(st.just("function"), JSON), "function": mostly(function, JSON)}
    )
    choice = (
        st.sampled_from(["auto", "none", "required"])
        | st.fixed_dictionaries(
            {"type": st.just("function"), "function": st.fixed_dictionaries({"name": name})}
        )
        | JSON
    )
    arguments = st.sampled_from(['{"city": "Paris"}', "{", "[1]", ""]) | TEXT | JSON
    call = st.fixed_dictionaries(
        {
            "id": TEXT,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": name, "arguments": arguments}),
        }
    )
    roles = st.sampled_from(["user", "tool", "system"])
    message = st.fixed_dictionaries(
        {"role": roles, "content": TEXT}, optional={"tool_call_id": TEXT | JSON}
    ) | st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.none() | TEXT},
        optional={"tool_calls": mostly(st.lists(call, max_size=2), JSON)},
    )
    return st.fixed_dictionaries(
        {
            "messages": st.lists(message, min_size=1, max_size=4),
            "max_tokens": st.integers(1, 8),
            "tools": mostly(st.lists(tool, min_size=1, max_size=3) | st.just(TOOLS), JSON),
        },
        optional={
            "tool_choice": choice,
            "parallel_tool_calls": st.booleans() | JSON,
            "stream": st.booleans(),
            "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}]),
        },
    )


def test_any_tools_body_gives_no_5xx(tiny_llama_long):
    """Random tools, tool choices and tool turns (mostly near-valid, so most reach the schema
    checks and the grammar compile): every answer is under 500 and an error has OpenAI's body."""
    import asyncio
    import threading
    from collections import Counter

    from aiohttp.test_utils import TestClient, TestServer
    from hypothesis import given

    from tests.helpers.serving import config, hosted_loader, is_error_body, passing, wait_health
    from tests.helpers.strategies import PROPERTY
    from thor_app.server.app import make_app

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        app = make_app(
            config(limits={"max_tokens": 64, "default_max_tokens": 8}),
            loader=hosted_loader(tiny_llama_long),
            selftest=passing,
            watchdog_s=None,
        )
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        await wait_health(client)
        return client

    client = asyncio.run_coroutine_threadsafe(start(), loop).result(300)
    seen: Counter = Counter()

    @PROPERTY
    @given(body=_tool_bodies())
    def post(body):
        async def go():
            r = await client.post(
                "/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            return r.status, await r.read()

        status, raw = asyncio.run_coroutine_threadsafe(go(), loop).result(300)
        assert status < 500, (status, raw[:400], body)
        if status >= 400:
            assert is_error_body(json.loads(raw)), raw[:400]
        seen[status] += 1

    try:
        post()
    finally:
        asyncio.run_coroutine_threadsafe(client.close(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
    assert seen[200] >= 8 and seen[400] >= 8, seen


def test_the_written_format_is_the_templates_own():
    """Qwen2.5's template renders tools, past calls and results itself; what the service writes
    for a template that cannot is the same text, token for token."""
    from tests.helpers.pulled import QWEN_05B, pulled_or_skip

    pulled_or_skip(QWEN_05B)
    from thor_app.server.openai_api import parse_chat
    from thor_app.server.tool_calls import conversation, template_knows_tools
    from thor_runtime.loading import gguf_config_and_tokenizer, resolve

    _, _, qwen = gguf_config_and_tokenizer(resolve(QWEN_05B))
    assert template_knows_tools(qwen.chat_template)
    past = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    }
    req = parse_chat(
        {
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": "You are a robot."},
                *MSG,
                {"role": "assistant", "content": None, "tool_calls": [past]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'},
                {"role": "tool", "tool_call_id": "call_2", "content": '{"humidity": 40}'},
            ],
        }
    )
    messages, extra = conversation(req.messages, req.tools, True)
    assert extra == {"tools": list(TOOLS)}
    native = qwen.encode_chat(messages, **extra)
    written, none = conversation(req.messages, req.tools, False)
    assert not none and native == qwen.encode_chat(written)


@pytest.mark.parametrize(
    "text, ok, calls",
    [
        ('{"answer":"sunny"}', True, 0),
        ("Sunny.", False, 0),
        (PARIS, True, 1),
        (FENCED, True, 1),
        # a bare object is the content's own form here (compact, as without tools): JSON, no call
        (json.dumps(json.loads(BARE), separators=(",", ":")), True, 0),
    ],
)
def test_auto_with_a_response_format_answers_calls_or_its_json(tok, gtok, text, ok, calls):
    from thor_app.server.openai_api import parse_chat
    from thor_app.server.tool_calls import CallReader, CallShape, auto_forms, tool_grammar

    req = parse_chat({"messages": MSG, "tools": TOOLS, "response_format": {"type": "json_object"}})
    ids = tok.encode(text, add_special=False) + [tok.eos_token_ids[0]]
    assert (tool_grammar(gtok, tok, req).constraint().valid_prefix(ids) == len(ids)) == ok
    if ok:
        reader = CallReader(CallShape("auto", frozenset(SCHEMAS), auto_forms({"type": "object"})))
        reader.push(text)
        reader.finish("", "eos")
        assert len(reader.calls) == calls and (reader.text == text) == (not calls)
