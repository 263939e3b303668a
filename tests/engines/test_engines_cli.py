"""The command-line paths of the graph backends on tiny models: `thor plan --backend onnxruntime`
and `thor bench --backend torch,onnxruntime --engine-forms segments,fused`."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")

from tests.helpers.worlds import WORLDS  # noqa: E402
from thor_app.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def qwen2_long(tiny_qwen2_dir, tmp_path_factory):
    """The tiny Qwen2 (the planner default's architecture, q/k/v biases) with a 4k context: its
    320-token BPE spells the kitchen world's prompt in ~2k tokens."""
    d = tmp_path_factory.mktemp("qwen2_long") / "qwen2"
    shutil.copytree(tiny_qwen2_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(dict(cfg, max_position_embeddings=4096)))
    return d


def _plan(model, task, capsys, *extra) -> tuple[int, dict, str]:
    rc = main(
        [
            "plan",
            task,
            "--world",
            str(WORLDS["kitchen"]),
            "--model",
            str(model),
            "--no-thinking",
            "--attempts",
            "0",
            "--json",
            *extra,
        ]
    )
    cap = capsys.readouterr()
    return rc, json.loads(cap.out), cap.err


def test_plan_on_onnxruntime_is_valid_and_the_torch_plan(qwen2_long, tmp_path, capsys):
    task = "pick up the apple"
    cache = tmp_path / "engines"
    rc, got, err = _plan(
        qwen2_long,
        task,
        capsys,
        "--backend",
        "onnxruntime",
        "--engine-cache",
        str(cache),
        "--spec",
        "ngram",
    )
    # a random model's goal may be about a thing the task does not name: refused (exit 3), and
    # the same plan and verdict on either backend
    assert rc in (0, 3), err
    entries = [p for p in cache.iterdir() if (p / "manifest.json").is_file()]
    assert len(entries) == 1  # the plan ran on graphs built into the cache
    rc_torch, want, err = _plan(qwen2_long, task, capsys, "--spec", "none")
    assert rc_torch == rc, err
    assert got["plan"] == want["plan"]  # fp32: the torch reference's plan, token for token
    assert (got["valid"], got["report"]) == (want["valid"], want["report"])
    assert got["stats"]["generated_tokens"] == want["stats"]["generated_tokens"]


def test_bench_torch_vs_onnxruntime_both_forms(tiny_qwen2_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(
        [
            "bench",
            "--model",
            str(tiny_qwen2_dir),
            "--backend",
            "torch,onnxruntime",
            "--engine-forms",
            "segments,fused",
            "--configs",
            "fp32/fp32",
            "--repeats",
            "1",
            "--max-tokens",
            "8",
            "--prefill-tokens",
            "24",
            "--engine-cache",
            str(tmp_path / "engines"),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    rows = {r["engine"]: r for r in doc["rows"]}
    assert list(rows) == ["torch", "onnxruntime segments", "onnxruntime fused"]
    assert all(r["tokens_identical_to_first"] is True for r in rows.values())
    assert all(r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 for r in rows.values())
    assert rows["torch"]["decode_vs_first"] == 1.0
    table = capsys.readouterr().out
    assert "onnxruntime fused" in table and "tokens_identical_to_first" in table
