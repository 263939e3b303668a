"""Relaxed acceptance in a plan's free text (its rationale) and nowhere else.

The claim: with ``RelaxedConfig.spans`` the relaxed rule keeps a draft only where it lies wholly
inside the value of a top-level free-text key, and the plan an executor runs (goal, steps,
arguments) is the one strict decoding gives.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

from agent.files.loader import base_plan_schema
from agent.planner.planner import Planner
from agent.schema.free_text import FreeTextTracker, drop_free_text, trailing_free_text
from agent.schema.grammar import Grammar
from agent.schema.specialize import specialize
from agent.symbolic.executor import execute, parse_goal
from tests.helpers.runtimes import BudgetRuntime, ScriptedRuntime
from tests.helpers.worlds import good_plan, world_and_skills
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.speculative import SpecOptions, Speculation, build_speculation
from thor_runtime.speculative.accept import RelaxedConfig, accept_relaxed_at, in_thinking
from thor_runtime.speculative.base import Proposer

KEYS = ("rationale",)
SPANS = RelaxedConfig(None, None, spans=True)
_STEPS = {
    "type": "array",
    "items": {"enum": ["pick", "place", "wait"]},
    "minItems": 1,
    "maxItems": 3,
}
_WHY = {"type": "string", "minLength": 8, "maxLength": 40}
# rationale last, as in the plan schema; and first, where its wording is context for the steps
LAST = {
    "type": "object",
    "properties": {"task": {"type": "string", "maxLength": 12}, "steps": _STEPS, "rationale": _WHY},
    "required": ["task", "steps", "rationale"],
    "additionalProperties": False,
}
FIRST = {
    "type": "object",
    "properties": {"rationale": _WHY, "task": {"type": "string", "maxLength": 12}, "steps": _STEPS},
    "required": ["rationale", "task", "steps"],
    "additionalProperties": False,
}


# ---- the position tracker, on one-byte tokens ------------------------------------------------
def marks(text: str) -> str:
    """'^' under each byte the tracker calls free text."""
    tb = [bytes([i]) for i in range(256)]
    flags = FreeTextTracker.for_keys(tb, KEYS).spans(list(text.encode()))
    return "".join("^" if f else "." for f in flags)


def test_tracker_marks_only_the_top_level_rationale_value():
    text = (
        '{"plan_id":"rationale","task":"a rationale","goal":[{"missing":"rationale"}],'
        '"steps":[{"id":"s1","args":{"rationale":"x"},"notes":["rationale"]}],'
        '"rationale":"why \\"so\\", ok"}'
    )
    got = marks(text)
    start = text.index('"rationale":"why') + len('"rationale":"')
    assert (
        got == "." * start + "^" * (len(text) - 2 - start) + ".."
    )  # the closing quote and brace are not


def test_tracker_judges_whole_tokens():
    tb = [bytes([i]) for i in range(256)] + [b'":"', b"ok", b'ay"}', b'\\"']
    opens, word, closes, esc = 256, 257, 258, 259
    head = list(b'{"steps":[],"rationale')
    tr = FreeTextTracker.for_keys(tb, KEYS)
    # the token that opens the value and the one that closes it are outside; an escape is inside
    assert tr.spans(head + [opens, word, esc, word, closes]) == [False] * len(head) + [
        False,
        True,
        True,
        True,
        False,
    ]
    for t in head + [opens]:
        tr.advance(t)
    assert tr.spans([word, closes]) == [True, False]
    assert tr.spans([word]) == [True]  # asking leaves the state where it was


def test_tracker_skips_the_thinking_span():
    b, e = 256, 257
    tb = [bytes([i]) for i in range(256)] + [b"<think>", b"</think>"]
    tr = FreeTextTracker.for_keys(tb, KEYS, think_ids=(b, e))
    think = list(b'{"rationale":"x') + [ord('"')]
    plan = list(b'\n{"steps":[],"rationale":"yes"}')
    flags = tr.spans([b] + think + [e] + plan)
    assert not any(flags[: len(think) + 2])
    assert [chr(t) for t, f in zip(plan, flags[len(think) + 2 :]) if f] == list("yes")


def test_trailing_free_text_is_the_plan_schemas_rationale_only():
    base = base_plan_schema()
    assert trailing_free_text(base) == KEYS
    w, s = world_and_skills("kitchen")
    assert trailing_free_text(specialize(base, w, s)) == KEYS
    assert trailing_free_text(LAST) == KEYS and trailing_free_text(FIRST) == ()
    other = copy.deepcopy(base)
    other["properties"]["rationale"] = {"type": "array", "items": {"type": "string"}}
    assert trailing_free_text(other) == () and trailing_free_text({}) == ()


@pytest.mark.parametrize(
    "text, out, cut",
    [
        ('{"a":1,"b":[2],"rationale":"x, \\"y\\""}', '{"a":1,"b":[2]}', False),
        ('{"rationale":"x","b":{"rationale":"z"}}', '{"b":{"rationale":"z"}}', False),
        ('{"a":1,"b":2,"rationale":"hel', '{"a":1,"b":2}', True),
        ('{"a":1,"b":2,"rationale":"hello"', '{"a":1,"b":2}', True),
        ('{"a":1,"b":[2,', '{"a":1,"b":[2,', False),
        ('{"a":"rationale"}', '{"a":"rationale"}', False),
    ],
)
def test_drop_free_text(text, out, cut):
    assert drop_free_text(text, KEYS) == (out, cut)
    assert drop_free_text(text, ()) == (text, False)


# ---- the acceptance rule -----------------------------------------------------------------------
def test_relaxed_config_needs_a_span():
    with pytest.raises(ThorError, match="neither"):
        RelaxedConfig(None, None)
    with pytest.raises(ThorError, match="both"):
        RelaxedConfig(6, None, spans=True)
    assert not in_thinking([1, 2, 3], SPANS)


def test_relaxed_rule_applies_only_to_flagged_drafts():
    logits = torch.zeros(4, 8)
    logits[torch.arange(4), torch.tensor([1, 2, 3, 0])] = 3.0
    logits[torch.arange(4), torch.tensor([4, 5, 6, 7])] = 2.0  # close runners-up
    drafts = torch.tensor([4, 5, 6])
    assert accept_relaxed_at(logits, drafts, [True, True, True], SPANS) == (3, [4, 5, 6, 0], 3)
    assert accept_relaxed_at(logits, drafts, [True, False, True], SPANS) == (1, [4, 2], 1)
    assert accept_relaxed_at(logits, drafts, [False] * 3, SPANS) == (0, [1], 0)


# ---- with the grammar on the tiny tokenizer ----------------------------------------------------
def span_of(gtok, ids: list[int]) -> list[bool]:
    """Per token: its bytes lie inside the top-level rationale's value, read from the finished
    text (an oracle apart from the tracker: the value's bounds by plain search)."""
    spans = [
        gtok.token_bytes[t] if t < len(gtok.token_bytes) and t not in gtok.eos_ids else b""
        for t in ids
    ]
    data = b"".join(spans)
    key = data.find(
        b'"rationale":"', 1 if data.startswith(b'{"rationale"') else data.rfind(b',"rationale":"')
    )
    start = key + len(b'"rationale":"')
    end = start
    while data[end : end + 1] != b'"':
        end += 2 if data[end : end + 1] == b"\\" else 1
    out, at = [], 0
    for s in spans:
        out.append(bool(s) and start <= at and at + len(s) <= end)
        at += len(s)
    return out


def test_constraint_names_the_rationale_drafts(tok, gtok):
    text = '{"task":"a rationale","steps":["pick","wait"],"rationale":"because \\"pick\\" first"}'
    ids = tok.encode(text, add_special=False) + [gtok.eos_ids[0]]
    want = span_of(gtok, ids)
    assert any(want)
    g = Grammar(gtok, LAST)
    c, none = g.constraint(free_text=KEYS), g.constraint()
    assert c.valid_prefix(ids) == len(ids)
    for i, t in enumerate(ids[:-1]):
        assert c.relaxed_spans(ids[i : i + 5]) == want[i : i + 5], i
        assert none.relaxed_spans(ids[i : i + 5]) == [False] * len(ids[i : i + 5])
        c.advance(t)
        none.advance(t)
    # the grammar writes properties in schema order: a rationale cannot come before the steps
    early = tok.encode(
        '{"task":"a","rationale":"because it is","steps":["pick"]}', add_special=False
    )
    assert g.constraint().valid_prefix(early) < len(early)


# ---- generation on the tiny model --------------------------------------------------------------
class RunnerUp(Proposer):
    """Drafts the target's second choice among the tokens the grammar allows: a relaxed span
    keeps it (it is within top-k / delta of a random model's flat logits), strict acceptance
    always refuses it. So every relaxed accept is visible, and a leak would be."""

    name = "runner-up"

    def __init__(self, model, grammar):
        self.model, self.grammar, self.n_prompt = model, grammar, 0

    def start(self, prompt_ids, prompt_taps):
        self.n_prompt = len(prompt_ids)

    def propose(self, seq, k):
        out = seq[self.n_prompt :]
        logits = self.model.prefill(torch.tensor(seq), self.model.new_cache(len(seq) + 1)).logits[
            -1
        ]
        masked = self.grammar.constraint().mask_rows(
            logits.expand(len(out) + 1, -1).contiguous(), out
        )[-1]
        return [int(torch.topk(masked, 2).indices[1])], None


def strict_choices(model, grammar, prompt: list[int], out: list[int]) -> list[int]:
    """Per output position, the token strict greedy decoding commits after the output before it:
    the grammar-masked argmax (verify rows are the bits of 1-row steps)."""
    cache = model.new_cache(len(prompt) + len(out) + 1)
    logits = torch.cat(
        [
            model.prefill(torch.tensor(prompt), cache).logits,
            model.verify(torch.tensor(out[:-1]), cache).logits,
        ]
    )  # [len(out), V]
    return grammar.constraint().mask_rows(logits, out[:-1]).argmax(-1).tolist()


@pytest.mark.parametrize("schema", [LAST, FIRST], ids=["rationale-last", "rationale-first"])
def test_relaxed_accepts_lie_inside_the_rationale(tiny_llama, tok, gtok, schema):
    g = Grammar(gtok, schema)
    rt = Runtime(tiny_llama.model, tok)
    params = SamplingParams(max_tokens=200)
    spec = Speculation(RunnerUp(tiny_llama.model, g), 4)
    for prompt in ("pick up the red cup", "move the gripper to the shelf"):
        ids = tok.encode(prompt)
        plain = rt.generate(ids, params, constraint=g.constraint())
        assert (
            rt.generate(ids, params, speculation=spec, constraint=g.constraint()).token_ids
            == plain.token_ids
        )
        # spans on, but the constraint names none: strict everywhere
        unnamed = rt.generate(
            ids, params, speculation=replace(spec, relaxed=SPANS), constraint=g.constraint()
        )
        assert unnamed.token_ids == plain.token_ids and unnamed.stats.relaxed_accepted == 0
        rel = rt.generate(
            ids,
            params,
            speculation=replace(spec, relaxed=SPANS),
            constraint=g.constraint(free_text=KEYS),
        )
        assert rel.finish_reason == "eos" and rel.stats.relaxed_accepted > 0
        out = rel.token_ids
        inside = span_of(gtok, out)
        relaxed_at = [
            i
            for i, (t, s) in enumerate(zip(out, strict_choices(tiny_llama.model, g, ids, out)))
            if t != s
        ]
        assert relaxed_at and all(inside[i] for i in relaxed_at), (relaxed_at, rel.text)
        assert len(relaxed_at) == rel.stats.relaxed_accepted
        if schema is LAST:
            # up to the rationale's value the tokens are strict decoding's, and so is the rest of
            # the document
            first = inside.index(True)
            assert out[:first] == plain.token_ids[:first]
            a, b = json.loads(rel.text), json.loads(plain.text)
            assert a.pop("rationale") != b.pop("rationale") and a == b


# ---- the planner: neither the rationale's length nor its words reach the executed plan ---------
def compact(plan: dict) -> str:
    return json.dumps(plan, separators=(",", ":"))


def test_a_plan_cut_in_its_rationale_is_whole(tok):
    w, s = world_and_skills("kitchen")
    rt = BudgetRuntime(tok, [compact(good_plan())[:-1] + ',"rationale":"the apple is light, so'])
    res = Planner(rt, tok, attempts=0, thinking=False, complete=False).plan(
        "put the apple on the table", w, s
    )
    assert res.valid and res.plan == good_plan() and res.report == []


def test_a_repair_prompt_shows_the_plan_without_its_rationale(tok):
    w, s = world_and_skills("kitchen")
    heavy = good_plan()
    heavy["steps"][0]["args"]["object"] = "cast_iron_pan"
    heavy["rationale"] = "zebra words"
    rt = ScriptedRuntime(tok, [compact(heavy), compact(good_plan())])
    res = Planner(rt, tok, attempts=1, thinking=False, complete=False).plan(
        "put the apple on the table", w, s
    )
    assert res.valid and res.attempts == 2
    assert "cast_iron_pan" in rt.prompts[1] and "zebra" not in rt.prompts[1]


def executed(res, world, skills) -> tuple:
    """What reaches the robot: validity, the plan without its rationale, its goal, and the symbolic
    run of its steps (each call with the states before and after)."""
    plan = {k: v for k, v in (res.plan or {}).items() if k != "rationale"}
    run = execute(plan.get("steps", []), world, skills)
    return res.valid, plan, parse_goal(plan, world, skills)[0], run.calls, run.state


@pytest.mark.slow
def test_executed_plan_is_the_same_with_relaxed_spans(default_model):
    """The embedded model with the shipped drafter (combined), on the shipped schema and on one that
    requires a rationale, so the model must write one and the relaxed rule gets its chance."""
    tok = default_model.tokenizer
    rt = Runtime(default_model.model, tok, prefix_cache=2)
    spec = build_speculation(SpecOptions(method="combined"), default_model.model)
    relaxed = replace(spec, relaxed=SPANS)
    wordy = base_plan_schema()
    wordy["required"] = wordy["required"] + ["rationale"]
    wordy["properties"]["rationale"]["minLength"] = 40
    for world, task in (
        ("kitchen", "put the red cup in the sink"),
        ("warehouse", "bring box_a to dock_1"),
    ):
        w, s = world_and_skills(world)
        for schema in (None, wordy):
            # one repair: its prompt carries the rejected plan, which must not carry the rationale
            a = Planner(rt, tok, spec, attempts=1).plan(task, w, s, schema)
            b = Planner(rt, tok, relaxed, attempts=1).plan(task, w, s, schema)
            assert executed(a, w, s) == executed(b, w, s), (world, schema is wordy)
            assert a.stats["relaxed_accepted"] == 0
