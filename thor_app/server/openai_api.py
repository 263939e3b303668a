"""OpenAI chat-completions: request checking, response and SSE chunk bodies, incremental text.

Checked strictly (a wrong type is a 400 naming the field, never a 500 later); fields the
runtime cannot honour (tools, logprobs, n > 1, penalties) are refused rather than ignored.
Unlike OpenAI, ``temperature`` defaults to 0: the same request gives the same answer.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from thor_app.server.errors import ApiError, bad_request
from thor_app.server.inputs import CHAT_PRIORITY, check_schema_shape, check_seed, priority

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_REFUSED = ("tools", "functions", "tool_choice", "function_call", "logit_bias", "audio", "modalities")


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple                   # ({"role", "content"}, ...)
    max_tokens: int | None            # None = the configured default (clamped to the context)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    response_format: str = "text"     # text | json_object | json_schema
    schema: dict | None = None        # the json_schema's schema
    priority: int = CHAT_PRIORITY     # queue order (not OpenAI's): higher first

    def __post_init__(self):
        if self.response_format == "json_schema" and not isinstance(self.schema, dict):
            raise bad_request("response_format.json_schema.schema must be an object", param="response_format")


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
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise bad_request(f"messages[{i}].content: only text parts are supported", param="messages")
            parts.append(p["text"])
        return "".join(parts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts", param="messages")


def _messages(v) -> tuple:
    if not isinstance(v, list) or not v:
        raise bad_request("messages must be a non-empty array", param="messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}", param="messages")
        out.append({"role": ROLES[role], "content": _content(m, i)})
    return tuple(out)


def _stop(v) -> tuple[str, ...]:
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("stop must be a non-empty string or an array of up to 4 non-empty strings", param="stop")
    return tuple(stops)


def _response_format(v) -> tuple[str, dict | None]:
    if v is None:
        return "text", None
    if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("response_format.type must be text, json_object or json_schema", param="response_format")
    if v["type"] != "json_schema":
        return v["type"], None
    js = v.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
        raise bad_request("response_format.json_schema must be an object with a `schema` object",
                          param="response_format")
    if "name" in js and not isinstance(js["name"], str):
        raise bad_request("response_format.json_schema.name must be a string", param="response_format")
    check_schema_shape(js["schema"], "response_format.json_schema.schema")
    return "json_schema", js["schema"]


def parse_chat(body) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for k in _REFUSED:
        if body.get(k) not in (None, [], {}):
            raise bad_request(f"{k} is not supported by this server", code="unsupported_parameter", param=k)
    if body.get("logprobs") not in (None, False):
        raise bad_request("logprobs is not supported by this server", code="unsupported_parameter", param="logprobs")
    for k in ("frequency_penalty", "presence_penalty"):
        if body.get(k) not in (None, 0, 0.0):
            raise bad_request(f"{k} is not supported by this server", code="unsupported_parameter", param=k)
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
    if so is not None and (not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool)):
        raise bad_request("stream_options must be an object with a boolean include_usage", param="stream_options")
    fmt, schema = _response_format(body.get("response_format"))
    return ChatRequest(_messages(body.get("messages")), max_tokens, float(temperature), float(top_p), seed,
                       _stop(body.get("stop")), bool(stream), bool(so and so.get("include_usage")), fmt, schema,
                       priority(body, CHAT_PRIORITY))


# ---- responses ------------------------------------------------------------------------------
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(cid: str, model: str, text: str, finish: str, prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": FINISH.get(finish, finish)}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk_body(cid: str, model: str, created: int, delta: dict | None, finish: str | None = None,
               usage_: dict | None = None, include_usage: bool = False) -> dict:
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": None,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                                   "finish_reason": FINISH.get(finish, finish)}]}
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
        safe = text[:len(text) - self.hold] if self.hold else text
        for s in self.stop:   # the token that completes a stop string may carry text past it
            i = text.find(s)
            if 0 <= i < len(safe):
                safe = text[:i]
        if len(safe) > len(self.sent) and safe.startswith(self.sent):
            delta, self.sent = safe[len(self.sent):], safe
            return delta
        return ""

    def finish(self, final_text: str) -> str:
        if final_text.startswith(self.sent):
            return final_text[len(self.sent):]
        return ""


def check_max_tokens(prompt_tokens: int, requested: int | None, default: int, cap: int, context: int) -> int:
    """The request's token budget, or a 400 when prompt + max_tokens cannot fit the context."""
    room = context - prompt_tokens
    if requested is None:
        if room < 1:
            raise ApiError(400, f"the prompt has {prompt_tokens} tokens; the model's context is {context}",
                           "context_length_exceeded", "messages")
        return min(default, room)
    if requested > cap:
        raise bad_request(f"max_tokens {requested} exceeds this server's limit of {cap}", param="max_tokens")
    if prompt_tokens + requested > context:
        raise ApiError(400, f"prompt ({prompt_tokens} tokens) + max_tokens ({requested}) exceeds the model's "
                       f"context of {context} tokens", "context_length_exceeded", "max_tokens")
    return requested
