"""`thor bench --rollback`: the slot-rollback vs re-forward benchmark runs on a small hybrid and
reports what the table in docs/hybrid-models.md is made of; both paths end in the same state."""

from __future__ import annotations

import json

import pytest
import torch

from thor_app.tools.rollback_bench import (
    BENCH_CONFIG,
    _cycle_times,
    bench_rollback,
    random_hybrid,
)
from thor_runtime.errors import ThorError
from thor_runtime.models.hybrid.config import HybridConfig

SMALL = dict(
    BENCH_CONFIG,
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_layers=4,
    num_heads=4,
    head_dim=16,
    layer_types=("linear_attention",) * 3 + ("full_attention",),
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    name="small-hybrid",
)


@pytest.fixture(scope="module")
def small():
    return random_hybrid(HybridConfig(**SMALL))


@pytest.mark.parametrize(
    "accept,n_of",
    [("half", lambda K: K // 2), ("none", lambda K: 0), ("all-but-one", lambda K: K - 1)],
)
def test_rows_per_k(small, accept, n_of):
    res = bench_rollback((1, 3, 6), repeats=1, prompt=8, accept=accept, model=small)
    assert res["accept"] == accept and [r["K"] for r in res["rows"]] == [1, 3, 6]
    for r in res["rows"]:
        assert r["accepted"] == n_of(r["K"])
        for path in ("slots", "replay"):
            assert r[f"{path}_cycle_ms"] >= r[f"{path}_verify_ms"] > 0
        assert r["speedup"] == pytest.approx(r["replay_cycle_ms"] / r["slots_cycle_ms"], rel=1e-2)
    slots = [r["slot_bytes"] for r in res["rows"]]
    assert slots[0] < slots[1] < slots[2]  # one checkpoint per verified row
    json.dumps(res)  # what --json writes


def test_both_paths_end_in_the_same_state(small):
    """The timed cycles leave the slot path and the replay path with the same recurrent state and
    the same next logits: the benchmark compares two ways of doing the same thing."""
    _, _, a = _cycle_times(small, 5, 2, False, 2, 8, seed=3)
    _, _, b = _cycle_times(small, 5, 2, True, 2, 8, seed=3)
    assert a.length == b.length
    ids = torch.tensor([7])
    la, lb = small.forward(ids, a).logits, small.forward(ids, b).logits
    assert torch.equal(la, lb)


def test_unknown_accept_is_refused(small):
    with pytest.raises(ThorError, match="unknown accept"):
        bench_rollback((1,), repeats=1, accept="most", model=small)


def test_cli_refuses_bad_ks(capsys):
    from thor_app.cli import main

    assert main(["bench", "--rollback", "--ks", "3,x"]) == 2
    assert "--ks" in capsys.readouterr().err
