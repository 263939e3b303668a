"""Combined proposer (DFlash + prompt lookup; `--spec combined`, earlier spelled `hybrid`): the
choice rule on hand-made confidences, the old spelling still meaning it, and greedy output
token-identical to plain decoding on a tiny model and on the default model."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny import proposer_and_k, random_drafter
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.speculative import SpecOptions, Speculation
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.combined import CombinedProposer
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.dflash_io import save_drafter
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer


class StubDrafter:
    """Stands in for DFlashProposer: fixed drafts with fixed confidences; records calls."""

    tap_layers, window = (0,), 8

    def __init__(self, drafts, conf, q=None):
        self.drafts, self.conf, self.q = drafts, torch.tensor(conf), q
        self.calls: list = []

    def propose_scored(self, seq, k):
        return self.drafts[:k], self.q, self.conf[:k]

    def start(self, prompt_ids, taps):
        self.calls.append(("start", len(prompt_ids)))

    def commit(self, n_rows, taps):
        self.calls.append(("commit", n_rows))


SEQ = [5, 6, 7, 8, 9, 5, 6]  # the tail [5, 6] occurred before: lookup continues 7, 8, 9, 5, 6


def combined(conf, rate=0.8, q=None):
    stub = StubDrafter([1, 2, 3, 4], conf, q)
    return CombinedProposer(stub, NgramProposer(NgramConfig(k=4)), rate), stub


def test_choice_follows_expected_accepted_tokens():
    # DFlash sure of 4 drafts: expects ~3.9 tokens; lookup's 4 expect 0.8+0.64+0.51+0.41 = 2.36
    h, _ = combined([0.99, 0.99, 0.99, 0.99], q="q")
    assert h.propose(SEQ, 4) == ([1, 2, 3, 4], "q") and h.lookup_cycles == 0
    # DFlash unsure (0.9, then 0.3: expects 0.9 + 0.27 + ...): lookup wins, deterministic (q None)
    h, _ = combined([0.9, 0.3, 0.3, 0.3], q="q")
    assert h.propose(SEQ, 4) == ([7, 8, 9, 5], None) and h.lookup_cycles == 1
    # the same with a lower lookup prior (0.5: expects 0.94): DFlash again
    h, _ = combined([0.9, 0.3, 0.3, 0.3], rate=0.5)
    assert h.propose(SEQ, 4)[0] == [1, 2, 3, 4]
    # no earlier occurrence of the tail: nothing to look up, DFlash even when unsure
    h, _ = combined([0.01] * 4)
    assert h.propose([5, 6, 7, 8], 4)[0] == [1, 2, 3, 4]
    # k caps both
    h, _ = combined([0.01] * 4)
    assert h.propose(SEQ, 2) == ([7, 8], None)


def test_lifecycle_goes_to_the_drafter_and_rate_is_checked():
    h, stub = combined([0.01] * 4)
    h.propose(SEQ, 4)
    h.start([1, 2, 3], None)
    h.commit(3, None)
    assert stub.calls == [("start", 3), ("commit", 3)] and h.lookup_cycles == 0
    assert h.tap_layers == stub.tap_layers and h.window == stub.window
    for bad in (0.0, 1.0, -1, 2):
        with pytest.raises(ThorError, match="lookup rate"):
            combined([0.5], rate=bad)
        with pytest.raises(ThorError, match="lookup rate"):
            SpecOptions(method="combined", lookup_rate=bad)


def test_the_earlier_spelling_hybrid_means_combined(tiny_llama, tmp_path):
    from thor_runtime.speculative import SPEC_ALIASES, SPEC_METHODS, build_speculation

    assert SPEC_ALIASES == {"hybrid": "combined"} and {"combined", "hybrid"} <= set(SPEC_METHODS)
    assert (
        SpecOptions(method="hybrid").method == "combined" == SpecOptions(method="combined").method
    )
    save_drafter(random_drafter(tiny_llama.cfg, block_size=4, num_taps=2, seed=1), tmp_path)
    for method in ("hybrid", "combined"):
        sp = build_speculation(SpecOptions(method=method, drafter=str(tmp_path)), tiny_llama.model)
        assert isinstance(sp.proposer, CombinedProposer) and sp.name == "combined" and sp.k == 3
    with pytest.raises(ThorError, match="unknown --spec 'hybrd'"):
        SpecOptions(method="hybrd")


def test_dflash_confidences_are_the_drafts_probabilities(tiny_llama):
    model = tiny_llama.model
    p = DFlashProposer(random_drafter(model.cfg, block_size=5, num_taps=1, seed=0), model, window=8)
    ids = tiny_llama.tokenizer.encode("pick up the red cup")
    p.start(ids, None)
    seq = ids + [3]  # the anchor: first generated token
    drafts, q, conf = p.propose_scored(seq, 4)
    assert (
        q is None and len(drafts) == 4 == conf.shape[0] and bool(((conf > 0) & (conf <= 1)).all())
    )
    assert p.propose(seq, 4) == (drafts, None)  # same drafts, no confidences
    # sampling mode: the confidence of each draft is its probability under the returned q
    p = DFlashProposer(
        random_drafter(model.cfg, block_size=5, num_taps=1, seed=0),
        model,
        window=8,
        sample_probs=True,
        seed=0,
    )
    p.start(ids, None)
    drafts, q, conf = p.propose_scored(seq, 4)
    assert torch.allclose(q[torch.arange(4), torch.tensor(drafts)].float(), conf)


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_combined_greedy_identical_tiny(tiny_llama, tmp_path, kv):
    """A random drafter is never sure, so lookup takes every cycle it has a match for, DFlash
    the rest: both kinds of cycle occur, and output equals plain decoding."""
    save_drafter(random_drafter(tiny_llama.cfg, block_size=6, num_taps=2, seed=1), tmp_path)
    p, k = proposer_and_k(SpecOptions(method="combined", drafter=str(tmp_path)), tiny_llama.model)
    assert isinstance(p, CombinedProposer) and k == 5 and p.lookup.cfg.k == 5
    tok = tiny_llama.tokenizer
    ids = tok.encode(
        "pick up the red cup and place it on the table. pick up the red cup and place it"
    )
    rt = Runtime(tiny_llama.model, tok, kv_dtype=kv)
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    want = rt.generate(ids, params).token_ids
    got = rt.generate(ids, params, speculation=Speculation(p, k))
    assert got.token_ids == want
    assert 0 < p.lookup_cycles < got.stats.cycles


def test_combined_plans_identical_default(default_model):
    """The planner's decode on a held-out request, with the shipped drafter: identical to plain
    constrained decoding, and lookup takes part of the cycles."""
    from agent.schema.grammar import GrammarTokenizer
    from calib.datagen import plan_constraint
    from calib.prompts import robot_requests

    tok, model = default_model.tokenizer, default_model.model
    req = robot_requests("heldout", 1, 0)[0]
    ids = tok.encode_chat(req.messages)
    gtok = GrammarTokenizer(tok)
    rt = Runtime(model, tok)
    params = SamplingParams(max_tokens=96)
    want = rt.generate(ids, params, constraint=plan_constraint(gtok, req)).token_ids
    p, k = proposer_and_k(SpecOptions(method="auto"), model)
    assert isinstance(p, CombinedProposer) and k == 15
    got = rt.generate(
        ids,
        params,
        speculation=Speculation(p, k, DraftBudget()),
        constraint=plan_constraint(gtok, req),
    )
    assert got.token_ids == want
    assert got.stats.committed / got.stats.cycles > 3 and p.lookup_cycles > 0
