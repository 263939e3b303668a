"""OpenAI tool calls in /v1/chat/completions: the prompt, the grammar, and the answer.

The prompt: the model's own chat template renders the tools and the conversation's past calls
and results where it knows them (Qwen2.5's: a ``tools`` variable, ``tool_calls`` on assistant
turns, a ``tool`` role); for a template that does not (SmolLM2's), the same format is written
into the system turn here, past calls into the assistant turns and results into user turns.

The format is Qwen2.5's (also Hermes'): each call is

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and parallel calls follow one another, a newline apart. ``<tool_call>`` is one token where
the vocabulary has it (the grammar names it as a token), text elsewhere.

The grammar (agent.schema.grammar, llguidance's Lark): with ``tool_choice`` ``required`` one or
more calls (one when ``parallel_tool_calls`` is false), a named function one call of it,
``auto`` either calls or content (text that does not open a call, or the response_format's
JSON), ``none`` content only. Each call's name is one of the tools' and its arguments are JSON
under that function's ``parameters`` schema, written as the template writes JSON (``", "`` and
``": "``, no other whitespace), so the speculative decoder's forced tokens cover the names,
keys and punctuation. A finished generation therefore holds only well-formed calls; one cut
by ``max_tokens`` or a stop string is left out of a non-streamed answer (and ends a stream with
``finish_reason`` ``length`` / ``stop``, as OpenAI's does).

The answer: ``CallReader`` turns the generated text into content and tool calls, all at once
(``completion``) or delta by delta as tokens commit (OpenAI's stream chunks: the call's index,
id, type and name first, then its arguments in fragments); both read the same text the same way.
"""
from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass

from thor_runtime.errors import ThorError

from thor_app.server.errors import bad_request
from thor_app.server.openai_api import ChatRequest, check_max_tokens, completion_body

OPEN, CLOSE = "<tool_call>", "</tool_call>"
HEAD = OPEN + '\n{"name": "'            # a call up to its name
AFTER_NAME = ', "arguments": '            # from the name's closing quote to its arguments
END = "}\n" + CLOSE                      # from the arguments' end to the call's end
NEXT = "\n" + OPEN                        # between parallel calls
# the arguments' JSON as chat templates write it (tojson: json.dumps' separators)
ARGUMENT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CONTENT_JSON = {"whitespace_flexible": False}          # response_format's JSON, as without tools
TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tools}\n"
    "</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')


@dataclass(frozen=True)
class CallShape:
    """What the answer may hold: ``choice`` none (content only), auto, required or function."""
    choice: str = "none"
    names: frozenset = frozenset()

    @property
    def can_call(self) -> bool:
        return self.choice != "none"

    @property
    def calls_only(self) -> bool:
        return self.choice in ("required", "function")


PLAIN = CallShape()


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# ---- the prompt -----------------------------------------------------------------------------
def template_knows_tools(template: str | None) -> bool:
    """A chat template that renders ``tools``, past ``tool_calls`` and the ``tool`` role itself."""
    return bool(template) and "tools" in template and "tool_calls" in template


def _call_text(call: dict) -> str:
    f = call["function"]
    body = json.dumps({"name": f["name"], "arguments": f["arguments"]}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def conversation(messages, tools, native: bool) -> tuple[list[dict], dict]:
    """-> (the messages, the template's extra variables). ``native``: the template renders tools
    itself (``template_knows_tools``); otherwise they are written into the turns here."""
    if native:
        return list(messages), ({"tools": list(tools)} if tools else {})
    out: list[dict] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            text = "\n".join(_call_text(c) for c in m["tool_calls"])
            content = f"{m['content']}\n{text}" if m["content"] else text
            out.append({"role": "assistant", "content": content})
        elif m["role"] == "tool":
            result = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("tool_results"):    # one turn's results: one user turn
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    out = [{"role": m["role"], "content": m["content"]} for m in out]
    if tools:
        listed = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        section = TOOLS_SYSTEM.format(tools=listed)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{section}"}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out, {}


# ---- the grammar ----------------------------------------------------------------------------
def _marker(gtok, tokenizer, text: str) -> str:
    """``text`` in the grammar: the token's name where the vocabulary has it as an atomic
    marker, else the literal string."""
    tid = tokenizer.token_to_id(text)
    if tid is None or tid not in gtok.special_ids:
        return json.dumps(text)
    if tokenizer.decode([tid]) != text:
        raise ThorError(f"this model's tokenizer drops {text} from decoded text: its tool calls "
                        "could not be read back")
    return text


def closed(params: dict) -> dict:
    """A function takes the parameters it declares: a parameters object that lists properties
    and says nothing of others allows no others (JSON Schema would allow any, and a small model
    then invents keys). Nested objects keep JSON Schema's reading."""
    if "properties" in params and not any(k in params for k in (
            "additionalProperties", "patternProperties", "unevaluatedProperties")):
        return {**params, "additionalProperties": False}
    return params


def call_lark(tools, choice: str, name: str | None, parallel: bool, content_schema: dict | None,
              open_: str = json.dumps(OPEN), close: str = json.dumps(CLOSE)) -> str:
    """The Lark grammar of an answer: see the module's docstring. ``open_`` / ``close``: the
    markers as the grammar spells them (``_marker``)."""
    lines = []
    funcs = [t["function"] for t in tools if choice != "function" or t["function"]["name"] == name]
    for i, f in enumerate(funcs):
        head = json.dumps(f'{{"name": "{f["name"]}", "arguments": ')
        schema = {**closed(f["parameters"]), "x-guidance": ARGUMENT_JSON}
        lines.append(f'f{i}: {head} %json {json.dumps(schema)} "}}"')
    alts = " | ".join(f"f{i}" for i in range(len(funcs)))
    lines.append(f'call: {open_} "\\n" ({alts}) "\\n" {close}')
    # a newline may end the calls: the model's own habit before its end of turn
    lines.append('calls: call ("\\n" call)* "\\n"?' if parallel and choice != "function"
                 else 'calls: call "\\n"?')
    if content_schema is not None:
        lines.append(f"content: %json {json.dumps({**content_schema, 'x-guidance': CONTENT_JSON})}")
    else:
        # text that does not open a call; empty too (the model may end at once)
        lines.append("content: TEXT |")
        lines.append("TEXT: /(?s:.+)/ & ~/(?s:[ \\t\\r\\n]*<tool_call>.*)/")
    start = {"required": "calls", "function": "calls", "none": "content"}.get(
        choice, "calls | content")
    return "\n".join([f"start: {start}"] + lines) + "\n"


@functools.lru_cache(maxsize=16)
def _compiled(gtok, lark: str):
    """An agent's requests repeat their tools: their grammar compiles once. A grammar hands out a
    fresh matcher per generation, so one is shared safely."""
    from agent.schema.grammar import Grammar

    return Grammar.from_lark(gtok, lark)


def tool_grammar(gtok, tokenizer, req: ChatRequest):
    """The request's grammar, or a 400 naming the tool whose schema the engine refuses."""
    from agent.schema.grammar import check_schema

    for i, t in enumerate(req.tools):
        try:
            check_schema(t["function"]["parameters"])
        except ThorError as e:
            raise bad_request(f"tools[{i}].function.parameters ({t['function']['name']}): {e}",
                              code="invalid_schema", param="tools") from None
    content = None
    if req.response_format == "json_object":
        content = {"type": "object"}
    elif req.response_format == "json_schema":
        content = req.schema
        try:
            check_schema(content)
        except ThorError as e:
            raise bad_request(str(e), code="invalid_schema", param="response_format") from None
    lark = call_lark(req.tools, req.tool_choice, req.tool_name, req.parallel_tool_calls, content,
                     _marker(gtok, tokenizer, OPEN), _marker(gtok, tokenizer, CLOSE))
    try:
        return _compiled(gtok, lark)
    except ThorError as e:
        raise bad_request(f"the tools cannot be decoded under a grammar: {e}",
                          code="invalid_schema", param="tools") from None


def prepare(host, req: ChatRequest):
    """-> (the host's PreparedChat, the CallShape its answer is read with). Requests without
    tools or tool turns are the host's own (``ModelHost.prepare_chat``)."""
    turns = any(m["role"] == "tool" or m.get("tool_calls") for m in req.messages)
    if not req.tools and not turns:
        return host.prepare_chat(req), PLAIN
    from thor_app.server.host import PreparedChat
    from thor_runtime.engine import SamplingParams

    h, lim, gtok = host.hosted, host.cfg.limits, host.gtok
    tok = h.loaded.tokenizer
    messages, extra = conversation(req.messages, req.tools, template_knows_tools(tok.chat_template))
    try:
        ids = tok.encode_chat(messages, **extra)
    except Exception as e:  # noqa: BLE001 - a chat template may refuse a message order
        raise ThorError(f"messages cannot be rendered by the model's chat template: {e}") from None
    context = h.loaded.cfg.max_position_embeddings
    max_tokens = check_max_tokens(len(ids), req.max_tokens, lim.default_max_tokens, lim.max_tokens,
                                  context)
    params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                            seed=req.seed, stop=req.stop)
    if req.tools:
        grammar = tool_grammar(gtok, tok, req)
    elif req.response_format != "text":     # tool turns, nothing to call now: as without them
        from agent.schema.grammar import Grammar

        schema = req.schema if req.response_format == "json_schema" else {"type": "object"}
        grammar = Grammar(gtok, schema)
    else:
        grammar = None
    names = frozenset(t["function"]["name"] for t in req.tools)
    return PreparedChat(ids, params, grammar), CallShape(req.tool_choice, names)


# ---- the answer -----------------------------------------------------------------------------
class CallReader:
    """Generated text -> content and tool calls, in pieces as they commit: ``push`` returns the
    stream's deltas for each piece, ``finish`` the last ones and the finish reason.

    A call's arguments go out as they come, all but a tail that may be the start of the call's
    end (``END``). Text that does not follow the call format (only possible without the
    grammar) is content from there on.
    """

    def __init__(self, shape: CallShape = PLAIN, new_id=call_id):
        self.shape, self.new_id = shape, new_id
        self.state = "open" if shape.calls_only else ("start" if shape.can_call else "content")
        self.buf = ""
        self.text = ""                  # content
        self.calls: list[dict] = []     # finished, well-formed calls
        self.open_call: dict | None = None

    def push(self, piece: str) -> list[dict]:
        self.buf += piece
        out: list[dict] = []
        while getattr(self, "_" + self.state)(out):
            pass
        return out

    def finish(self, tail: str, reason: str) -> tuple[list[dict], str]:
        """-> (the last deltas, finish_reason). A call left open (cut by max_tokens or a stop
        string) is not among ``calls``."""
        out = self.push(tail)
        if self.state == "start" and self.buf:     # a prefix of <tool_call> and no more
            self.state = "content"
            self._content(out)
        self.buf = ""
        if self.calls and reason == "eos":
            return out, "tool_calls"
        return out, reason

    # -- states: each returns True to run again on what is left ------------------------------
    def _start(self, out) -> bool:
        if OPEN.startswith(self.buf):
            return False                   # may still open a call
        self.state = "open" if self.buf.startswith(OPEN) else "content"
        return True

    def _content(self, out) -> bool:
        if self.buf:
            self.text += self.buf
            out.append({"content": self.buf})
            self.buf = ""
        return False

    def _open(self, out) -> bool:
        b = self.buf
        if len(b) < len(HEAD):
            return self._waits(HEAD.startswith(b))
        if not b.startswith(HEAD):
            return self._waits(False)
        name, quote, after = b[len(HEAD):].partition('"')
        if not quote:
            return self._waits(len(name) <= 64 and all(c.isalnum() or c in "_-" for c in name))
        if len(after) < len(AFTER_NAME):
            return self._waits(AFTER_NAME.startswith(after) and name in self.shape.names)
        if not after.startswith(AFTER_NAME) or name not in self.shape.names:
            return self._waits(False)
        self.open_call = {"id": self.new_id(), "name": name, "arguments": ""}
        opened = {"index": len(self.calls), "id": self.open_call["id"], "type": "function",
                  "function": {"name": name, "arguments": ""}}
        out.append({"tool_calls": [opened]})
        self.buf = after[len(AFTER_NAME):]
        self.state = "arguments"
        return True

    def _waits(self, may_match: bool) -> bool:
        if may_match:
            return False
        self.state = "content"             # not a call after all
        return True

    def _arguments(self, out) -> bool:
        b, call = self.buf, self.open_call
        i = b.find(END)
        keep = 0 if i >= 0 else next((k for k in range(min(len(b), len(END) - 1), 0, -1)
                                      if END.startswith(b[-k:])), 0)
        piece = b[:i] if i >= 0 else b[:len(b) - keep]
        if piece:
            call["arguments"] += piece
            out.append({"tool_calls": [{"index": len(self.calls),
                                        "function": {"arguments": piece}}]})
        self.buf = b[i + len(END):] if i >= 0 else b[len(b) - keep:]
        if i < 0:
            return False
        self.open_call = None
        if _json_object(call["arguments"]):
            self.calls.append({"id": call["id"], "type": "function",
                               "function": {"name": call["name"], "arguments": call["arguments"]}})
        self.state = "between"
        return True

    def _between(self, out) -> bool:
        if NEXT.startswith(self.buf):
            return False
        if self.buf.startswith(NEXT):
            self.buf = self.buf[1:]
            self.state = "open"
        else:
            self.state = "content"
        return True


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def completion(cid: str, model: str, shape: CallShape, res) -> dict:
    """The non-streamed answer of a generation ``res`` read under ``shape``."""
    reader = CallReader(shape)
    reader.push(res.text)
    _, finish = reader.finish("", res.finish_reason)
    body = completion_body(cid, model, reader.text, finish, res.prompt_tokens, len(res.token_ids))
    if reader.calls:
        msg = body["choices"][0]["message"]
        msg["content"] = reader.text or None
        msg["tool_calls"] = reader.calls
    return body
