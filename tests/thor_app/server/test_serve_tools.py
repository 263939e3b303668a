"""Tool calls in /v1/chat/completions, through the official `openai` client and LangChain's
`ChatOpenAI(...).bind_tools(...)` against the service on loopback.

Where the grammar decides (tool_choice required or a named function) the tiny random model
decodes for real, plainly and speculatively: whatever it picks is a well-formed call under its
function's schema. Where the model decides (auto) a scripted runtime answers, each of its
tokens committed through the request's grammar, so a scripted answer the grammar refuses fails
the test; the real models' choices are the slow tests at the end."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.helpers.serving import config, hosted_loader, is_error_body, passing, wait_health
from tests.helpers.tool_calls import FENCED, MSG, PARIS, PUSH, SCHEMAS, TOOLS, Scripted
from thor_app.server.app import make_app
from thor_app.server.host import Hosted
from thor_runtime.speculative import PLAIN

pytestmark = pytest.mark.asyncio


@pytest.fixture
def start(aiohttp_client, tiny_llama_long):
    async def go(loaded=None, spec="none", script=None, **tables):
        loaded = loaded or tiny_llama_long
        if script is not None:
            hosted = Hosted(loaded, script, PLAIN)
            loader = lambda cfg: hosted  # noqa: E731
        else:
            loader = hosted_loader(loaded, spec)
        app = make_app(config(**tables), loader=loader, selftest=passing, watchdog_s=None)
        client = await aiohttp_client(app)
        status, body = await wait_health(client)
        assert status == 200, body
        return client

    return go


def openai_client(client):
    openai = pytest.importorskip("openai")
    return openai.AsyncOpenAI(
        base_url=str(client.make_url("/v1")), api_key="sk-local", max_retries=0
    )


def chat_model(client, **kw):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="default",
        base_url=str(client.make_url("/v1")),
        api_key="sk-local",
        max_retries=0,
        temperature=0,
        **kw,
    )


async def ask(oc, **kw):
    """One non-streamed answer's first choice (MSG and TOOLS unless given)."""
    kw = {"model": "default", "messages": MSG, "tools": TOOLS, **kw}
    return (await oc.chat.completions.create(**kw)).choices[0]


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def pairs(calls) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in calls]


def check_calls(calls, names=SCHEMAS):
    """Every call names a tool; its arguments are a JSON string valid under the tool's schema."""
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in names, c
        jsonschema.validate(json.loads(c.function.arguments), names[c.function.name])


async def streamed(oc, **kw):
    """-> (content, {index: {"id", "name", "arguments"}}, finish_reason, chunks) of a stream."""
    kw = {"model": "default", "messages": MSG, "tools": TOOLS, **kw}
    stream = await oc.chat.completions.create(stream=True, **kw)
    content, calls, finish, chunks = "", {}, None, []
    async for chunk in stream:
        chunks.append(chunk)
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or ():
            c = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id is not None:
                assert c["id"] is None, "a call's id comes once"
                c["id"], c["name"] = tc.id, tc.function.name
            else:
                assert c["id"] is not None and tc.function.name is None, "the name first, alone"
            c["arguments"] += tc.function.arguments or ""
        finish = ch.finish_reason or finish
    return content, calls, finish, chunks


# ---- the grammar decides: real decoding on the tiny model ----------------------------------
@pytest.mark.parametrize("spec", ["none", "ngram"])
async def test_required_and_named_calls_are_well_formed_plain_and_speculative(start, spec):
    choices = ("required", named("push_object"))
    oc = openai_client(await start(spec=spec))
    outs = []
    for choice in choices:
        ch = await ask(oc, tool_choice=choice, max_tokens=120, parallel_tool_calls=False)
        assert ch.finish_reason == "tool_calls" and ch.message.content is None, ch
        assert len(ch.message.tool_calls) == 1
        check_calls(ch.message.tool_calls)
        if isinstance(choice, dict):
            assert ch.message.tool_calls[0].function.name == "push_object"
        outs.append(pairs(ch.message.tool_calls))
    await oc.close()
    if spec == "ngram":  # speculation never changes the answer
        oc = openai_client(await start(spec="none"))
        for choice, want in zip(choices, outs):
            ch = await ask(oc, tool_choice=choice, max_tokens=120, parallel_tool_calls=False)
            assert pairs(ch.message.tool_calls) == want
        await oc.close()


async def test_no_malformed_call_when_sampling_hard(start):
    """Sampling at temperature 2 from a random model tries paths the grammar leaves open: every
    call answered is valid under its schema, and an answer cut by max_tokens lists none of its
    unfinished call (parallel calls may go on to the limit: a random model rarely stops)."""
    oc = openai_client(await start())
    calls = 0
    for seed in range(6):
        ch = await ask(
            oc,
            tool_choice="required",
            max_tokens=160,
            temperature=2.0,
            seed=seed,
            parallel_tool_calls=seed % 2 == 0,
        )
        assert ch.finish_reason in ("tool_calls", "length"), ch
        assert ch.finish_reason == "length" or ch.message.tool_calls
        check_calls(ch.message.tool_calls or [])
        calls += len(ch.message.tool_calls or [])
    assert calls >= 4
    await oc.close()


async def test_streamed_call_is_the_answered_call(start):
    oc = openai_client(await start())
    kw = dict(tool_choice="required", max_tokens=120, parallel_tool_calls=False)
    want = pairs((await ask(oc, **kw)).message.tool_calls)
    content, calls, finish, chunks = await streamed(oc, **kw)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == want
    # the arguments come in fragments
    assert sum(bool(ch.choices and ch.choices[0].delta.tool_calls) for ch in chunks) > 2
    # the client's own stream helper puts the chunks together the same way
    async with oc.chat.completions.stream(model="default", messages=MSG, tools=TOOLS, **kw) as s:
        final = await s.get_final_completion()
    assert pairs(final.choices[0].message.tool_calls) == want
    await oc.close()


async def test_strict_pydantic_tool_is_parsed_by_the_client(start):
    openai = pytest.importorskip("openai")
    from pydantic import BaseModel, Field

    class GetWeather(BaseModel):
        city: str = Field(max_length=6)
        days: int = Field(ge=1, le=3)

    oc = openai_client(await start())
    r = await oc.chat.completions.parse(
        model="default",
        messages=MSG,
        max_tokens=160,
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice=named("GetWeather"),
    )
    args = r.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(args, GetWeather) and 1 <= args.days <= 3
    await oc.close()


# ---- the model decides: a scripted runtime, every token through the grammar ----------------
async def test_auto_answers_a_call_or_content(start, tiny_llama_long):
    script = Scripted(tiny_llama_long.tokenizer, [PARIS, "It is sunny in Paris."])
    oc = openai_client(await start(script=script))
    r = await ask(oc)
    assert r.finish_reason == "tool_calls" and r.message.content is None
    assert r.message.tool_calls[0].function.name == "get_weather"
    args = json.loads(r.message.tool_calls[0].function.arguments)
    assert args == {"city": "Paris", "unit": "celsius"}
    r = await ask(oc, tool_choice="auto")
    assert r.finish_reason == "stop" and r.message.content == "It is sunny in Paris."
    assert not r.message.tool_calls
    # the tools reach the prompt: this model's template has no tools variable: the system turn
    assert '"name": "get_weather"' in script.prompts[0] and "<tools>" in script.prompts[0]
    await oc.close()


async def test_auto_reads_a_fenced_call_as_a_call(start, tiny_llama_long):
    script = Scripted(tiny_llama_long.tokenizer, [FENCED, FENCED])
    oc = openai_client(await start(script=script))
    r = await ask(oc)
    assert r.finish_reason == "tool_calls" and r.message.content is None
    (call,) = r.message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    content, calls, finish, _ = await streamed(oc)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == pairs(r.message.tool_calls)
    await oc.close()


async def test_parallel_calls_answered_and_streamed(start, tiny_llama_long):
    two = PARIS + "\n" + PUSH
    oc = openai_client(await start(script=Scripted(tiny_llama_long.tokenizer, [two, two])))
    r = await ask(oc)
    assert r.finish_reason == "tool_calls"
    assert [c.function.name for c in r.message.tool_calls] == ["get_weather", "push_object"]
    check_calls(r.message.tool_calls)
    assert len({c.id for c in r.message.tool_calls}) == 2
    content, calls, finish, _ = await streamed(oc)
    assert finish == "tool_calls" and content == "" and sorted(calls) == [0, 1]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == pairs(r.message.tool_calls)
    await oc.close()


async def test_tool_choice_none_answers_content_with_the_tools_in_the_prompt(
    start, tiny_llama_long
):
    script = Scripted(tiny_llama_long.tokenizer, ["I would ask for the weather."])
    oc = openai_client(await start(script=script))
    content, calls, finish, _ = await streamed(oc, tool_choice="none")
    assert content == "I would ask for the weather." and not calls and finish == "stop"
    assert "<tools>" in script.prompts[0]
    await oc.close()


async def test_a_conversation_with_past_calls_and_results(start, tiny_llama_long):
    """The client sends the call back with its result; a template without tool turns gets them
    written as the format's text (the call in the assistant turn, the result in a user turn)."""
    script = Scripted(tiny_llama_long.tokenizer, [PARIS, "It is 18 degrees in Paris."])
    oc = openai_client(await start(script=script))
    first = (await ask(oc)).message
    call = first.tool_calls[0]
    history = MSG + [
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'},
    ]
    r = await ask(oc, messages=history)
    assert r.message.content == "It is 18 degrees in Paris." and r.finish_reason == "stop"
    assert PARIS in script.prompts[1]
    assert '<tool_response>\n{"temperature": 18}\n</tool_response>' in script.prompts[1]
    await oc.close()


async def test_langchain_bind_tools(start, tiny_llama_long):
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str, unit: str) -> str:
        """The weather in a city, in celsius or fahrenheit."""
        return "18"

    script = Scripted(tiny_llama_long.tokenizer, [PARIS, PARIS, "It is 18 degrees."])
    bound = chat_model(await start(script=script)).bind_tools([get_weather])
    question = HumanMessage("What is the weather in Paris?")
    ai = await bound.ainvoke([question])
    paris = {"city": "Paris", "unit": "celsius"}
    assert ai.tool_calls == [
        {"name": "get_weather", "args": paris, "id": ai.tool_calls[0]["id"], "type": "tool_call"}
    ]
    chunks = None
    async for chunk in bound.astream([question]):
        chunks = chunk if chunks is None else chunks + chunk
    assert [(c["name"], c["args"]) for c in chunks.tool_calls] == [("get_weather", paris)]
    call = ai.tool_calls[0]
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    final = await bound.ainvoke([question, ai, result])
    assert final.content == "It is 18 degrees." and not final.tool_calls


async def test_langchain_bind_tools_named_choice_decodes_for_real(start):
    from pydantic import BaseModel, Field

    class PushObject(BaseModel):
        """Push an object sideways."""

        object: str = Field(json_schema_extra={"enum": ["red_cup", "blue_box"]})
        dx_cm: int = Field(ge=-20, le=20)

    llm = chat_model(await start(), max_tokens=80)
    ai = await llm.bind_tools([PushObject], tool_choice="PushObject").ainvoke("push the cup left")
    (call,) = ai.tool_calls
    assert call["name"] == "PushObject" and call["args"]["object"] in ("red_cup", "blue_box")
    assert -20 <= call["args"]["dx_cm"] <= 20


# ---- bad requests: 400 with OpenAI's error body, never a 5xx --------------------------------
def fn(**f) -> list:
    return [{"type": "function", "function": f}]


@pytest.mark.parametrize(
    "extra, param, words",
    [
        (
            {"tools": fn(name="f", parameters={"type": "array", "uniqueItems": True})},
            "tools",
            "uniqueItems",
        ),
        (
            {"tools": fn(name="f", parameters={"type": "nonsense"})},
            "tools",
            "not a valid JSON Schema",
        ),
        ({"tools": fn(name="f", parameters=[1])}, "tools", "JSON Schema"),
        ({"tools": fn(name="bad name")}, "tools", "letters"),
        ({"tools": fn(name="f") * 2}, "tools", "second function"),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools", "only function tools"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
        ({"tools": TOOLS, "tool_choice": named("fly")}, "tool_choice", "not among the tools"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
        ({"functions": [{"name": "f"}]}, "functions", "not supported"),
    ],
)
async def test_bad_tools_and_tool_choice_are_400(start, extra, param, words):
    client = await start()
    r = await client.post("/v1/chat/completions", json={"messages": MSG, **extra})
    body = await r.json()
    assert r.status == 400 and is_error_body(body), body
    assert body["error"]["param"] == param and words in body["error"]["message"], body


async def test_bad_schema_is_a_400_through_the_client(start):
    openai = pytest.importorskip("openai")
    oc = openai_client(await start())
    x = {"type": "string", "format": "no-such-format", "uniqueItems": True, "minItems": "2"}
    bad = fn(name="f", parameters={"type": "object", "properties": {"x": x}})
    with pytest.raises(openai.BadRequestError) as e:
        await ask(oc, tools=bad)
    assert e.value.status_code == 400 and e.value.body["param"] == "tools"
    past = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
    with pytest.raises(openai.BadRequestError) as e:
        await ask(oc, messages=MSG + [{"role": "assistant", "tool_calls": [past]}], tools=None)
    assert "not JSON" in e.value.message
    await oc.close()


# ---- the real models ---------------------------------------------------------------------------
@pytest.mark.slow
async def test_the_planner_model_picks_the_tool_or_answers(start):
    """Qwen2.5-Coder-0.5B, tool_choice auto: it calls the weather tool for the weather (it writes
    calls as a fenced JSON block) and answers a joke in text, where its own JSON names no tool."""
    from tests.helpers.pulled import QWEN_05B, pulled_or_skip

    pulled_or_skip(QWEN_05B)
    from thor_runtime.loading import load

    oc = openai_client(await start(load(QWEN_05B), spec="auto"))
    weather = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    ch = await ask(oc, messages=weather, max_tokens=96)
    assert ch.finish_reason == "tool_calls", ch
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    joke = [{"role": "user", "content": "Tell me a joke about robots."}]
    ch = await ask(oc, messages=joke, max_tokens=64)
    assert not ch.message.tool_calls and ch.message.content, ch
    await oc.close()


@pytest.mark.slow
async def test_the_default_model_calls_under_the_grammar(start, default_model):
    """SmolLM2-135M, whose template knows no tools: where the grammar decides, a valid call."""
    oc = openai_client(await start(default_model))
    ch = await ask(oc, tool_choice="required", parallel_tool_calls=False, max_tokens=96)
    assert ch.finish_reason == "tool_calls", ch
    check_calls(ch.message.tool_calls)
    await oc.close()


@pytest.mark.parametrize("mode", ["grammar", "plain"])
async def test_the_tools_bench_gives_its_peer_the_services_own_prompt(start, tiny_llama_long, mode):
    """`thor bench --tools` renders each entry's prompt for llama.cpp itself; it must be the
    prompt the service decodes for the same request, token for token."""
    from thor_app.tools.bench_tools import prompt_ids, request_body

    entry = {
        "id": "simple_0",
        "question": [[{"role": "user", "content": "What is the weather in Paris?"}]],
        "function": [
            {
                "name": "weather.get",
                "description": "The weather in a city.",
                "parameters": {
                    "type": "dict",
                    "properties": {"city": {"type": "string", "description": "The city."}},
                    "required": ["city"],
                },
            }
        ],
    }
    script = Scripted(tiny_llama_long.tokenizer, ["It is sunny."])
    client = await start(script=script)
    r = await client.post("/v1/chat/completions", json=request_body("default", mode, entry, 8))
    assert r.status == 200, await r.text()
    tok = tiny_llama_long.tokenizer
    ids = prompt_ids(tok, "default", mode, entry)
    assert tok.decode(ids, skip_special=False) == script.prompts[0]
    assert (await r.json())["usage"]["prompt_tokens"] == len(ids)
    assert "weather_get" in script.prompts[0]
