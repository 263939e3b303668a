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
JSON), ``none`` content only. With ``auto`` a call may also be written as models write them
besides their template's format (``FORMS``: a fenced ```json block, a bare object), as the
planner model, Qwen2.5-Coder-0.5B, does: text that opens one with a tool's name is that call;
with another name it is content. Each call's name is one of the tools' and its arguments are JSON
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

from thor_app.server.errors import bad_request
from thor_app.server.openai_api import ChatRequest, check_max_tokens, completion_body
from thor_runtime.errors import ThorError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
WS = None  # in a form's parts: optional whitespace
# The forms a call is read in, each as parts up to its name, between its name and its arguments,
# and after them. "tagged" is the template's; "fenced" and "bare" are how models also write calls
# (Qwen2.5-Coder's answers, as a fenced JSON block), read where tool_choice is auto.
FORMS = {
    "tagged": ((OPEN, "\n", '{"name": "'), ('", "arguments": ',), ("}\n" + CLOSE,)),
    "fenced": (
        ("```json", WS, "{", WS, '"name"', WS, ":", WS, '"'),
        ('"', WS, ",", WS, '"arguments"', WS, ":", WS),
        (WS, "}", WS, "```"),
    ),
    "bare": (
        ("{", WS, '"name"', WS, ":", WS, '"'),
        ('"', WS, ",", WS, '"arguments"', WS, ":", WS),
        (WS, "}"),
    ),
}
SPACE = " \t\r\n"
# the arguments' JSON as chat templates write it (tojson: json.dumps' separators); in the other
# forms as the model lays it out
ARGUMENT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
FREE_JSON = {"whitespace_flexible": True}
CONTENT_JSON = {"whitespace_flexible": False}  # response_format's JSON, as without tools
TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tools}\n"
    "</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass(frozen=True)
class CallShape:
    """What the answer may hold: ``choice`` none (content only), auto, required or function."""

    choice: str = "none"
    names: frozenset = frozenset()
    forms: tuple = ("tagged",)  # the forms calls are read in (auto: the others too)

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
            if out and out[-1].get("tool_results"):  # one turn's results: one user turn
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
        raise ThorError(
            f"this model's tokenizer drops {text} from decoded text: its tool calls "
            "could not be read back"
        )
    return text


def closed(params: dict) -> dict:
    """A function takes the parameters it declares: a parameters object that lists properties
    and says nothing of others allows no others (JSON Schema would allow any, and a small model
    then invents keys). Nested objects keep JSON Schema's reading."""
    if "properties" in params and not any(
        k in params for k in ("additionalProperties", "patternProperties", "unevaluatedProperties")
    ):
        return {**params, "additionalProperties": False}
    return params


def auto_forms(content_schema: dict | None) -> tuple:
    """The forms an auto answer's calls may take: a bare object is content's own form where
    the answer may be JSON."""
    return ("tagged", "fenced") if content_schema is not None else tuple(FORMS)


def call_lark(
    tools,
    choice: str,
    name: str | None,
    parallel: bool,
    content_schema: dict | None,
    open_: str = json.dumps(OPEN),
    close: str = json.dumps(CLOSE),
) -> str:
    """The Lark grammar of an answer: see the module's docstring. ``open_`` / ``close``: the
    markers as the grammar spells them (``_marker``). With ``auto`` a call may also be written
    fenced or bare (``FORMS``): text that opens one with a tool's name is that call."""
    w = "[ \\t\\r\\n]"
    lines = []
    funcs = [t["function"] for t in tools if choice != "function" or t["function"]["name"] == name]
    others = auto_forms(content_schema)[1:] if choice == "auto" else ()
    for i, f in enumerate(funcs):
        head = json.dumps(f'{{"name": "{f["name"]}", "arguments": ')
        params = closed(f["parameters"])
        tagged = json.dumps({**params, "x-guidance": ARGUMENT_JSON})
        lines.append(f'f{i}: {head} %json {tagged} "}}"')
        free = json.dumps({**params, "x-guidance": FREE_JSON})
        if "fenced" in others:  # one lexeme up to the name: where content stops being possible
            lines.append(f'FENCED{i}: /```json{w}*\\{{{w}*"name"{w}*:{w}*"{f["name"]}"/')
            lines.append(f"fenced{i}: FENCED{i} MID %json {free} FENCE_END")
        if "bare" in others:
            lines.append(f'BARE{i}: /\\{{{w}*"name"{w}*:{w}*"{f["name"]}"/')
            lines.append(f"bare{i}: BARE{i} MID %json {free} BARE_END")
    alts = " | ".join(f"f{i}" for i in range(len(funcs)))
    lines.append(f'call: {open_} "\\n" ({alts}) "\\n" {close}')
    # a newline may end the calls: the model's own habit before its end of turn
    lines.append(
        'calls: call ("\\n" call)* "\\n"?'
        if parallel and choice != "function"
        else 'calls: call "\\n"?'
    )
    start = {"required": "calls", "function": "calls", "none": "content"}.get(
        choice, "calls | content"
    )
    opens = ["<tool_call>"]
    if others:
        lines.append(f'MID: /{w}*,{w}*"arguments"{w}*:{w}*/')
        lines.append(f"SPACE: /{w}+/")
        names = "|".join(f["name"] for f in funcs)
        if "fenced" in others:
            lines.append(f"FENCE_END: /{w}*\\}}{w}*```/")
            lines.append("fenced: " + " | ".join(f"fenced{i}" for i in range(len(funcs))))
            lines.append(
                "fenced_calls: fenced (SPACE fenced)* SPACE?"
                if parallel
                else "fenced_calls: fenced SPACE?"
            )
            start += " | fenced_calls"
            opens.append(f'```json{w}*\\{{{w}*"name"{w}*:{w}*"({names})"')
        if "bare" in others:
            lines.append(f"BARE_END: /{w}*\\}}/")
            lines.append("bare: " + " | ".join(f"bare{i}" for i in range(len(funcs))) + " SPACE?")
            start += " | bare"
            opens.append(f'\\{{{w}*"name"{w}*:{w}*"({names})"')
    if content_schema is not None:
        lines.append(f"content: %json {json.dumps({**content_schema, 'x-guidance': CONTENT_JSON})}")
    else:
        # text that does not open a call; empty too (the model may end at once)
        lines.append("content: TEXT |")
        lines.append(f"TEXT: /(?s:.+)/ & ~/(?s:{w}*({'|'.join(opens)}).*)/")
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
            raise bad_request(
                f"tools[{i}].function.parameters ({t['function']['name']}): {e}",
                code="invalid_schema",
                param="tools",
            ) from None
    content = None
    if req.response_format == "json_object":
        content = {"type": "object"}
    elif req.response_format == "json_schema":
        content = req.schema
        try:
            check_schema(content)
        except ThorError as e:
            raise bad_request(str(e), code="invalid_schema", param="response_format") from None
    lark = call_lark(
        req.tools,
        req.tool_choice,
        req.tool_name,
        req.parallel_tool_calls,
        content,
        _marker(gtok, tokenizer, OPEN),
        _marker(gtok, tokenizer, CLOSE),
    )
    try:
        return _compiled(gtok, lark)
    except ThorError as e:
        raise bad_request(
            f"the tools cannot be decoded under a grammar: {e}",
            code="invalid_schema",
            param="tools",
        ) from None


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
    max_tokens = check_max_tokens(
        len(ids), req.max_tokens, lim.default_max_tokens, lim.max_tokens, context
    )
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=req.stop,
    )
    if req.tools:
        grammar = tool_grammar(gtok, tok, req)
    elif req.response_format != "text":  # tool turns, nothing to call now: as without them
        from agent.schema.grammar import Grammar

        schema = req.schema if req.response_format == "json_schema" else {"type": "object"}
        grammar = Grammar(gtok, schema)
    else:
        grammar = None
    names = frozenset(t["function"]["name"] for t in req.tools)
    content = {"type": "object"} if req.response_format != "text" else None
    forms = auto_forms(content) if req.tool_choice == "auto" else ("tagged",)
    return PreparedChat(ids, params, grammar), CallShape(req.tool_choice, names, forms)


# ---- the answer -----------------------------------------------------------------------------
class CallReader:
    """Generated text -> content and tool calls, in pieces as they commit: ``push`` returns the
    stream's deltas for each piece, ``finish`` the last ones and the finish reason.

    A call opens in one of the shape's forms (``FORMS``) at the start of the answer, and again
    after the last one ends; its id and name go out once its name is read, its arguments as
    they come, all but trailing whitespace, which may lie past their end. Text that does not
    follow a form (only possible without the grammar) is content from there on.
    """

    def __init__(self, shape: CallShape = PLAIN, new_id=call_id):
        self.shape, self.new_id = shape, new_id
        self.state = "start" if shape.can_call else "content"
        self.buf = ""
        self.text = ""  # content
        self.calls: list[dict] = []  # finished, well-formed calls
        self.form: str | None = None
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
        if self.state == "start" and self.buf and not self.shape.calls_only:
            self.state = "content"  # the start of a form and no more
            self._content(out)
        self.buf = ""
        if self.calls and reason == "eos":
            return out, "tool_calls"
        return out, reason

    # -- states: each returns True to run again on what is left ------------------------------
    def _start(self, out) -> bool:
        """A call's opening, in any of the shape's forms (after the last call: in its form)."""
        forms = self.shape.forms if self.form is None else (self.form,)
        waiting = False
        for form in forms:
            got, end, name = self._opening(form)
            if got == "full":
                self.form, self.buf = form, self.buf[end:]
                self.open_call = {"id": self.new_id(), "name": name, "arguments": ""}
                out.append(
                    {
                        "tool_calls": [
                            {
                                "index": len(self.calls),
                                "id": self.open_call["id"],
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
                self.state = "mid"
                return True
            waiting |= got == "partial"
        if waiting:
            return False
        self.state = "content" if self.form is None else "trailing"
        return True

    def _opening(self, form: str) -> tuple[str, int, str | None]:
        """-> ("full" | "partial" | "no", where the opening ends, the name): the form's parts,
        a tool's name, its closing quote."""
        got, i = _parts(FORMS[form][0], self.buf, 0)
        if got != "full":
            return got, i, None
        j = self.buf.find('"', i)
        name = self.buf[i:] if j < 0 else self.buf[i:j]
        if j < 0:
            may = any(n.startswith(name) for n in self.shape.names)
            return ("partial" if may else "no"), i, None
        return ("full" if name in self.shape.names else "no"), j, name

    def _mid(self, out) -> bool:
        got, i = _parts(FORMS[self.form][1], self.buf, 0)
        if got == "partial":
            return False
        if got == "no":
            return self._junk()
        self.buf, self.state = self.buf[i:], "arguments"
        return True

    def _arguments(self, out) -> bool:
        call, b = self.open_call, self.buf
        end = _json_end(b)
        sent = len(call["arguments"])
        upto = end if end is not None else len(b.rstrip(SPACE))
        if upto > sent:
            piece = b[sent:upto]
            call["arguments"] += piece
            out.append(
                {"tool_calls": [{"index": len(self.calls), "function": {"arguments": piece}}]}
            )
        if end is None:
            return False
        self.buf, self.state = b[end:], "end"
        return True

    def _end(self, out) -> bool:
        got, i = _parts(FORMS[self.form][2], self.buf, 0)
        if got == "partial":
            return False
        if got == "no":
            return self._junk()
        call, self.open_call = self.open_call, None
        if _json_object(call["arguments"]):
            self.calls.append(
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            )
        self.buf, self.state = self.buf[i:], "between"
        return True

    def _between(self, out) -> bool:
        rest = self.buf.lstrip(SPACE)
        if not rest:
            return False
        self.buf, self.state = rest, "start"
        return True

    def _trailing(self, out) -> bool:
        """Text after the calls that opens no other (only without the grammar): not read."""
        self.buf = ""
        return False

    def _junk(self) -> bool:
        """A call that breaks off its form (only without the grammar): the rest is not read."""
        self.open_call, self.state = None, "trailing"
        return True

    def _content(self, out) -> bool:
        if self.buf:
            self.text += self.buf
            out.append({"content": self.buf})
            self.buf = ""
        return False


def _parts(parts, text: str, i: int) -> tuple[str, int]:
    """Match ``parts`` (literals, ``WS`` for optional whitespace) at ``text[i:]`` -> ("full",
    the end) | ("partial", ...) when the text ends inside them | ("no", ...)."""
    for p in parts:
        if p is WS:
            while i < len(text) and text[i] in SPACE:
                i += 1
            if i == len(text):
                return "partial", i
            continue
        chunk = text[i : i + len(p)]
        if chunk != p:
            return ("partial" if p.startswith(chunk) and i + len(chunk) == len(text) else "no"), i
        i += len(p)
    return "full", i


def _json_end(text: str) -> int | None:
    """Where the JSON value at the start of ``text`` ends, None while it may go on."""
    if not text:
        return None
    if text[0] not in '{["':
        for i, ch in enumerate(text):
            if ch in SPACE + ",}]":
                return i
        return None
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
                if depth == 0:
                    return i + 1
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


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
