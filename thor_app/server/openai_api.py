"""OpenAI chat-completions: request checking, response and SSE chunk bodies, incremental text.

Checked strictly (a wrong type is a 400 naming the field, never a 500 later); fields the
runtime cannot honour (logprobs, n > 1, penalties, the legacy ``functions``) are refused rather
than ignored. Unlike OpenAI, ``temperature`` defaults to 0: the same request gives the same
answer. Tools (``tools``, ``tool_choice``, ``parallel_tool_calls``, and the conversation's
assistant tool calls and ``tool`` messages) are checked here; thor_app/server/tool_calls.py
decodes and answers them.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass

from thor_app.server.errors import ApiError, bad_request
from thor_app.server.inputs import (
    CHAT_PRIORITY,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_NODES,
    check_document,
    check_schema_shape,
    check_seed,
    priority,
)

ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
_REFUSED = ("functions", "function_call", "logit_bias", "audio", "modalities")
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
MAX_TOOLS = 128
TOOL_CHOICES = ("none", "auto", "required")
# a function declared without parameters takes none: its arguments are {}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple  # ({"role", "content"}, ...)
    max_tokens: int | None  # None = the configured default (clamped to the context)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    response_format: str = "text"  # text | json_object | json_schema
    schema: dict | None = None  # the json_schema's schema
    priority: int = CHAT_PRIORITY  # queue order (not OpenAI's): higher first
    tools: tuple = ()  # ({"type": "function", "function": {name, parameters}}, ...)
    tool_choice: str = "none"  # none | auto | required | function (the one named tool_name)
    tool_name: str | None = None
    parallel_tool_calls: bool = True

    def __post_init__(self):
        if self.response_format == "json_schema" and not isinstance(self.schema, dict):
            raise bad_request(
                "response_format.json_schema.schema must be an object", param="response_format"
            )


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            if not (
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            ):
                raise bad_request(
                    f"messages[{i}].content: only text parts are supported", param="messages"
                )
            parts.append(p["text"])
        return "".join(parts)
    raise bad_request(
        f"messages[{i}].content must be a string or a list of text parts", param="messages"
    )


def _messages(v) -> tuple:
    if not isinstance(v, list) or not v:
        raise bad_request("messages must be a non-empty array", param="messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                param="messages",
            )
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls not in (None, []):
            # an assistant turn that called tools: its content may be null
            content = "" if m.get("content") is None else _content(m, i)
            out.append(
                {"role": "assistant", "content": content, "tool_calls": _past_calls(calls, i)}
            )
            continue
        msg = {"role": ROLES[role], "content": _content(m, i)}
        if role == "tool":
            tid = m.get("tool_call_id")
            if tid is not None and not isinstance(tid, str):
                raise bad_request(f"messages[{i}].tool_call_id must be a string", param="messages")
            if tid is not None:
                msg["tool_call_id"] = tid
        out.append(msg)
    return tuple(out)


def _past_calls(v, i: int) -> list:
    """An assistant turn's tool_calls, their arguments (a JSON string) read into JSON: chat
    templates write them with ``tojson``."""
    if not isinstance(v, list):
        raise bad_request(f"messages[{i}].tool_calls must be an array", param="messages")
    out = []
    for j, c in enumerate(v):
        where = f"messages[{i}].tool_calls[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(f, dict)
            or c.get("type", "function") != "function"
            or not isinstance(f.get("name"), str)
            or not f["name"]
        ):
            raise bad_request(
                f'{where} must be {{"type": "function", "function": '
                '{{"name", "arguments"}}}}',
                param="messages",
            )
        if c.get("id") is not None and not isinstance(c["id"], str):
            raise bad_request(f"{where}.id must be a string", param="messages")
        args = f.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                raise bad_request(
                    f"{where}.function.arguments is not JSON", param="messages"
                ) from None
        check_document(args, what=f"{where}.function.arguments")
        out.append(
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": f["name"], "arguments": args},
            }
        )
    return out


def _tools(v) -> tuple:
    """The request's function tools, each with a parameters schema (checked for its shape here,
    against the meta-schema and the grammar engine when the request is prepared)."""
    if v is None or v == []:
        return ()
    if not isinstance(v, list) or len(v) > MAX_TOOLS:
        raise bad_request(
            f"tools must be an array of at most {MAX_TOOLS} function tools", param="tools"
        )
    out, seen, nodes = [], set(), 0
    for i, t in enumerate(v):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or t.get("type") != "function":
            raise bad_request(
                f'tools[{i}] must be {{"type": "function", "function": '
                '{{"name", "parameters"?}}}} (only function tools are supported)',
                param="tools",
            )
        name = f.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad_request(
                f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-', got {name!r}",
                param="tools",
            )
        if name in seen:
            raise bad_request(f"tools[{i}]: a second function named {name!r}", param="tools")
        seen.add(name)
        desc = f.get("description")
        if desc is not None and not isinstance(desc, str):
            raise bad_request(f"tools[{i}].function.description must be a string", param="tools")
        if f.get("strict") is not None and not isinstance(f["strict"], bool):
            raise bad_request(f"tools[{i}].function.strict must be a boolean", param="tools")
        params = f.get("parameters")
        if params is None:
            params = NO_PARAMETERS
        if not isinstance(params, dict):
            raise bad_request(
                f"tools[{i}].function.parameters must be a JSON Schema object", param="tools"
            )
        nodes += check_document(params, MAX_SCHEMA_DEPTH, what=f"tools[{i}].function.parameters")
        fn = {
            "name": name,
            **({"description": desc} if desc is not None else {}),
            "parameters": params,
        }
        out.append({"type": "function", "function": fn})
    if nodes > MAX_SCHEMA_NODES:
        raise ApiError(
            400,
            f"the tools' parameters have {nodes} objects and arrays together; the "
            f"most this server compiles is {MAX_SCHEMA_NODES}",
            "schema_too_large",
            "tools",
        )
    return tuple(out)


def _tool_choice(v, tools: tuple) -> tuple[str, str | None]:
    """-> (none | auto | required | function, the named function). Without tools only none and
    auto mean anything (nothing to call); required or a named function is a 400."""
    if v is None:
        return ("auto" if tools else "none"), None
    if isinstance(v, str) and v in TOOL_CHOICES:
        if v == "required" and not tools:
            raise bad_request("tool_choice 'required' needs tools", param="tool_choice")
        return (v if tools else "none"), None
    f = v.get("function") if isinstance(v, dict) else None
    if not (isinstance(f, dict) and v.get("type") == "function" and isinstance(f.get("name"), str)):
        raise bad_request(
            'tool_choice must be "none", "auto", "required" or {"type": "function", '
            '"function": {"name": ...}}',
            param="tool_choice",
        )
    names = [t["function"]["name"] for t in tools]
    if f["name"] not in names:
        raise bad_request(
            f"tool_choice names {f['name']!r}, which is not among the tools "
            f"({', '.join(names) or 'none given'})",
            param="tool_choice",
        )
    return "function", f["name"]


def _stop(v) -> tuple[str, ...]:
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if (
        not isinstance(stops, list)
        or len(stops) > 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise bad_request(
            "stop must be a non-empty string or an array of up to 4 non-empty strings", param="stop"
        )
    return tuple(stops)


def _response_format(v) -> tuple[str, dict | None]:
    if v is None:
        return "text", None
    if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request(
            "response_format.type must be text, json_object or json_schema", param="response_format"
        )
    if v["type"] != "json_schema":
        return v["type"], None
    js = v.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
        raise bad_request(
            "response_format.json_schema must be an object with a `schema` object",
            param="response_format",
        )
    if "name" in js and not isinstance(js["name"], str):
        raise bad_request(
            "response_format.json_schema.name must be a string", param="response_format"
        )
    check_schema_shape(js["schema"], "response_format.json_schema.schema")
    return "json_schema", js["schema"]


def parse_chat(body) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for k in _REFUSED:
        if body.get(k) not in (None, [], {}):
            raise bad_request(
                f"{k} is not supported by this server", code="unsupported_parameter", param=k
            )
    if body.get("logprobs") not in (None, False):
        raise bad_request(
            "logprobs is not supported by this server",
            code="unsupported_parameter",
            param="logprobs",
        )
    for k in ("frequency_penalty", "presence_penalty"):
        if body.get(k) not in (None, 0, 0.0):
            raise bad_request(
                f"{k} is not supported by this server", code="unsupported_parameter", param=k
            )
    if "model" in body and not isinstance(body["model"], str):
        raise bad_request("model must be a string", param="model")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad_request("n must be 1", code="unsupported_parameter", param="n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise bad_request("max_tokens must be a positive integer", param="max_tokens")
    temperature = body.get("temperature", 0.0)
    if temperature is None:
        temperature = 0.0
    if not _is_num(temperature) or not 0 <= temperature <= 2:
        raise bad_request("temperature must be a number in [0, 2]", param="temperature")
    top_p = body.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if not _is_num(top_p) or not 0 < top_p <= 1:
        raise bad_request("top_p must be a number in (0, 1]", param="top_p")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad_request("seed must be a non-negative integer", param="seed")
    check_seed(seed)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise bad_request("stream must be a boolean", param="stream")
    so = body.get("stream_options")
    if so is not None and (
        not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool)
    ):
        raise bad_request(
            "stream_options must be an object with a boolean include_usage", param="stream_options"
        )
    fmt, schema = _response_format(body.get("response_format"))
    tools = _tools(body.get("tools"))
    choice, name = _tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    return ChatRequest(
        _messages(body.get("messages")),
        max_tokens,
        float(temperature),
        float(top_p),
        seed,
        _stop(body.get("stop")),
        bool(stream),
        bool(so and so.get("include_usage")),
        fmt,
        schema,
        priority(body, CHAT_PRIORITY),
        tools,
        choice,
        name,
        parallel is not False,
    )


# ---- responses ------------------------------------------------------------------------------
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    cid: str, model: str, text: str, finish: str, prompt_tokens: int, completion_tokens: int
) -> dict:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": FINISH.get(finish, finish),
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def chunk_body(
    cid: str,
    model: str,
    created: int,
    delta: dict | None,
    finish: str | None = None,
    usage_: dict | None = None,
    include_usage: bool = False,
) -> dict:
    body = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": []
        if delta is None
        else [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": FINISH.get(finish, finish),
            }
        ],
    }
    if include_usage:
        body["usage"] = usage_
    return body


class TextStreamer:
    """Committed tokens -> text deltas that never need taking back.

    Holds back an incomplete UTF-8 character (a trailing U+FFFD) and, with stop strings, the
    last ``max(len(stop)) - 1`` characters, which may be the start of a stop string that the
    final text will cut off. ``finish(text)`` returns what is left of the final text.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tok, self.ids, self.sent = tokenizer, [], ""
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        text = self.tok.decode(self.ids)
        text = text.rstrip("\ufffd")
        safe = text[: len(text) - self.hold] if self.hold else text
        for s in self.stop:  # the token that completes a stop string may carry text past it
            i = text.find(s)
            if 0 <= i < len(safe):
                safe = text[:i]
        if len(safe) > len(self.sent) and safe.startswith(self.sent):
            delta, self.sent = safe[len(self.sent) :], safe
            return delta
        return ""

    def finish(self, final_text: str) -> str:
        if final_text.startswith(self.sent):
            return final_text[len(self.sent) :]
        return ""


def check_max_tokens(
    prompt_tokens: int, requested: int | None, default: int, cap: int, context: int
) -> int:
    """The request's token budget, or a 400 when prompt + max_tokens cannot fit the context."""
    room = context - prompt_tokens
    if requested is None:
        if room < 1:
            raise ApiError(
                400,
                f"the prompt has {prompt_tokens} tokens; the model's context is {context}",
                "context_length_exceeded",
                "messages",
            )
        return min(default, room)
    if requested > cap:
        raise bad_request(
            f"max_tokens {requested} exceeds this server's limit of {cap}", param="max_tokens"
        )
    if prompt_tokens + requested > context:
        raise ApiError(
            400,
            f"prompt ({prompt_tokens} tokens) + max_tokens ({requested}) exceeds the model's "
            f"context of {context} tokens",
            "context_length_exceeded",
            "max_tokens",
        )
    return requested
