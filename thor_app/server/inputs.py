"""Checks every request body passes before any route reads it, and the schema shape limits.

Each limit here stands in front of a failure that used to surface as a 500 from deep inside:
Python's JSON parser and ``jsonschema`` recurse (a body of ~1,000 nested ``[`` or a schema nested
150 levels ends in ``RecursionError``), and a lone UTF-16 surrogate such as ``"\\ud800"`` is
valid JSON but not encodable as UTF-8, which the tokenizer and the grammar engine both need.
Catching them on the event loop, before the job is queued, keeps a bad request from costing a
queue slot. The walk is iterative, so the check itself cannot overflow the stack.
"""

from __future__ import annotations

import json

from thor_app.server.errors import ApiError, bad_request

MAX_DEPTH = 64  # arrays/objects inside one another in a body (a plan's world is ~5 deep)
MAX_SCHEMA_DEPTH = 32  # subschemas inside one another
MAX_SCHEMA_NODES = 4096  # objects and arrays in one schema: the grammar compile grows with it
SEED_LIMIT = 2**64  # what torch.Generator.manual_seed takes
# Queue order: a higher priority is served first. Plans default above chat, so a robot's replan
# overtakes an operator's queued chat; a caller may say otherwise.
PRIORITIES = range(0, 10)
PLAN_PRIORITY, CHAT_PRIORITY = 5, 0


def parse_body(raw: bytes):
    """Bytes -> a JSON document, or a 400 naming what is wrong with it."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise bad_request(
            f"the JSON body nests deeper than {MAX_DEPTH} levels", code="invalid_json"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"malformed JSON body: {e}", code="invalid_json") from None
    check_document(doc)
    return doc


def check_document(doc, max_depth: int = MAX_DEPTH, what: str = "the JSON body") -> int:
    """Raise a 400 when ``doc`` nests deeper than ``max_depth`` or holds a string (key or value)
    that is not valid Unicode text. Returns the number of objects and arrays in it."""
    stack, nodes = [(doc, 1, "")], 0
    while stack:
        v, depth, path = stack.pop()
        if isinstance(v, str):
            _check_text(v, path, what)
        elif isinstance(v, (dict, list)):
            nodes += 1
            if depth > max_depth:
                raise bad_request(
                    f"{what} nests deeper than {max_depth} levels (at {path or 'top level'})",
                    code="too_deep",
                )
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str):
                    _check_text(k, path, what)
                stack.append((x, depth + 1, f"{path}/{k}"))
    return nodes


def _check_text(s: str, path: str, what: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(
            f"{what} holds a string that is not valid Unicode (a lone surrogate) at "
            f"{path or 'top level'}",
            code="invalid_string",
        ) from None


def check_schema_shape(schema, param: str) -> None:
    """Depth and size limits of a JSON Schema, checked before ``jsonschema`` or the grammar
    engine sees it (both recurse, and the compile's time grows with the schema)."""
    nodes = check_document(schema, MAX_SCHEMA_DEPTH, what=f"{param}")
    if nodes > MAX_SCHEMA_NODES:
        raise ApiError(
            400,
            f"{param} has {nodes} objects and arrays; the most this server compiles is "
            f"{MAX_SCHEMA_NODES}",
            "schema_too_large",
            param,
        )


def priority(body: dict, default: int) -> int:
    v = body.get("priority")
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v not in PRIORITIES:
        raise bad_request(
            f"priority must be an integer in [{PRIORITIES[0]}, {PRIORITIES[-1]}] (higher is served "
            "first)",
            param="priority",
        )
    return v


def check_seed(seed) -> None:
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise bad_request(f"seed must be an integer in [0, 2**64 - 1], got {seed}", param="seed")
