"""Where a plan document holds free text no executor reads: the value string of a top-level key
such as ``rationale``.

The gate, the symbolic run and the robot read the goal and the steps; ``task`` and ``plan_id`` are
checked and echoed. A rationale is read by people only, so its exact wording may follow a close
runner-up of the target model (relaxed acceptance) without changing what the robot does. This
module answers, token by token, whether the text is inside such a value.

The grammar guarantees the text is valid compact JSON, so a small byte-level state machine
suffices: a stack of open containers, whether a string is open (and whether it is a key), the
last top-level key. Bytes inside ``<think>...</think>`` (a thinking span before the JSON) are
skipped by token id, as the grammar treats those tokens as atomic markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# The plan's top-level string fields whose wording no executor reads.
PLAN_FREE_TEXT = ("rationale",)

_OPEN = {ord("{"): "o", ord("["): "a"}
_CLOSE = (ord("}"), ord("]"))
_QUOTE, _ESCAPE, _COMMA, _COLON = ord('"'), ord("\\"), ord(","), ord(":")


@dataclass(frozen=True)
class _Pos:
    """The position after some text. Frozen: a draft walk starts from the committed one."""

    stack: tuple[str, ...] = ()  # open containers, "o" object / "a" array
    thinking: bool = False  # inside <think>...</think>: no JSON yet
    in_string: bool = False
    escape: bool = False  # the previous string byte was an unescaped backslash
    is_key: bool = False  # the open string is an object key
    want_key: bool = False  # in an object, the next string is a key
    key: bytes = b""  # the top-level key being read, or the last one read
    free: bool = False  # the open string is a free-text value


@dataclass
class FreeTextTracker:
    """Tracks the committed text of one generation; ``spans(drafts)`` says which drafts lie wholly
    inside a free-text value (neither the quote that opens it nor the one that closes it)."""

    token_bytes: list[bytes]
    keys: frozenset[bytes]
    skip: frozenset[int] = frozenset()  # ids that write no JSON (EOS)
    think_ids: tuple[int, int] | None = None
    pos: _Pos = field(default_factory=_Pos)

    @classmethod
    def for_keys(cls, token_bytes: list[bytes], keys, skip=(), think_ids=None) -> "FreeTextTracker":
        return cls(token_bytes, frozenset(k.encode() for k in keys), frozenset(skip), think_ids)

    def advance(self, token: int) -> None:
        self.pos = self._step(self.pos, int(token))[0]

    def spans(self, drafts: list[int]) -> list[bool]:
        out, pos = [], self.pos
        for t in drafts:
            pos, inside = self._step(pos, int(t))
            out.append(inside)
        return out

    # -- helpers -------------------------------------------------------------------------------
    def _step(self, pos: _Pos, t: int) -> tuple[_Pos, bool]:
        """-> (the position after token t, whether every byte of t was free text)."""
        if self.think_ids is not None and t in self.think_ids:
            return replace(pos, thinking=t == self.think_ids[0]), False
        if pos.thinking or t in self.skip or not 0 <= t < len(self.token_bytes):
            return pos, False
        data = self.token_bytes[t]
        inside = bool(data)
        for b in data:
            # a byte is free text when its string is free and it is not the closing quote
            inside = inside and pos.free and (pos.escape or b != _QUOTE)
            pos = _byte(pos, b, self.keys)
        return pos, inside


def _byte(p: _Pos, b: int, keys: frozenset[bytes]) -> _Pos:
    if p.in_string:
        if p.escape:
            return replace(
                p, escape=False, key=p.key + bytes([b]) if p.is_key and len(p.stack) == 1 else p.key
            )
        if b == _ESCAPE:
            return replace(p, escape=True)
        if b == _QUOTE:
            return replace(p, in_string=False, is_key=False, free=False)
        if p.is_key and len(p.stack) == 1:
            return replace(p, key=p.key + bytes([b]))
        return p
    top = p.stack[-1] if p.stack else ""
    if b in _OPEN:
        return replace(p, stack=p.stack + (_OPEN[b],), want_key=_OPEN[b] == "o")
    if b in _CLOSE:
        return replace(p, stack=p.stack[:-1], want_key=False)
    if b == _COMMA:
        return replace(p, want_key=top == "o")
    if b == _COLON:
        return replace(p, want_key=False)
    if b == _QUOTE:
        if top == "o" and p.want_key:
            # a top-level key is read afresh; a nested one leaves the top-level key as it was
            return replace(p, in_string=True, is_key=True, key=b"" if len(p.stack) == 1 else p.key)
        return replace(
            p, in_string=True, is_key=False, free=len(p.stack) == 1 and top == "o" and p.key in keys
        )
    return p  # numbers, literals, whitespace


def trailing_free_text(schema: dict, keys=PLAN_FREE_TEXT) -> tuple[str, ...]:
    """Those of ``keys`` that end the schema's top-level properties as plain strings. The grammar
    writes properties in schema order, so these come after everything an executor reads (the
    goal, the steps): their wording cannot reach the executed plan through its context. A custom
    schema with a ``rationale`` before the steps gets none."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return ()
    tail = []
    for name in reversed(list(props)):
        sub = props[name]
        if name not in keys or not isinstance(sub, dict) or sub.get("type") != "string":
            break
        tail.append(name)
    return tuple(reversed(tail))


def drop_free_text(text: str, keys) -> tuple[str, bool]:
    """``text`` (a plan's compact JSON) without its top-level ``keys`` members -> (text, cut):
    cut is True when the text ended inside such a member (the token budget ran out in it); the
    object is then closed after the members before it. Any other text comes back as it is.

    Why: how long and how worded a rationale is must not decide anything an executor sees, so
    the planner reads a plan cut in its rationale as whole, and shows a repair prompt the
    rejected plan without it."""
    data, kset = text.encode("utf-8"), frozenset(k.encode() for k in keys)
    if not kset:
        return text, False
    pos, keep, at = _Pos(), bytearray(), 0
    member = sep = None  # where the current free member starts; the last top-level comma
    key_at = 0  # where the top-level key being read starts (its comma, if any)
    for i, b in enumerate(data):
        top = len(pos.stack) == 1 and not pos.in_string
        if top and b == _COMMA and member is None:
            sep = i
        elif top and b == _QUOTE and pos.want_key:
            key_at = sep if sep is not None else i
        elif top and b in (_COMMA, _CLOSE[0]) and member is not None:
            # a first member takes the comma after it along; a later one the comma before it
            end = i + 1 if b == _COMMA and data[member] != _COMMA else i
            keep += data[at:member]
            at, member = end, None
            sep = i if b == _COMMA and end == i else None
        before = pos
        pos = _byte(pos, b, kset)
        if (
            before.in_string
            and before.is_key
            and not before.escape
            and b == _QUOTE
            and len(pos.stack) == 1
            and pos.key in kset
        ):
            member = key_at
    if member is not None:  # ended inside a free member: close the object before it
        return (bytes(keep + data[at:member]) + b"}").decode("utf-8", "replace"), True
    if at == 0:
        return text, False
    return bytes(keep + data[at:]).decode("utf-8", "replace"), False
