"""--spec auto's cost policy: the verify cost curve (measured, cached on disk, rebuilt on a key
mismatch or a damaged file), the choice of K from the curve and the running acceptance, a
collapsed proposer dropped for lookup or plain decoding (and still probed), lookup as a drafter's
fallback on plans, the choice in the
stats, and greedy output identical to plain decoding. No timing is asserted."""

from __future__ import annotations

import json
import random

import pytest

from tests.helpers.tiny import random_drafter
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative import SpecOptions, Speculation, build_speculation
from thor_runtime.speculative import cost as cost_mod
from thor_runtime.speculative.auto import LOW_K, Arm, AutoPolicy, CostBudget, request_probe_due
from thor_runtime.speculative.budget import Cycle
from thor_runtime.speculative.cost import CostCurve, curve_key, linear_curve, monotone, verify_costs
from thor_runtime.speculative.dflash_io import save_drafter
from thor_runtime.speculative.ngram import NgramProposer

STEEP = CostCurve(tuple(1 + 0.3 * r for r in range(16)), 0.01, "measured")  # CPU-like
FLAT = CostCurve(tuple(1 + 0.01 * r for r in range(16)), 0.01, "measured")  # GPU-like


@pytest.fixture
def measured(monkeypatch):
    """Counts the curve's measurements (the real one runs: tiny models take milliseconds)."""
    monkeypatch.delenv(cost_mod.ENV, raising=False)
    calls = []
    real = cost_mod.measure

    def counting(rt, rows):
        calls.append(rows)
        return real(rt, rows)

    monkeypatch.setattr(cost_mod, "measure", counting)
    return calls


def test_cost_cache_written_reused_and_rebuilt(tiny_llama, tmp_path, measured):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    first = verify_costs(rt, 6, str(tmp_path))
    assert (
        first.source == "measured" and first.rows == 6 and first.costs[0] == 1.0 and measured == [6]
    )
    assert all(b >= a for a, b in zip(first.costs, first.costs[1:]))
    files = list((tmp_path / "costs").glob("verify-*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert doc["key"] == curve_key(rt, 6) and doc["costs"] == list(first.costs)
    # the verify reading few logits: measured beside, in the same unit, never dearer
    assert first.by_id is not None and len(first.by_id) == 6 and doc["by_id"] == list(first.by_id)
    assert all(0 < b <= c for b, c in zip(first.by_id, first.costs))
    assert (
        doc["key"]["model"] == tiny_llama.cfg.name
        and doc["key"]["threads"] >= 1
        and doc["key"]["decode"] == "model"
    )

    again = verify_costs(rt, 6, str(tmp_path))  # reused: not measured again
    assert again.source == "cached" and again.costs == first.costs and again.by_id == first.by_id
    assert measured == [6]

    doc["key"]["threads"] += 7  # written for another machine setting
    files[0].write_text(json.dumps(doc))
    assert verify_costs(rt, 6, str(tmp_path)).source == "measured" and len(measured) == 2
    assert json.loads(files[0].read_text())["key"] == curve_key(rt, 6)  # rewritten for this key

    for bad in (
        "{not json",
        json.dumps({**doc, "key": curve_key(rt, 6), "costs": [1.0, 0.5, 2, 2, 2, 2]}),
        json.dumps({"key": curve_key(rt, 6)}),  # damaged, decreasing, incomplete
        json.dumps({**doc, "key": curve_key(rt, 6), "by_id": [2.0] * 6}),
    ):  # by id dearer
        files[0].write_text(bad)
        assert verify_costs(rt, 6, str(tmp_path)).source == "measured"
        assert verify_costs(rt, 6, str(tmp_path)).source == "cached"
    assert len(measured) == 6

    verify_costs(rt, 9, str(tmp_path))  # another reach: its own file
    assert len(list((tmp_path / "costs").glob("verify-*.json"))) == 2
    fp8 = Runtime(tiny_llama.model, tiny_llama.tokenizer, kv_dtype="fp8")
    assert curve_key(fp8, 6) != curve_key(rt, 6)  # the KV dtype is part of the key


def test_cost_curve_no_cache_dir_and_default_switch(tiny_llama, tmp_path, measured, monkeypatch):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer, cost_cache="")
    assert (
        rt.cost_curve(5).source == "measured" and rt.cost_curve(4).source == "measured"
    )  # kept in memory
    assert measured == [5] and cost_mod.cost_dir("") is None
    monkeypatch.setenv(cost_mod.ENV, "default")
    c = verify_costs(rt, 5, str(tmp_path))
    assert (
        c.source == "default"
        and c == linear_curve(5)
        and measured == [5]
        and not (tmp_path / "costs").exists()
    )


def test_curve_shape_helpers():
    assert monotone([1.0, 3.0, 1.2, 1.4, 2.0]) == pytest.approx(
        [1.0, 1.8666, 1.8666, 1.8666, 2.0], abs=1e-3
    )
    c = CostCurve((1.0, 1.5, 2.0))
    assert (
        c(1) == 1.0 and c(2.5) == 1.75 and c(5) == 3.0 and c(0) == 1.0
    )  # between and past the rows
    n = cost_mod.normalise([0.01, 0.011, 0.0105, 0.02])
    assert (
        n.costs[0] == 1.0
        and n.costs[-1] == pytest.approx(2.0, rel=0.01)
        and n.step_s == pytest.approx(0.01)
    )


def _fed(prior: float, rate: float, kmax: int = 15, cycles: int = 300, seed: int = 0) -> Arm:
    """An arm that has seen ``cycles`` full-width cycles, each draft accepted with ``rate``
    given the earlier ones were."""
    arm = Arm("p", object(), kmax, prior)
    rng = random.Random(seed)
    for i in range(cycles):
        n = 0
        while n < kmax and rng.random() < rate:
            n += 1
        arm.observe(i % 2, kmax, n)
    return arm


def test_k_short_on_a_steep_curve_long_on_a_flat_one():
    for arm in (
        Arm("p", object(), 15, 0.8),
        _fed(0.5, 0.8),
    ):  # the prior alone, or what it has seen
        steep, flat = arm.best_k(STEEP, 15, 0, 0)[0], arm.best_k(FLAT, 15, 0, 0)[0]
        assert 1 <= steep <= 4 and flat >= 10, (steep, flat)
        assert arm.best_k(FLAT, 6, 0, 0)[0] == 6  # never past the proposer's K
    # the budget of a request asks for the same K
    policy = AutoPolicy([Arm("p", object(), 15, 0.8), Arm("none", None, 0)], [Arm("none", None, 0)])
    for curve, want in ((STEEP, range(1, 5)), (FLAT, range(10, 16))):
        arm = policy.classes["constrained"].arms[0]
        b = CostBudget(policy, policy.classes["constrained"], arm, curve)
        assert b.cap(15, b.start()) in want
    # forced tokens ride in front: on the steep curve they make drafts dearer, never cheaper
    arm = Arm("p", object(), 15, 0.8)
    assert arm.best_k(STEEP, 15, 0, 6)[0] <= arm.best_k(STEEP, 15, 0, 0)[0]


def test_verifies_read_by_id_weigh_the_cheaper_curve():
    """A plan's verifies that compute only a few logits skip most of the head: a class whose
    verifies do weighs the by-id curve in, and drafts more per cycle; free text never does."""
    both = CostCurve(STEEP.costs, 0.01, "measured", tuple(0.8 + 0.05 * r for r in range(16)))
    assert both.mixed(0) is both and both.mixed(1)(16) == pytest.approx(0.8 + 0.05 * 15)
    assert both.mixed(0.5)(4) == pytest.approx((STEEP(4) + 0.95) / 2)
    caps = {}
    for read in (False, True):  # the same cycles, their verifies read by id or not
        policy = AutoPolicy(
            [Arm("p", object(), 15, 0.8), Arm("none", None, 0)], [Arm("q", object(), 15, 0.8)]
        )
        cls = policy.classes["constrained"]
        b = CostBudget(policy, cls, cls.arms[0], both)
        st = b.start()
        for i in range(60):
            st = b.update(st, 4, 2 + i % 3, Cycle(5, 0, 0.01, 0.0, 0.0, read))
        assert cls.by_id == (pytest.approx(1, abs=0.01) if read else 0)
        caps[read] = b.cap(15, st)
    assert caps[True] > caps[False] >= 1
    free = policy.classes["free"]  # free text: no grammar, every logit
    fb = CostBudget(policy, free, free.arms[0], both)
    fst = fb.update(fb.start(), 4, 3, Cycle(5, 0, 0.01))
    assert free.by_id == 0 and fb.cap(15, fst) == free.arms[0].best_k(STEEP, 15, fst.hot, 0)[0]


def test_drafts_in_a_shared_round_weigh_the_whole_round():
    """In a round shared with others a draft's row is time every member waits for: on a steep
    curve few ride (fewer the more members and the better the round already does), on a flat
    one all of them; a proposer that is never right drafts nothing."""

    def caps(curve, prior, members, rate=0.0, draft=0.0):
        policy = AutoPolicy(
            [Arm("p", object(), 15, prior, draft), Arm("none", None, 0)], [Arm("none", None, 0)]
        )
        cls = policy.classes["constrained"]
        cls.shared_rate = rate
        b = CostBudget(policy, cls, cls.arms[0], curve)
        st = b.start()
        return b.cap_shared(15, st, 0, members), st

    assert caps(FLAT, 0.9, 4)[0] == 15
    steep2, steep4 = caps(STEEP, 0.9, 2)[0], caps(STEEP, 0.9, 4)[0]
    assert steep4 < steep2 < 15
    k, st = caps(STEEP, 0.9, 4, rate=1.0)  # a round whose members' own work is slow
    assert k > steep4 and st.cap == k and not st.probing  # recorded for update
    assert caps(STEEP, 0.9, 4, rate=50.0)[0] == 0  # a round that already commits plenty
    assert caps(FLAT, 0.9, 4, draft=5.0)[0] == 0  # drafting costs more than it brings
    assert caps(FLAT, 0.0, 2)[0] == 0
    # the rate is measured from shared cycles: the tokens all members committed per step of a cycle
    policy = AutoPolicy([Arm("p", object(), 15, 0.9), Arm("none", None, 0)], [Arm("none", None, 0)])
    cls = policy.classes["constrained"]
    b = CostBudget(policy, cls, cls.arms[0], STEEP)
    policy.step_s = 0.01
    b.update(b.start(), 0, 0, Cycle(4, 0, 0.02, 0.0, 0.0, False, 4, 0.04, 2))
    assert (
        cls.shared_rate == pytest.approx(2 * 4 / 4) and policy.step_s == 0.01
    )  # a shared verify is not a step


def test_a_collapsed_proposer_is_dropped_and_still_probed():
    drafter = Arm("combined", object(), 15, 0.9, draft_cost=0.25)
    lookup = Arm("ngram", object(), 8, 0.8)
    none = Arm("none", None, 0)
    policy = AutoPolicy([drafter, lookup, none], [Arm("none", None, 0)])
    spec = Speculation()
    assert policy.choice(True, STEEP) is drafter  # the priors
    for _ in range(200):  # the drafter is never right
        drafter.observe(0, 15, 0)
        drafter.observe(1, 15, 0)
    assert policy.choice(True, STEEP) is lookup
    for _ in range(200):  # nor is lookup
        lookup.observe(0, 8, 0)
        lookup.observe(1, 8, 0)
    assert policy.choice(True, STEEP) is none and policy.choice(True, linear_curve(16)) is none
    picks = [policy.pick(True, STEEP, spec) for _ in range(100)]
    ran = [s.budget.arm.name for s in picks]
    probes = [i for i, s in enumerate(picks) if s.budget.probe]
    assert ran.count("none") > 80 and 0 < len(probes) < 20  # mostly plain, each other one probed
    assert {ran[i] for i in probes} == {"combined", "ngram"} and all(
        ran[i] != "none" for i in probes
    )
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert max(gaps) <= 33
    assert all(s.proposer is None and s.k == 0 for s in picks if s.budget.arm is none)
    # within a request, a collapsed proposer pauses and probes LOW_K drafts on the budget's schedule
    b = CostBudget(policy, policy.classes["constrained"], drafter, STEEP)
    st, caps = b.start(), []
    for _ in range(40):
        caps.append(b.cap(15, st))
        st = b.update(st, caps[-1], 0, Cycle(1 + caps[-1], 0, 0.01, 0.002 if caps[-1] else 0.0))
    assert caps[0] == 0 and set(caps) <= {0, LOW_K} and 2 <= caps.count(LOW_K) <= 6
    assert b.report(st) == {
        "class": "constrained",
        "proposer": "combined",
        "k": LOW_K,
        "k_max": 15,
        "probe": False,
        "cost_curve": "measured",
    }


def test_a_recovering_proposer_comes_back():
    lookup = Arm("ngram", object(), 8, 0.8)
    policy = AutoPolicy([lookup, Arm("none", None, 0)], [Arm("none", None, 0)])
    for i in range(100):
        lookup.observe(i % 2, 8, 0)
    assert policy.choice(True, STEEP).name == "none"
    for i in range(200):  # the text turns repetitive
        lookup.observe(i % 2, 8, 8)
    assert policy.choice(True, STEEP) is lookup


def test_lookup_beside_a_drafter_is_its_fallback_only():
    """Lookup ahead on its prior does not take plans from the combination (which holds it), and
    is not probed; once the combination falls behind plain decoding, lookup runs."""
    drafter = Arm("combined", object(), 15, 0.5, draft_cost=0.25)
    lookup = Arm("ngram", object(), 8, 0.8, fallback=True)
    none = Arm("none", None, 0)
    policy = AutoPolicy([drafter, lookup, none], [Arm("none", None, 0)])
    curve = CostCurve(tuple(1 + 0.05 * r for r in range(16)), 0.01, "measured")
    assert lookup.rate(curve, 0) > drafter.rate(curve, 0) > none.rate(curve, 0)
    picks = [policy.pick(True, curve, Speculation()).budget for _ in range(80)]
    assert {b.arm.name for b in picks} == {"combined"} and not any(b.probe for b in picks)
    for _ in range(200):  # the drafter's chains stop landing
        drafter.observe(0, 15, 0)
        drafter.observe(1, 15, 0)
    assert policy.choice(True, curve) is lookup
    picks = [policy.pick(True, curve, Speculation()).budget for _ in range(40)]
    ran = [b.arm.name for b in picks]
    assert ran.count("ngram") > 30 and {ran[i] for i, b in enumerate(picks) if b.probe} == {
        "combined"
    }
    # a fallback that falls behind plain decoding too leaves plain decoding
    for _ in range(200):
        lookup.observe(0, 8, 0)
        lookup.observe(1, 8, 0)
    assert policy.choice(True, curve) is none


def test_probes_between_requests_back_off():
    due = [n for n in range(1, 200) if request_probe_due(n)]
    assert due[:6] == [4, 12, 28, 60, 92, 124] and all(
        b - a == 32 for a, b in zip(due[3:], due[4:])
    )


def test_a_probe_request_measures_its_proposer_every_cycle():
    """A probe drafts on every cycle even where its prior says pause, so the next request is
    judged on a request's worth of cycles, not on the few a paused proposer probes."""
    weak = Arm("combined", object(), 15, 0.05, draft_cost=0.25)
    policy = AutoPolicy([weak, Arm("none", None, 0)], [Arm("none", None, 0)])
    cls = policy.classes["constrained"]
    assert weak.best_k(STEEP, 15, 0, 0)[0] == 0  # alone it would pause
    probe, plain = (
        CostBudget(policy, cls, weak, STEEP, probe=True),
        CostBudget(policy, cls, weak, STEEP),
    )

    def cycles_drafted(b: CostBudget) -> int:
        st, drafted = b.start(), 0
        for _ in range(40):
            cap = b.cap(15, st)
            drafted += cap > 0
            st = b.update(st, cap, 0, Cycle(1 + cap, 0, 0.01, 0.002 if cap else 0.0))
        return drafted

    assert cycles_drafted(probe) == 40 and cycles_drafted(plain) <= 6


def _run(
    budget: CostBudget, cycles: int, offer: tuple, first: tuple, rng: random.Random, kmax: int = 8
) -> float:
    """``cycles`` cycles of ``budget`` on text where, cold / hot, a draft comes with probability
    offer[h] and each draft holds with probability first[h] (the next too, while they hold):
    -> the share of cycles that ran hot."""
    st, hot = budget.start(), 0
    for _ in range(cycles):
        hot += st.hot
        cap = budget.cap(kmax, st)
        drafted = cap if cap and rng.random() < offer[st.hot] else 0
        accepted = 0
        while accepted < drafted and rng.random() < first[st.hot]:
            accepted += 1
        st = budget.update(
            st, drafted, accepted, Cycle(1 + drafted, 0, 0.01, 0.001 if cap else 0.0)
        )
    return hot / cycles


@pytest.mark.parametrize(
    "offer, first, paused_cold",
    [
        ((0.5, 0.8), (0.8, 0.85), False),  # lookup copying
        ((1.0, 1.0), (0.05, 0.9), True),
    ],
)  # paused cold
def test_the_share_of_hot_cycles_is_the_one_its_k_lead_to(offer, first, paused_cold):
    """A request's rate weighs cold and hot cycles by the share the K chosen in each lead to,
    which is the share the budget then runs, also where cold cycles pause."""
    arm = Arm("p", object(), 8, 0.5)
    policy = AutoPolicy([arm, Arm("none", None, 0)], [Arm("none", None, 0)])
    b = CostBudget(policy, policy.classes["constrained"], arm, STEEP)
    _run(b, 3000, offer, first, random.Random(0))  # learn the text
    ran = _run(b, 6000, offer, first, random.Random(1))
    k0, k1 = arm.best_k(STEEP, 8, 0, 0)[0], arm.best_k(STEEP, 8, 1, 0)[0]
    assert (k0 == 0) == paused_cold and k1 > 0
    assert arm.hot_share(k0, k1) == pytest.approx(ran, abs=0.08)  # from decayed, noisy estimates
    if paused_cold:
        assert ran < 0.15


def test_a_probe_that_drafts_every_cycle_leaves_lookup_the_best():
    """Chat: a drafter that is right mainly after an accepting cycle looks hot often in its probe
    request, which drafts on every cycle; as the best it would pause when cold and stay cold, so
    lookup stays the best."""
    lookup = Arm("ngram", object(), 8, 0.8)
    drafter = Arm("combined", object(), 8, 0.3, draft_cost=0.1)
    policy = AutoPolicy([Arm("none", None, 0)], [lookup, drafter, Arm("none", None, 0)])
    free, rng = policy.classes["free"], random.Random(0)
    for _ in range(4):  # requests with lookup
        _run(CostBudget(policy, free, lookup, STEEP), 90, (0.3, 0.8), (0.7, 0.85), rng)
    probe = CostBudget(policy, free, drafter, STEEP, probe=True)
    _run(probe, 90, (1.0, 1.0), (0.15, 0.9), rng)
    assert policy.choice(False, STEEP) is lookup
    # what the drafter does as the best: paused cold, it runs as plain decoding nearly throughout
    assert _run(CostBudget(policy, free, drafter, STEEP), 300, (1.0, 1.0), (0.15, 0.9), rng) < 0.1


def _auto_with_drafter(tiny_llama, tmp_path):
    save_drafter(random_drafter(tiny_llama.cfg, block_size=6, num_taps=2, seed=1), tmp_path)
    sp = build_speculation(SpecOptions(method="auto", drafter=str(tmp_path)), tiny_llama.model)
    assert (
        sp.auto is not None and sp.budget is None and sp.auto.rows == 9
    )  # lookup's 8 drafts + anchor
    names = {c: [a.name for a in sp.auto.classes[c].arms] for c in ("constrained", "free")}
    assert names == {
        "constrained": ["combined", "ngram", "none"],
        "free": ["ngram", "combined", "none"],
    }
    assert [a.fallback for a in sp.auto.classes["constrained"].arms] == [False, True, False]
    assert not any(a.fallback for a in sp.auto.classes["free"].arms)
    return sp


def test_auto_greedy_identical_to_plain_free_text(tiny_llama, tmp_path, monkeypatch):
    """Many requests, so the policy runs several proposers (the priors, the probes, a drafter
    that is never right): every output equals plain decoding."""
    monkeypatch.setenv(cost_mod.ENV, "default")
    sp = _auto_with_drafter(tiny_llama, tmp_path)
    tok = tiny_llama.tokenizer
    rt = Runtime(tiny_llama.model, tok)
    prompts = [
        "pick up the red cup and place it on the table. pick up the red cup and place it",
        "the robot moves to the dock",
        "wait, then open the drawer and wait, then open",
    ]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    plain = {p: rt.generate(tok.encode(p), params).token_ids for p in prompts}
    ran = set()
    for i in range(18):
        p = prompts[i % 3]
        res = rt.generate(tok.encode(p), params, sp)
        assert res.token_ids == plain[p], (i, p)
        choice = res.stats.to_dict()["auto_choice"]
        assert choice["class"] == "free" and choice["cost_curve"] == "default"
        assert 0 <= choice["k"] <= choice["k_max"]
        ran.add(choice["proposer"])
    assert "ngram" in ran and len(ran) >= 2
    # the named methods report no auto choice
    named = rt.generate(
        tok.encode(prompts[0]), params, build_speculation(SpecOptions("ngram"), tiny_llama.model)
    )
    assert "auto_choice" not in named.stats.to_dict()


def test_auto_greedy_identical_to_plain_constrained(tiny_llama, tmp_path, measured):
    from agent.schema.grammar import Grammar, GrammarTokenizer

    schema = {
        "type": "object",
        "properties": {
            "skill": {"enum": ["pick", "place", "wait"]},
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "skill": {"enum": ["pick", "place"]},
                        "object": {"type": "string", "maxLength": 8},
                    },
                    "required": ["skill", "object"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 4,
            },
        },
        "required": ["skill", "steps"],
        "additionalProperties": False,
    }
    sp = _auto_with_drafter(tiny_llama, tmp_path / "drafter")
    tok = tiny_llama.tokenizer
    g = Grammar(GrammarTokenizer(tok), schema)
    rt = Runtime(tiny_llama.model, tok, cost_cache=str(tmp_path / "cache"))
    params = SamplingParams(max_tokens=80)
    for i, prompt in enumerate(
        ['{"skill":"pick","steps":[{"skill":"pick"', "pick up the red cup"] * 5
    ):
        ids = tok.encode(prompt)
        want = rt.generate(ids, params, constraint=g.constraint()).token_ids
        res = rt.generate(ids, params, sp, constraint=g.constraint())
        assert res.token_ids == want, (i, prompt)
        choice = res.stats.auto_choice
        assert choice["class"] == "constrained" and choice["proposer"] in (
            "combined",
            "ngram",
            "none",
        )
        assert choice["cost_curve"] == "measured"  # measured once, then kept in memory
    assert measured == [9]
    assert (
        Runtime(tiny_llama.model, tok, cost_cache=str(tmp_path / "cache")).cost_curve(9).source
        == "cached"
    )


def test_fixed_k_keeps_autos_fixed_rule(tiny_llama):
    sp = build_speculation(SpecOptions(method="auto", fixed_k=True), tiny_llama.model)
    assert sp.auto is None and isinstance(sp.proposer, NgramProposer) and sp.budget is None
    assert sp.free_text is not None and sp.free_text.proposer.cfg.min_n == 3


def test_what_a_cycle_spends_besides_its_verify_makes_longer_blocks_worth_it():
    """A cycle's grammar, selection and commit cost time whatever its K: counted (the class's
    running ``rest``), they make each cycle dearer and so longer blocks better, as measured."""
    arm = _fed(0.5, 0.8)
    curve = CostCurve([1.0 + 0.25 * r for r in range(16)])  # a verify row: a quarter of a step
    alone, heavy = arm.best_k(curve, 15, 0, 0)[0], arm.best_k(curve, 15, 0, 0, rest=2.0)[0]
    assert heavy > alone
    # the budget learns it from the cycles it sees: their time beyond verify, drafting and upkeep
    policy = AutoPolicy([Arm("p", object(), 15, 0.8), Arm("none", None, 0)], [Arm("none", None, 0)])
    cls = policy.classes["constrained"]
    b = CostBudget(policy, cls, cls.arms[0], curve)
    policy.step_s = 0.01
    st = b.start()
    for _ in range(60):
        b.cap(15, st)
        # 5 rows verified in 0.02 s (the curve's 2 steps: a step is 0.01 s), drafting 0.002,
        # upkeep 0.001, the whole cycle 0.043: 0.02 s (2 steps) besides
        st = b.update(st, 4, 2, Cycle(5, 0, 0.02, 0.002, 0.001, 0.0, 1, 0.043, 3))
    assert cls.rest == pytest.approx(2.0, rel=0.05)
