"""agent/schema/grammar.py: the llguidance Constraint — masks, drafts, rollback, jump-forward, EOS,
schema checks, and greedy constrained speculative == greedy constrained plain decoding."""

from __future__ import annotations

import json

import pytest
import torch

from agent.schema.grammar import Grammar, GrammarTokenizer, check_schema
from tests.helpers.schemas import PLAN_LIKE
from tests.helpers.tiny import proposer_and_k, random_drafter
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.base import Proposer
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer

GOOD = '{"skill":"pick","target":{"name":"red_cup","xyz":[0.5,1,0.25]},"notes":["ok"]}'


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special=False)


def accepts(gtok, tok, schema, text: str) -> bool:
    """The whole text is a legal prefix and the grammar may end (EOS) right after it."""
    c = Grammar(gtok, schema).constraint()
    ids = enc(tok, text) + [gtok.eos_ids[0]]
    return c.valid_prefix(ids) == len(ids)


def allowed_ids(c, width: int) -> list[int]:
    row = c.mask_rows(torch.zeros(1, width), [])[0]
    return torch.nonzero(row > float("-inf")).flatten().tolist()


# ---- schema checks, before any generation ----------------------------------------------------
@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "array", "uniqueItems": True}, ["uniqueItems"]),
        (
            {
                "type": "object",
                "properties": {"a": {"if": {"type": "string"}, "then": {"maxLength": 2}}},
            },
            ["'if'", "/properties/a"],
        ),
        ({"not": {"type": "string"}}, ["'not'"]),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, ["propertyNames"]),
    ],
)
def test_unsupported_keyword_is_named(schema, words):
    with pytest.raises(ThorError) as e:
        check_schema(schema)
    msg = str(e.value)
    assert "unsupported schema keyword" in msg
    for w in words:
        assert w in msg


@pytest.mark.parametrize(
    "schema, word",
    [
        ({"type": "strin"}, "not a valid JSON Schema"),
        ({"type": "object", "required": "a"}, "not a valid JSON Schema"),
        ({"type": "string", "pattern": "(?=a)b"}, "cannot be compiled"),
        ([1, 2], "must be a JSON object"),
        ({"enum": [2**64]}, "cannot be compiled"),  # past 64 bits: the engine raised ValueError
        ({"type": "integer", "maximum": 2**70}, "cannot be compiled"),
    ],
)
def test_invalid_schema_is_refused(schema, word):
    with pytest.raises(ThorError, match=word.replace("(", r"\(")):
        check_schema(schema)


def test_a_schema_that_passed_is_not_checked_again_but_a_failing_one_always_is(monkeypatch):
    import jsonschema

    real, seen = jsonschema.Draft202012Validator.check_schema, []
    monkeypatch.setattr(
        jsonschema.Draft202012Validator,
        "check_schema",
        lambda schema: seen.append(json.dumps(schema)) or real(schema),
    )
    good = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 7123}}}
    check_schema(good)
    check_schema(json.loads(json.dumps(good)))  # equal content: remembered
    assert len(seen) <= 1
    seen.clear()
    check_schema({**good, "required": ["n"]})  # another schema: checked
    assert len(seen) == 1
    for _ in range(2):  # a refusal is never remembered
        with pytest.raises(ThorError, match="not a valid JSON Schema"):
            check_schema({"type": "object", "required": "n", "minProperties": 7123})
    assert len(seen) == 3
    with pytest.raises(ThorError, match="plain JSON"):
        check_schema({"type": "number", "minimum": float("nan")})


def test_grammar_refuses_before_any_generation(gtok):
    """Grammar() is built before generate() is called; it must raise, not the decode loop."""
    with pytest.raises(ThorError, match="uniqueItems"):
        Grammar(gtok, {"type": "array", "uniqueItems": True})


# ---- what the grammar accepts ----------------------------------------------------------------
def test_empty_schema_is_any_json(gtok, tok):
    for text in ['{"a":1}', "[1,2]", '"x"', "3", "null", '{"k":{"n":[true]}}']:
        assert accepts(gtok, tok, {}, text), text
    assert not accepts(gtok, tok, {}, '{"a":')


def test_enum(gtok, tok):
    s = {"enum": ["red_cup", "plate", 3]}
    assert accepts(gtok, tok, s, '"red_cup"') and accepts(gtok, tok, s, "3")
    assert not accepts(gtok, tok, s, '"red"') and not accepts(gtok, tok, s, '"cup"')


def test_nested_objects_pattern_maxlength_minitems(gtok, tok):
    assert accepts(gtok, tok, PLAN_LIKE, GOOD)
    bad = [
        GOOD.replace('"pick"', '"jump"'),  # enum
        GOOD.replace("red_cup", "Red"),  # pattern
        GOOD.replace("red_cup", "red_cup_x"),  # maxLength 8
        GOOD.replace('["ok"]', "[]"),  # minItems 1
        GOOD.replace('"ok"', '"ok","a","b"'),  # maxItems 2
        GOOD.replace("0.25", "2.5"),  # maximum
        GOOD.replace("0.25", "0.255"),  # multipleOf
        GOOD.replace("[0.5,1,0.25]", "[0.5,1]"),  # nested minItems
        GOOD.replace('"xyz"', '"extra":1,"xyz"'),  # additionalProperties
    ]
    for text in bad:
        assert not accepts(gtok, tok, PLAN_LIKE, text), text


def test_eos_only_where_grammar_accepts(gtok, tok):
    g = Grammar(gtok, PLAN_LIKE)
    c = g.constraint()
    ids = enc(tok, GOOD)
    width = tok.vocab_size + 7  # model vocab wider than the tokenizer's
    eos = set(gtok.eos_ids)
    for t in ids:
        row = set(allowed_ids(c, width))
        assert not row & eos, "EOS offered before the JSON is complete"
        assert max(row) < tok.vocab_size, "padding ids must never be legal"
        assert not c.is_accepting()
        c.advance(t)
    assert c.is_accepting()
    assert set(allowed_ids(c, width)) == eos  # compact JSON: after the last brace only EOS
    with pytest.raises(RuntimeError):
        Grammar(gtok, PLAN_LIKE).constraint().advance(
            gtok.eos_ids[0]
        )  # EOS at the start is illegal


# ---- drafts, rows and rollback ---------------------------------------------------------------
def _fresh_after(g, ids):
    c = g.constraint()
    for t in ids:
        c.advance(t)
    return c


def test_draft_rejected_mid_span_state_is_exact(gtok, tok):
    g = Grammar(gtok, PLAN_LIKE)
    ids = enc(tok, GOOD)
    width = tok.vocab_size
    c = g.constraint()
    for t in ids[:5]:
        c.advance(t)
    bad = enc(tok, "#")[0]
    drafts = ids[5:9] + [bad] + ids[10:12]
    assert c.valid_prefix(drafts) == 4  # cut exactly at the illegal draft
    logits = torch.randn(len(drafts) + 1, width)
    masked = c.mask_rows(logits, drafts)
    for j in range(5):  # rows 0..4: state after drafts[:j]
        ref = _fresh_after(g, ids[: 5 + j])
        assert torch.equal(
            masked[j] > float("-inf"), ref.mask_rows(torch.zeros(1, width), [])[0] > float("-inf")
        )
    assert masked[4, bad] == float("-inf")  # so the accept step rejects the draft there
    # Neither call moved the state: commit two of the drafts and compare with a fresh matcher.
    for t in ids[5:7]:
        c.advance(t)
    ref = _fresh_after(g, ids[:7])
    assert torch.equal(allowed_ids_t(c, width), allowed_ids_t(ref, width))
    assert c.valid_prefix(ids[7:]) == len(ids) - 7 == ref.valid_prefix(ids[7:])
    assert c.forced() == ref.forced()


def allowed_ids_t(c, width):
    return c.mask_rows(torch.zeros(1, width), [])[0] > float("-inf")


def test_valid_prefix_stops_at_eos_and_padding(gtok, tok):
    g = Grammar(gtok, PLAN_LIKE)
    ids = enc(tok, GOOD)
    c = g.constraint()
    eos = gtok.eos_ids[0]
    assert c.valid_prefix(ids + [eos, ids[0]]) == len(ids) + 1  # nothing is legal after EOS
    assert c.valid_prefix(ids[:3] + [tok.vocab_size + 2]) == 3  # a padding id from a drafter
    assert c.valid_prefix(ids[:3] + [eos]) == 3  # EOS mid-JSON


# ---- jump-forward ----------------------------------------------------------------------------
def test_forced_tokens_match_mask(gtok, tok):
    """Wherever the grammar forces tokens, its mask allows only the first of them, so forced
    drafts are certain to be accepted."""
    g = Grammar(gtok, PLAN_LIKE)
    c = g.constraint()
    ids = enc(tok, GOOD)
    n_forced = 0
    for t in ids:
        f = c.forced()
        if f:
            n_forced += 1
            assert allowed_ids(c, tok.vocab_size) == [f[0]]
            assert c.valid_prefix(f) == len(f)
        c.advance(t)
    assert n_forced >= 3  # '{"skill":"', '","target":{"name":"' ...


class Refuser(Proposer):
    """Drafts a token the grammar never allows: the cycle must cut it, keep forced tokens."""

    name = "refuser"

    def __init__(self, token):
        self.token = token

    def propose(self, seq, k):
        return [self.token] * k, None


def test_jump_forward_rides_in_draft_and_is_counted(tiny_llama, gtok):
    tok = tiny_llama.tokenizer
    rt = Runtime(tiny_llama.model, tok)
    g = Grammar(gtok, PLAN_LIKE)
    ids = tok.encode("pick the red cup")
    params = SamplingParams(max_tokens=80)
    plain = rt.generate(ids, params, constraint=g.constraint())
    s = plain.stats
    assert s.jump_forward > 0 and s.accepted >= s.jump_forward
    assert s.cycles < s.generated - 1  # forced tokens saved whole cycles, even with K = 0
    junk = rt.generate(
        ids,
        params,
        speculation=Speculation(Refuser(enc(tok, "#")[0]), 4, DraftBudget()),
        constraint=g.constraint(),
    )
    assert junk.token_ids == plain.token_ids
    assert junk.stats.jump_forward == s.jump_forward


# ---- exactness ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_constrained_ngram_equals_constrained_plain(arch, request, gtok):
    loaded = request.getfixturevalue(f"tiny_{arch}")
    tok = loaded.tokenizer
    rt = Runtime(loaded.model, tok)
    gt = gtok if arch == "llama" else GrammarTokenizer(tok)
    for schema in (
        PLAN_LIKE,
        {},
        {"type": "array", "items": {"enum": ["pick", "place"]}, "minItems": 2, "maxItems": 6},
    ):
        g = Grammar(gt, schema)
        for prompt in ['{"skill":"pick","target":{"name":"cup"', "pick up the red cup"]:
            ids = tok.encode(prompt)
            params = SamplingParams(max_tokens=90)
            plain = rt.generate(ids, params, constraint=g.constraint())
            spec = rt.generate(
                ids,
                params,
                speculation=Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget()),
                constraint=g.constraint(),
            )
            assert spec.token_ids == plain.token_ids, (schema, prompt)
            if plain.finish_reason == "eos":  # a finished output is valid JSON
                json.loads(plain.text)


def test_constrained_dflash_equals_constrained_plain(tiny_llama, gtok, tmp_path):
    """A random drafter proposes mostly illegal (and padding) ids: the grammar cuts them and the
    output stays token-identical to plain constrained decoding."""
    from thor_runtime.speculative import SpecOptions
    from thor_runtime.speculative import dflash_io as io

    path = io.save_drafter(
        random_drafter(tiny_llama.cfg, block_size=5, seed=3), tmp_path / "drafter"
    )
    proposer, k = proposer_and_k(SpecOptions(method="dflash", drafter=str(path)), tiny_llama.model)
    tok = tiny_llama.tokenizer
    rt = Runtime(tiny_llama.model, tok)
    g = Grammar(gtok, PLAN_LIKE)
    ids = tok.encode("pick up the red cup")
    params = SamplingParams(max_tokens=90)
    plain = rt.generate(ids, params, constraint=g.constraint())
    # no draft budget: the random drafter keeps drafting, so the grammar keeps cutting
    spec = rt.generate(ids, params, speculation=Speculation(proposer, k), constraint=g.constraint())
    assert spec.token_ids == plain.token_ids


def test_thinking_span_is_optional_and_free(tiny_qwen3):
    tok = tiny_qwen3.tokenizer
    gt = GrammarTokenizer(tok)
    assert gt.think_ids is not None
    b, e = gt.think_ids
    g = Grammar(gt, PLAN_LIKE, thinking=True)
    eos = gt.eos_ids[0]
    body = enc(tok, "the cup is at 0.5 {not json} ###\n")
    with_think = [b] + body + [e] + enc(tok, "\n" + GOOD) + [eos]
    assert g.constraint().valid_prefix(with_think) == len(with_think)
    plain = enc(tok, GOOD) + [eos]
    assert g.constraint().valid_prefix(plain) == len(plain)
    bad_json = [b] + body + [e] + enc(tok, GOOD.replace("pick", "jump"))
    assert g.constraint().valid_prefix(bad_json) < len(bad_json)
    # without thinking the span is not allowed at all
    assert Grammar(gt, PLAN_LIKE).constraint().valid_prefix([b]) == 0
