"""calib/choose_drafter.py: ranking drafters of one target by the decode speed they are expected
to give on this machine, and `thor calib choose-drafter`.

The ranking is tested on chosen measurements (it is a pure function of them); the real
measurement on tiny random drafters, against eval-drafter's accept length on the same requests;
the command end to end on the tiny qwen3.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from calib.choose_drafter import (
    Candidate,
    ChooseConfig,
    Measured,
    Measurer,
    choose,
    load_candidate,
    markdown,
    rank,
)
from calib.eval_drafter import EvalConfig
from tests.helpers.tiny import random_drafter
from thor_runtime.errors import ThorError


def _cand(name: str, layers: int = 2, width: int = 64) -> Candidate:
    return Candidate(name, layers, width, 16, 1000 * layers, "t", "")


def _measured(accept: float, draft_ms: float, steps: float, step_ms: float, rest_ms: float = 0.0):
    """100 cycles at these per-cycle figures (the verify's seconds at ``step_ms`` a step)."""
    n = 100
    return Measured(
        cycles=n,
        committed=round(accept * n),
        draft_s=n * draft_ms / 1e3,
        verify_steps=n * steps,
        verify_s=n * steps * step_ms / 1e3,
        rest_s=n * rest_ms / 1e3,
        outputs=((1, 2, 3),),
    )


def test_a_deeper_drafter_that_costs_more_than_it_adds_loses():
    shipped, deep = _cand("shipped", 2), _cand("deep", 6)
    # deep accepts a quarter more but drafts 12 ms a cycle where shipped drafts 2
    rounds = [[_measured(4.0, 2.0, 2.0, 10.0, 3.0), _measured(5.0, 14.0, 2.2, 10.0, 3.0)]] * 3
    r = rank([shipped, deep], rounds)
    assert r["winner"] == "shipped" and r["first"] == "shipped"
    top, second = r["candidates"]
    assert top["candidate"] == "shipped" and second["candidate"] == "deep"
    # 4 tokens / (2 + 20 + 3) ms = 160 tok/s; 5 / (14 + 22 + 3) ms = 128.2
    assert top["expected_tok_s"] == pytest.approx(160.0) and top["vs_first"] == 1.0
    assert second["expected_tok_s"] == pytest.approx(5 / 0.039, abs=0.01)
    assert second["vs_first"] == pytest.approx(128.21 / 160, abs=1e-3)
    assert second["verify_ms"] == pytest.approx(22.0) and second["draft_ms"] == pytest.approx(14.0)
    assert r["identical_output"] and r["step_ms"] == [pytest.approx(10.0)] * 3


def test_equal_cost_and_higher_accept_wins_and_medians_shed_a_slow_round():
    shipped, wide = _cand("shipped", 2, 1024), _cand("wide", 2, 2048)
    same = _measured(4.0, 2.0, 2.0, 10.0)
    better = _measured(5.0, 2.0, 2.0, 10.0)
    slow = replace(better, draft_s=better.draft_s * 20)  # a neighbour took the cores once
    r = rank([shipped, wide], [[same, better], [same, slow], [same, better]])
    assert r["winner"] == "wide"
    assert [c["candidate"] for c in r["candidates"]] == ["wide", "shipped"]
    w = r["candidates"][0]
    assert w["draft_ms"] == pytest.approx(2.0) and w["vs_first"] == pytest.approx(1.25)
    table = markdown(r)
    assert "winner: `wide`" in table and "| `wide` | 2 | 2,048 |" in table


def test_verify_cost_is_the_pooled_step_times_each_candidates_rows():
    """The step's seconds come from all candidates' verifies together, so a candidate whose own
    verifies happened to run slow is not charged for it; only its curve steps differ."""
    a, b = _cand("a"), _cand("b")
    ma = _measured(3.0, 1.0, 2.0, 10.0)
    mb = replace(_measured(3.0, 1.0, 3.0, 10.0), verify_s=100 * 3.0 * 14 / 1e3)
    r = rank([a, b], [[ma, mb]])
    step = (ma.verify_s + mb.verify_s) / (ma.verify_steps + mb.verify_steps)
    assert r["step_ms"] == [pytest.approx(1e3 * step)]
    got = {c["candidate"]: c["verify_ms"] for c in r["candidates"]}
    assert got["a"] == pytest.approx(2e3 * step) and got["b"] == pytest.approx(3e3 * step)
    assert r["winner"] == "a"


def test_rank_says_when_outputs_differ():
    a, b = _cand("a"), _cand("b")
    ma = _measured(3.0, 1.0, 2.0, 10.0)
    r = rank([a, b], [[ma, replace(ma, outputs=((1, 2, 4),))]])
    assert r["identical_output"] is False and "DIFFERED" in markdown(r)
    with pytest.raises(ThorError, match="every candidate"):
        rank([a, b], [[ma]])


def _save(cfg, path, layers: int = 1, block: int = 4, seed: int = 0, **config):
    from thor_runtime.speculative.dflash_io import save_drafter

    d = random_drafter(cfg, num_layers=layers, block_size=block, num_taps=2, seed=seed)
    if config:
        d.cfg = replace(d.cfg, **config)
    save_drafter(d, path)
    return str(path)


def test_choose_with_an_injected_measurement(tiny_llama, tmp_path):
    """The candidates' shapes come from their files, every round measures each once (the order
    reversed every other round) and the ranking follows the measurements."""
    one = _save(tiny_llama.model.cfg, tmp_path / "one", layers=1)
    two = _save(tiny_llama.model.cfg, tmp_path / "two", layers=2, seed=1)
    calls = []

    def fake(cand, drafter):
        calls.append(cand.name)
        assert drafter.cfg.num_layers == cand.layers
        # the two-layer drafter accepts more at the same cost
        return _measured(2.0 + cand.layers, 1.0, 2.0, 5.0)

    cfg = ChooseConfig((one, two), EvalConfig(n=2, prompt_set="general"), repeats=3)
    r = choose(tiny_llama, cfg, progress=False, measure=fake)
    assert calls == [one, two, two, one, one, two]
    assert r["winner"] == two and r["first"] == one and r["repeats"] == 3
    by = {c["candidate"]: c for c in r["candidates"]}
    assert by[one]["layers"] == 1 and by[two]["layers"] == 2
    assert by[two]["parameters"] > by[one]["parameters"] > 0
    assert by[one]["intermediate"] == tiny_llama.model.cfg.intermediate_size
    assert by[two]["vs_first"] == pytest.approx(4 / 3, abs=1e-3)


def test_choose_refuses_what_it_cannot_compare(tiny_llama, tiny_qwen3, tmp_path):
    ok = _save(tiny_llama.model.cfg, tmp_path / "ok")
    cfg = EvalConfig(n=1, prompt_set="general")

    def run(*dirs):
        return choose(tiny_llama, ChooseConfig(dirs, cfg), progress=False, measure=None)

    with pytest.raises(ThorError, match="not found"):
        run(ok, str(tmp_path / "missing"))
    other = _save(tiny_qwen3.model.cfg, tmp_path / "other")
    with pytest.raises(ThorError, match="made for"):
        run(other)
    with pytest.raises(ThorError, match="compare drafters of one target"):
        run(ok, other)
    int4 = _save(tiny_llama.model.cfg, tmp_path / "int4", target_weights="int4")
    with pytest.raises(ThorError, match="int4 weights.*--weights auto"):
        run(int4)
    with pytest.raises(ThorError, match="named twice"):
        ChooseConfig((ok, str(tmp_path / "ok" / ".." / "ok")), cfg)
    with pytest.raises(ThorError, match="proposer"):
        ChooseConfig((ok,), cfg, proposer="ngram")


@pytest.mark.parametrize("proposer", ["dflash", "combined"])
def test_measured_accept_length_is_eval_drafters(tiny_llama, tmp_path, proposer):
    """The real measurement decodes eval-drafter's requests with eval-drafter's proposer: the
    same tokens per cycle, and a cost for every cycle."""
    from calib.eval_drafter import evaluate

    path = _save(tiny_llama.model.cfg, tmp_path / "d", layers=1, block=4)
    ev = EvalConfig(path, n=2, max_tokens=12, prompt_set="general")
    want = evaluate(tiny_llama, ev, progress=False)
    cfg = ChooseConfig((path,), replace(ev, drafter=None), proposer=proposer)
    from calib.choose_drafter import describe

    cand, drafter = load_candidate(describe(path), tiny_llama.model)
    m = Measurer(tiny_llama, cfg, [cand])(cand, drafter)
    accept = want["accept_length_mean"] if proposer == "dflash" else want["combined"]
    accept = accept if proposer == "dflash" else accept["accept_length_mean"]
    assert m.cycles > 0 and m.committed / m.cycles == pytest.approx(accept, abs=1e-4)
    assert m.draft_s > 0 and m.verify_s > 0 and m.verify_steps >= m.cycles
    assert len(m.outputs) == 2 and m.decode_tokens > 0 and m.decode_s > 0


def test_cli_choose_drafter(tiny_dirs, tmp_path, capsys):
    from thor_app.cli import main
    from thor_runtime.loading import load_config

    target = load_config(str(tiny_dirs["qwen3"]))
    one = _save(target, tmp_path / "one", layers=1)
    two = _save(target, tmp_path / "two", layers=2, seed=1)
    out = tmp_path / "rep" / "choose.json"
    args = ["calib", "choose-drafter", "--target", str(tiny_dirs["qwen3"]), "--n", "1"]
    args += ["--max-tokens", "8", "--prompts", "general", "--repeats", "2", "--quiet"]
    assert main(args + [one, two, "--out", str(out)]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert doc == {
        **json.loads(out.read_text()),
        "report": str(out),
        "table": str(out)[:-5] + ".md",
    }
    assert doc["identical_output"] is True and doc["repeats"] == 2 and doc["first"] == one
    assert doc["winner"] == doc["candidates"][0]["candidate"] and doc["proposer"] == "combined"
    assert doc["cost_curve"]["costs"][0] == 1.0 and len(doc["cost_curve"]["costs"]) >= 4
    assert doc["machine"]["threads"] >= 1 and doc["command"].startswith("thor calib choose-drafter")
    rows = {c["candidate"]: c for c in doc["candidates"]}
    assert set(rows) == {one, two} and rows[one]["vs_first"] == 1.0
    for c in rows.values():
        assert c["accept_length"] >= 1.0 and c["expected_tok_s"] > 0 and len(c["cycles"]) == 2
        assert [r["accept_length"] for r in c["rounds"]] == [c["accept_length"]] * 2  # greedy
        assert c["draft_ms"] > 0 and c["verify_ms"] > 0 and c["parameters"] > 0
    assert rows[two]["layers"] == 2 and rows[two]["parameters"] > rows[one]["parameters"]
    table = (tmp_path / "rep" / "choose.md").read_text()
    assert table in cap.err and f"winner: `{doc['winner']}`" in table
    # refused before the target loads: a missing directory, a report that is not JSON
    assert main(args + [one, str(tmp_path / "none"), "--out", str(out)]) == 2
    assert main(args + [one, "--out", str(tmp_path / "x.txt")]) == 2
    assert "not found" in capsys.readouterr().err


def test_measured_under_the_plan_grammar(default_model, tmp_path):
    """Planner requests decode under their plan grammar, as eval-drafter's do: the same accept
    length as its combined run."""
    from calib.choose_drafter import describe
    from calib.eval_drafter import evaluate

    path = _save(default_model.model.cfg, tmp_path / "d", block=6, seed=1)
    ev = EvalConfig(path, n=1, max_tokens=32, constrained=True)
    want = evaluate(default_model, ev, progress=False)["combined"]["accept_length_mean"]
    cfg = ChooseConfig((path,), replace(ev, drafter=None), repeats=1)
    cand, drafter = load_candidate(describe(path), default_model.model)
    m = Measurer(default_model, cfg, [cand])(cand, drafter)
    # forced tokens ride in the cycles: more than one token each even from a random drafter
    assert m.committed / m.cycles == pytest.approx(want, abs=1e-4) and want > 1.0
