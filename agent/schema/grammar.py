"""JSON-schema grammar constraint over llguidance.

Why llguidance: its matcher rolls back consumed tokens exactly (``rollback(n)``), which is
exactly what checking K drafts and masking K+1 verify rows needs; it hands out forced tokens
already tokenized canonically (``compute_ff_tokens``) and its masks allow only those, so forced
drafts are certain to be accepted; a per-request schema compiles in tens of milliseconds and a
mask costs ~0.03 ms on CPU (49k vocab); it names unsupported JSON-schema keywords instead of
silently ignoring them; and it is one 7.6 MB Rust wheel with no Python dependencies (nothing
to build on a Jetson), already a runtime dependency.

The grammar always works on the *tokenizer's* vocabulary; the model's logits may be wider
(padded embedding rows), and those ids are never legal.
"""

from __future__ import annotations

import functools
import json
import re

import jsonschema
import llguidance as llg
import numpy as np
import torch

from agent.schema.free_text import FreeTextTracker
from thor_runtime.engine import Constraint, masked
from thor_runtime.errors import ThorError

# Compact JSON: no free whitespace means fewer tokens to decode and more of them forced.
_JSON_OPTIONS = {"whitespace_flexible": False}
THINK_TOKENS = ("<think>", "</think>")
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[(.*?)\]")


# ---- schema checks (no tokenizer needed: run before any model is loaded) ----------------------
def _find_keyword(node, key: str, path: str = "") -> str | None:
    """JSON pointer of the first place ``key`` is used as a keyword (not as a property name)."""
    if isinstance(node, dict):
        if key in node:
            return path or "/"
        for k, v in node.items():
            if k in ("properties", "$defs", "definitions", "patternProperties") and isinstance(
                v, dict
            ):
                for name, sub in v.items():
                    hit = _find_keyword(sub, key, f"{path}/{k}/{name}")
                    if hit:
                        return hit
            elif k not in ("enum", "const", "default", "examples"):
                hit = _find_keyword(v, key, f"{path}/{k}")
                if hit:
                    return hit
    elif isinstance(node, list):
        for i, v in enumerate(node):
            hit = _find_keyword(v, key, f"{path}/{i}")
            if hit:
                return hit
    return None


def _engine_error(message: str, schema: dict) -> ThorError:
    m = _UNIMPLEMENTED.search(message)
    if m:
        keys = [k.strip().strip('"') for k in m.group(1).split(",") if k.strip()]
        where = ", ".join(f"'{k}' (at {_find_keyword(schema, k) or '?'})" for k in keys)
        return ThorError(
            f"unsupported schema keyword {where}: the grammar engine (llguidance) cannot "
            "enforce it; remove it or express it with supported keywords"
        )
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    if "oneOf" in message:
        first = "oneOf whose branches may overlap is not supported; use anyOf"
    return ThorError(f"schema cannot be compiled to a grammar: {first}")


def _with_options(schema: dict) -> dict:
    if schema.get("x-guidance") is not None:
        return schema
    return {**schema, "x-guidance": dict(_JSON_OPTIONS)}


def check_schema(schema) -> None:
    """Raise ThorError unless ``schema`` is valid JSON Schema 2020-12 the engine fully supports."""
    if not isinstance(schema, dict):
        raise ThorError(f"a schema must be a JSON object, got {type(schema).__name__}")
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ThorError(f"a schema must be plain JSON: {e}") from None
    _check_text(text)


@functools.lru_cache(maxsize=64)
def _check_text(text: str) -> None:
    """check_schema of one schema's JSON text, remembered when it passes: a plan request's
    schema is its world's and skills', the same from request to request, and checking it
    against the meta-schema took ~0.16 s of Python (the service's other requests wait on it)."""
    schema = json.loads(text)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(x) for x in e.absolute_path) or "top level"
        raise ThorError(f"not a valid JSON Schema (2020-12): {e.message} (at {where})") from None
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(_with_options(schema))
        is_err, msgs = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    except ValueError as e:  # e.g. an integer past 64 bits
        raise _engine_error(str(e), schema) from None
    if is_err:
        raise _engine_error(msgs[0] if msgs else "", schema)


# ---- tokenizer view ---------------------------------------------------------------------------
class _TokenSource:
    """The duck type llguidance.TokenizerWrapper reads: raw token bytes, eos/bos, specials,
    encode."""

    def __init__(self, tokenizer, token_bytes: list[bytes], special_ids: list[int]):
        self._tok = tokenizer
        self.tokens = token_bytes
        self.eos_token_id = tokenizer.eos_token_ids[0]
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self.special_token_ids = special_ids

    def __call__(self, text):
        if isinstance(text, bytes):
            raise TypeError(
                "str only"
            )  # TokenizerWrapper probes with bytes, then falls back to str
        return self._tok.encode(text, add_special=False)


def _special_ids(tokenizer, n: int) -> list[int]:
    """Ids the grammar must treat as atomic markers rather than text: every added token.

    Our Tokenizer has no public accessor for added tokens yet; fall back to the wrapped
    `tokenizers` object (read-only use)."""
    ids = getattr(tokenizer, "special_token_ids", None)
    if ids is None:
        inner = getattr(tokenizer, "_tok", None)
        ids = list(inner.get_added_tokens_decoder()) if inner is not None else []
    ids = set(int(i) for i in ids) | set(tokenizer.eos_token_ids)
    for name in THINK_TOKENS:
        tid = tokenizer.token_to_id(name)
        if tid is not None:
            ids.add(tid)
    return sorted(i for i in ids if 0 <= i < n)


class GrammarTokenizer:
    """llguidance's tokenizer for one of ours. Walks the whole vocabulary (0.1-1 s): build once
    per tokenizer and share it across requests."""

    def __init__(self, tokenizer):
        if not tokenizer.eos_token_ids:
            raise ThorError(
                "the tokenizer has no end-of-sequence token; constrained decoding needs one"
            )
        tb = tokenizer.token_bytes()
        self.token_bytes = tb  # what a committed token writes (GrammarConstraint's stop)
        self.n_vocab = len(tb)
        self.eos_ids = tuple(int(i) for i in tokenizer.eos_token_ids)
        specials = _special_ids(tokenizer, len(tb))
        self.special_ids = frozenset(specials)  # atomic markers: a grammar names them <like_this>
        src = _TokenSource(tokenizer, tb, specials)
        self.ll = llg.LLTokenizer(llg.TokenizerWrapper(src), eos_token=list(self.eos_ids))
        b, e = (tokenizer.token_to_id(t) for t in THINK_TOKENS)
        self.think_ids = (b, e) if b is not None and e is not None else None


class Grammar:
    """A compiled grammar for one request: the schema's JSON, optionally preceded by a
    ``<think>...</think>`` span (thinking models only). ``constraint()`` hands out a fresh
    matcher per generation."""

    def __init__(
        self,
        gtok: GrammarTokenizer,
        schema: dict,
        thinking: bool = False,
        think_max_chars: int = 2000,
    ):
        check_schema(schema)
        self.gtok, self.schema = gtok, schema
        self.thinking = bool(thinking and gtok.think_ids)
        if self.thinking:
            # Thinking text is free (bounded so it terminates); special tokens can't occur in it,
            # so </think> is the only way out, and the JSON after it is fully constrained.
            lark = (
                f"start: thinking? plan\n"
                f'thinking: <think> THINK </think> "\\n"?\n'
                f"THINK: /(?s:.){{0,{int(think_max_chars)}}}/\n"
                f"plan: %json {json.dumps(_with_options(schema))}\n"
            )
            self.text = llg.LLMatcher.grammar_from_lark(lark)
        else:
            self.text = llg.LLMatcher.grammar_from_json_schema(_with_options(schema))
        self._pristine = llg.LLMatcher(gtok.ll, self.text, log_level=0)
        if self._pristine.is_error():
            raise _engine_error(self._pristine.get_error(), schema)

    @classmethod
    def from_lark(cls, gtok: GrammarTokenizer, lark: str) -> "Grammar":
        """A grammar written in llguidance's Lark, JSON schemas inside it as ``%json {...}``
        (check each with ``check_schema`` first: its errors name the keyword). The service's
        tool calls: content or calls, each call's arguments under its function's schema."""
        self = cls.__new__(cls)
        self.gtok, self.schema, self.thinking = gtok, None, False
        try:
            self.text = llg.LLMatcher.grammar_from_lark(lark)
        except ValueError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "unknown error"
            raise ThorError(f"grammar cannot be compiled: {first}") from None
        self._pristine = llg.LLMatcher(gtok.ll, self.text, log_level=0)
        if self._pristine.is_error():
            raise ThorError(f"grammar cannot be compiled: {self._pristine.get_error().strip()}")
        return self

    def constraint(self, stop=None, free_text: tuple[str, ...] = ()) -> "GrammarConstraint":
        """stop: a solver.GoalStop, asked when the plan's steps open (its goal is written) and as
        each later step opens: True ends the plan there (see GrammarConstraint). free_text:
        top-level keys whose string value no consumer reads (the plan's ``rationale``):
        ``relaxed_spans`` names the drafts inside them; none by default, so a caller's own
        schema is never relaxed."""
        return GrammarConstraint(self._pristine.deep_copy(), self.gtok, stop, free_text)


class GrammarConstraint(Constraint):
    """The runtime's Constraint over one llguidance matcher. The matcher always sits at the state
    after the committed tokens; draft checks and row masks advance it and roll back exactly.

    EOS never reaches the matcher: llguidance keeps no history entry for an EOS taken in a stopped
    state, so consuming it would make rollback counts ambiguous. EOS is legal exactly where the
    matcher reports an accepting state, and ends the walk over drafts.

    A ``stop`` check is asked once, when the committed text first opens the steps: the goal is
    written before them, and a goal that already shows the task cannot be done (too heavy, out
    of reach, a thing or set this world lacks) needs no steps. From then on only EOS is legal,
    so the plan ends in a token or two instead of decoding steps to the budget. A check that
    then holds a ``step_cap`` (solver.GoalStop: the solver reaches the goal) ends the plan the
    same way when the model opens more steps than that, or opens a step after ones that
    already do the goal or repeat a call (``stop.step_opened``).

    Drafts are checked the same way (``_walk``, asking the check without keeping its answer), so
    the row after a draft that ends the plan allows only EOS, as the committed token would: a
    cycle never commits past the end, and speculative output stays the plain decoding's.
    """

    STEPS = b'"steps":['
    STEP = b'"skill":'  # once per step object

    def __init__(self, matcher, gtok: GrammarTokenizer, stop=None, free_text: tuple[str, ...] = ()):
        self.m, self.gtok = matcher, gtok
        self.eos = frozenset(gtok.eos_ids)
        self.finished = False  # EOS committed
        self.stop, self.cut, self.text = stop, False, bytearray()
        self.step_cap, self.steps = None, 0  # set when the stop check leaves a cap on the steps
        # only when asked for: tracking costs a little Python per committed byte
        self.free = (
            FreeTextTracker.for_keys(gtok.token_bytes, free_text, self.eos, gtok.think_ids)
            if free_text
            else None
        )

    # -- queries that leave the state unchanged ------------------------------------------------
    def forced(self) -> list[int]:
        if self.finished or self.cut or self.m.is_stopped():
            return []
        return list(self.m.compute_ff_tokens())

    def valid_prefix(self, drafts: list[int]) -> int:
        return self._walk(drafts, lambda j: None)

    def mask_rows(self, logits: torch.Tensor, drafts: list[int]) -> torch.Tensor:
        """logits [R, V] -> [R, V] with -inf where illegal; row j is masked by the state after
        drafts[:j] (``allowed_rows``)."""
        return masked(logits, self.allowed_rows(drafts, *logits.shape))

    def allowed_rows(self, drafts: list[int], rows: int, width: int) -> np.ndarray:
        """[rows, width] bool: row j the ids legal after drafts[:j]. Rows past a draft the
        grammar refuses (or past EOS) repeat the last row: the accept step never reads them,
        but they must not be all -inf either (NaN probabilities)."""
        # numpy for the per-row work: many tiny torch ops cost more than the masks themselves.
        allowed = np.zeros((rows, width), dtype=np.bool_)  # [R, V]
        filled = []

        def fill(j: int) -> None:
            if j < rows:
                allowed[j] = self._allowed(width)
                filled.append(j)

        self._walk(list(drafts)[: rows - 1], fill)
        for j in range(len(filled), rows):
            allowed[j] = allowed[j - 1] if j else self._allowed(width)
        return allowed

    def is_accepting(self) -> bool:
        return not self.finished and (self.cut or bool(self.m.is_accepting()))

    def relaxed_spans(self, drafts: list[int]) -> list[bool]:
        """Per draft: wholly inside the string value of a ``free_text`` key
        (agent/schema/free_text.py)."""
        if self.free is None:
            return [False] * len(drafts)
        return self.free.spans(drafts)

    # -- the only state change: a committed token ------------------------------------------------
    def advance(self, token: int) -> None:
        t = int(token)
        if self.finished:
            raise RuntimeError(f"token {t} committed after end-of-sequence")
        if t in self.eos:
            if not (self.cut or self.m.is_accepting()):
                raise RuntimeError("end-of-sequence committed where the grammar is incomplete")
            self.finished = True
        elif self.cut:
            raise RuntimeError(
                f"token {t} committed after the plan ended (only end-of-sequence is legal)"
            )
        elif not self.m.consume_token(t):
            raise RuntimeError(f"grammar refused committed token {t}: {self.m.get_error()}")
        else:
            self._track(t, keep=True)
        if self.free is not None:
            self.free.advance(t)  # EOS writes nothing there

    # -- helpers -------------------------------------------------------------------------------
    def _track(self, t: int, keep: bool) -> None:
        """The stop check's part of consuming token ``t`` (not EOS): its bytes, the steps opened,
        and whether the plan ends here. ``keep=False`` (a draft, ``_walk``) asks the check
        without changing it, so the masks after a draft foresee the end committing it makes."""
        if self.stop is None or self.cut:
            return
        tb = self.gtok.token_bytes[t] if t < len(self.gtok.token_bytes) else b""
        self.text += tb
        if self.step_cap is not None:
            # a marker ending in this token's bytes: the window cannot hold one counted before
            if self.STEP in self.text[-(len(tb) + len(self.STEP) - 1) :]:
                self.steps += 1
                if self.steps > self.step_cap or (
                    self.steps > 1
                    and self.stop.step_opened(self.text.decode("utf-8", "replace"), keep=keep)
                ):
                    self.cut, self.stop = True, None
        elif self.STEPS in self.text[-len(self.STEPS) - 16 :]:
            text = self.text.decode("utf-8", "replace")
            self.cut = bool(self.stop(text, keep=keep))
            self.step_cap = None if self.cut else self.stop.step_cap_for(text)
            if self.step_cap is None:
                self.stop = None  # asked once

    def _walk(self, drafts: list[int], at_row) -> int:
        """Advance over the legal prefix of ``drafts``, calling ``at_row(j)`` at each state j
        (before draft j, and after the last legal one), then roll back to where we started.
        Returns the legal prefix length."""
        if self.finished:
            return 0
        consumed = n = 0
        # the stop check's state: drafts advance it as committing them would, then it goes back
        saved = (len(self.text), self.steps, self.step_cap, self.stop, self.cut)
        try:
            for j, t in enumerate(drafts):
                at_row(j)
                t = int(t)
                if self.cut:  # ended (before the walk or by a draft): only EOS from here
                    return n + (t in self.eos)
                if t in self.eos:
                    n += bool(self.m.is_accepting())
                    return n  # nothing follows EOS; no row after it is ever read
                if not (0 <= t < self.gtok.n_vocab) or self.m.try_consume_tokens([t]) != 1:
                    return n
                consumed += 1
                n += 1
                self._track(t, keep=False)
            at_row(len(drafts))
            return n
        finally:
            del self.text[saved[0] :]
            self.steps, self.step_cap, self.stop, self.cut = saved[1:]
            if consumed and not self.m.rollback(consumed):
                raise RuntimeError(
                    f"grammar rollback of {consumed} tokens failed: {self.m.get_error()}"
                )

    def _allowed(self, width: int) -> np.ndarray:
        """[width] bool of legal next ids: the matcher's mask, EOS exactly where it accepts."""
        out = np.zeros(width, dtype=np.bool_)
        if self.cut:
            out[[i for i in self.gtok.eos_ids if i < width]] = True
            return out
        n = min(width, self.gtok.n_vocab)
        bits = np.unpackbits(
            np.frombuffer(self.m.compute_bitmask(), dtype=np.uint8), bitorder="little"
        )
        out[:n] = bits[:n]
        eos = [i for i in self.gtok.eos_ids if i < width]
        out[eos] = bool(self.m.is_accepting())
        if not out.any():
            out[eos] = True  # a dead state cannot be reached through masks; never leave a row empty
        return out
