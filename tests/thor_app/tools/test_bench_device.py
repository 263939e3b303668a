"""The device benchmark (`thor bench --device`) end to end on the CPU at a tiny shape: every
figure present and sane, the JSON, table and plot written."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def tiny_shape(monkeypatch):
    from thor_app.tools import bench_device_shapes

    monkeypatch.setitem(
        bench_device_shapes.SHAPES, "tiny", ("llama", 64, 128, 3, 4, 2, 16, 320, True)
    )
    return "tiny"


def test_device_bench_rows_table_and_plot(tiny_shape, tmp_path):
    from thor_app.tools.bench_device import COLUMNS, plot, run, table

    out = tmp_path / "bench.json"
    doc = run("cpu", [tiny_shape], "fp32", "bf16", 1, 6, out, weight_formats=False)
    assert (
        json.loads(out.read_text()) == doc
        and doc["device"] == "cpu"
        and doc["copy_bandwidth_GBps"] > 0
    )
    row = doc["rows"][0]
    assert set(COLUMNS) <= set(row)
    for k in (
        "prefill_tok_s",
        "step_1row_ms",
        "step_8rows_ms",
        "verify_16rows_ms",
        "decode_tok_s",
        "drafter_block_eager_ms",
        "drafter_block_fixed_ms",
        "plan_shaped_latency_s",
    ):
        assert row[k] > 0, k
    assert row["verify16_over_step1"] == pytest.approx(
        row["verify_16rows_ms"] / row["step_1row_ms"], rel=0.01
    )
    assert row["graph_speedup_1row"] is None  # no graphs on the CPU
    assert 0 < row["decode_bandwidth_share"] < 1
    curve = row["verify_cost_curve"]  # what --spec auto would measure here
    assert len(curve) == 16 and curve[0] == 1.0 and all(b >= a for a, b in zip(curve, curve[1:]))
    ks = [row[f"auto_k_at_accept_{a}"] for a in (0.6, 0.8, 0.9)]
    assert all(0 <= k <= 15 for k in ks) and ks == sorted(
        ks
    )  # a surer drafter never gets a shorter block
    assert "| tiny | fp32 | bf16 |" in table(doc)
    plot([doc], tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_device_bench_batch_columns(tiny_shape, tmp_path):
    """Requests at once through a KV slot each, against one at a time on one slot: every
    client count reported, and each batched run's tokens counted against the one-slot ones."""
    from thor_app.tools.bench_device import run, table

    doc = run("cpu", [tiny_shape], "fp32", "bf16", 1, 4, None, weight_formats=False, clients=(1, 2))
    b = doc["rows"][0]["batch"]
    assert b["one_at_a_time_tok_s"] > 0
    for n in (1, 2):
        c = b[f"clients_{n}"]
        assert (
            c["tok_s"] > 0
            and c["speedup_vs_one_at_a_time"] > 0
            and c["latency_max_s"] >= c["latency_p50_s"] > 0
        )
        assert 0 <= c["same_tokens_as_one_slot"] <= n
    assert b["clients_1"]["same_tokens_as_one_slot"] == 1  # one client runs on the one slot
    assert "2 requests at once" in table(doc)
