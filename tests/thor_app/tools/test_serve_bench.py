"""`thor bench --serve` end to end on a tiny model: a real `thor serve` subprocess against the
same plans in-process, paired, both sides on the same settings, JSON + Markdown written."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.helpers.serving import long_context_copy
from thor_app.cli import main
from thor_app.server.config import LimitsSection
from thor_app.server.host import SERVICE_PREFILL_CHUNK
from thor_app.tools.bench_serve import LOAD_TASKS, TASKS, check_same_settings
from thor_runtime.config import ModelSettings as ModelSection
from thor_runtime.errors import ThorError


def test_bench_serve_pairs_the_same_plans_on_the_same_settings(tiny_dirs, tmp_path, capsys):
    model = long_context_copy(tiny_dirs["llama"], tmp_path / "llama")
    out = tmp_path / "serve.json"
    repeats = 2
    rc = main(
        [
            "bench",
            "--serve",
            "--model",
            str(model),
            "--configs",
            "fp32/fp8",
            "--spec",
            "ngram",
            "--repeats",
            str(repeats),
            "--max-tokens",
            "16",
            "--serve-clients",
            "1,2",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())

    # both sides report what they run with; equal, and what was asked (prefix cache: the
    # service's default)
    s = doc["settings"]
    assert s["identical"] is True and s["server"] == s["in_process"]
    want = {
        "source": model.name,
        "kv_dtype": "fp8",
        "dtype": "float32",
        "speculation": "ngram",
        "prefix_cache": ModelSection().prefix_cache,
        "threads": 1,
        "prefill_chunk": SERVICE_PREFILL_CHUNK,
    }  # the service's chunk when the config says one pass
    assert {k: s["server"][k] for k in want} == want and ModelSection().prefix_cache > 0

    # every task in every repeat, each side going first equally often, per-pair figures consistent
    pairs = doc["pairs"]
    assert len(pairs) == repeats * len(TASKS)
    assert sorted((p["repeat"], p["task"]) for p in pairs) == sorted(
        (r, t) for r in range(repeats) for t in TASKS
    )
    assert sum(p["first"] == "http" for p in pairs) == sum(
        p["first"] == "in_process" for p in pairs
    )
    for p in pairs:
        assert p["http_s"] > 0 and p["in_process_s"] > 0 and p["server_reported_s"] > 0
        assert p["diff_s"] == pytest.approx(p["http_s"] - p["in_process_s"], abs=2e-4)
        assert p["overhead"] == pytest.approx(p["http_s"] / p["in_process_s"] - 1, abs=5e-3)
        assert (
            p["same_plan"] is True and p["generated_tokens"] > 0
        )  # greedy, same settings: same work
    sm = doc["summary"]
    over = [p["overhead"] for p in pairs]
    assert sm["pairs"] == len(pairs) and sm["plans_identical"] == len(pairs)
    assert sm["overhead_median"] == pytest.approx(statistics.median(over), abs=1e-5)
    assert (
        sm["overhead_min"]
        <= sm["overhead_p25"]
        <= sm["overhead_median"]
        <= sm["overhead_p75"]
        <= sm["overhead_max"]
    )
    assert sm["diff_median_s"] == pytest.approx(
        statistics.median(p["diff_s"] for p in pairs), abs=1e-4
    )
    assert (
        "http_minus_server_reported_p50_s" in sm
        and sm["ttft_stream_p50_s"] > 0
        and sm["ttft_in_process_p50_s"] > 0
    )
    assert len(doc["ttft_pairs"]) == repeats

    # the throughput levels are still there
    assert [r["clients"] for r in doc["levels"]] == [1, 2]
    for r in doc["levels"]:
        assert (
            r["requests"] == max(2 * r["clients"], repeats)
            and r["req_per_s"] > 0
            and r["p50_s"] <= r["p99_s"]
        )
    # ... against a server on the same config taking one request at a time: every task got one plan
    assert doc["batch"] == LimitsSection.batch > 1
    assert [r["clients"] for r in doc["levels_one_at_a_time"]] == [1, 2]
    # both servers had answered as many plans when their levels began
    assert doc["warm_plans"] == {
        "batched": (repeats + 1) * len(TASKS) + len(LOAD_TASKS),
        "one at a time": (repeats + 1) * len(TASKS) + len(LOAD_TASKS),
    }
    b = doc["batching"]
    assert b["plans_identical"] is True and b["tasks"] == len(LOAD_TASKS)
    assert [r["clients"] for r in b["levels"]] == [1, 2] and all(
        r["req_per_s_ratio"] > 0 for r in b["levels"]
    )

    # the cores' ceiling: rows a plan needs (generated + computed prompt tokens) at the cheapest
    # measured seconds a row, beside 2x one-at-a-time's rate at the goal's client count (2 here:
    # none)
    c = doc["ceiling"]
    rows = [p["generated_tokens"] + p["prompt_tokens_computed"] for p in pairs]
    assert c["plans"] == len(pairs) and c["rows_per_plan"] == pytest.approx(
        statistics.mean(rows), abs=0.05
    )
    assert c["context"] == round(statistics.mean(p["prompt_tokens"] for p in pairs))
    assert set(c["s_per_row"]) == {"4", "8", "16", "32", "64"} and c["best_s_per_row"] == min(
        c["s_per_row"].values()
    )
    assert c["s_per_row"][str(c["best_rows"])] == c["best_s_per_row"] > 0
    assert c["plans_per_s"] == pytest.approx(
        1 / (c["rows_per_plan"] * c["best_s_per_row"]), rel=2e-3
    )
    other = statistics.mean(p["drafter_and_between_s"] for p in pairs)
    assert c["drafter_and_between_s"] == pytest.approx(other, abs=1e-4) and other > 0
    assert (
        c["plans_per_s_with_them"]
        == pytest.approx(1 / (c["rows_per_plan"] * c["best_s_per_row"] + other), rel=5e-3)
        and c["plans_per_s_with_them"] < c["plans_per_s"]
    )
    assert "goal_plans_per_s" not in c

    md = out.with_suffix(".md").read_text()
    assert f"| prefix_cache | {ModelSection().prefix_cache} | {ModelSection().prefix_cache} |" in md
    assert (
        "| overhead (HTTP / in-process - 1), median of pairs |" in md
        and "| clients | requests |" in md
    )
    assert "req/s ratio" in md and f"compute ceiling: {c['plans_per_s']} plans/s" in md
    assert md in capsys.readouterr().out


def test_sides_on_different_settings_are_refused():
    a = {"prefix_cache": 2, "kv_dtype": "fp32", "threads": 2}
    check_same_settings(a, dict(a))
    with pytest.raises(ThorError, match="prefix_cache 2 vs 0"):
        check_same_settings(a, {**a, "prefix_cache": 0})
    with pytest.raises(ThorError, match="reported none"):
        check_same_settings({}, {})


def test_the_ceiling_sets_the_goal_against_one_at_a_time_at_four_clients():
    from thor_app.tools.bench_ceiling import against, ceiling

    floor = {"context": 900, "s_per_row": {"16": 0.001}, "best_rows": 16, "best_s_per_row": 0.001}
    stats = [
        {"generated_tokens": 140, "prompt_tokens_computed": 10, "drafter_and_between_s": 0.1},
        {"generated_tokens": 90, "prompt_tokens_computed": 10, "drafter_and_between_s": 0.05},
    ]
    c = ceiling(floor, stats)
    assert c["rows_per_plan"] == 125 and c["plans_per_s"] == 8.0
    assert c["drafter_and_between_s"] == 0.075 and c["plans_per_s_with_them"] == 5.0
    one = [{"clients": 1, "req_per_s": 3.0}, {"clients": 4, "req_per_s": 2.5}]
    g = against(c, one)
    assert g["goal_clients"] == 4 and g["goal_plans_per_s"] == 5.0 and g["ceiling_over_goal"] == 1.6
    assert g["with_them_over_goal"] == 1.0
    assert against(c, one[:1]) == c  # no 4-client level: nothing to weigh


def test_step_and_verify_says_where_the_machine_stood(tiny_llama):
    """The plan bench's machine reading: a 1-row step and a 16-row verify at a context the
    model's positions allow, both timed, the verify in steps their ratio."""
    from thor_app.tools.bench_ceiling import step_and_verify
    from thor_runtime.engine.generate import Runtime

    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    m = step_and_verify(rt, context=10**6)
    assert 0 < m["context"] < tiny_llama.cfg.max_position_embeddings - 16  # cut to what fits
    assert m["verify_rows"] == 16 and m["step_ms"] > 0 and m["verify_ms"] > 0
    assert m["verify_in_steps"] == pytest.approx(m["verify_ms"] / m["step_ms"], rel=1e-2)
    assert step_and_verify(rt, context=8)["context"] == 8
