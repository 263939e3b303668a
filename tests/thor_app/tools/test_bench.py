"""`thor bench` runs end to end on a tiny model and reports what it claims."""

from __future__ import annotations

import json

from thor_app.cli import main


def test_bench_json_and_table(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(
        [
            "bench",
            "--model",
            str(tiny_dirs["llama"]),
            "--configs",
            "fp32/fp32,fp32/fp8",
            "--spec",
            "none,ngram",
            "--repeats",
            "1",
            "--max-tokens",
            "16",
            "--prefill-tokens",
            "32",
            "--no-baseline",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert {"cpu", "torch"} <= set(doc["device"])
    rows = {(r["kv"], r["spec"]): r for r in doc["rows"]}
    assert set(rows) == {("fp32", "none"), ("fp32", "ngram"), ("fp8", "none"), ("fp8", "ngram")}
    assert rows[("fp32", "ngram")]["tokens_identical_to_plain"] is True
    assert rows[("fp8", "ngram")]["tokens_identical_to_plain"] is True
    # identical tokens pass the losslessness gate with no divergences to explain
    assert (
        rows[("fp32", "ngram")]["gate"] == "identical"
        and rows[("fp32", "ngram")]["lossless"] is True
    )
    assert rows[("fp32", "ngram")]["divergences"] == []
    assert "greedy_agreement_vs_fp32_kv" in rows[("fp8", "none")]
    assert all(r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 for r in doc["rows"])
    table = capsys.readouterr().out
    assert "decode_tok_s" in table and "ngram" in table


def test_bench_rejects_bad_configs(capsys):
    assert main(["bench", "--configs", "fp64/fp32"]) == 2
    assert "fp64/fp32" in capsys.readouterr().err


def test_bench_specs_take_turns_and_keep_one_speculation_each(tiny_dirs, tmp_path, monkeypatch):
    """Each chat prompt runs under every spec before the next one (the first spec rotating),
    and a spec's speculation is the same object all run long (auto learns across prompts)."""
    from thor_runtime.engine.generate import Runtime

    calls, real = [], Runtime.generate

    def spy(self, ids, params=None, speculation=None, *a, **k):
        if params is not None and params.max_tokens == 12:
            calls.append(speculation)
        return (
            real(self, ids, params, speculation, *a, **k)
            if speculation is not None
            else real(self, ids, params)
        )

    monkeypatch.setattr(Runtime, "generate", spy)
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--model",
                str(tiny_dirs["llama"]),
                "--configs",
                "fp32/fp32",
                "--spec",
                "none,ngram,auto",
                "--repeats",
                "2",
                "--max-tokens",
                "12",
                "--prefill-tokens",
                "16",
                "--no-baseline",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    prompts = 3
    assert len(calls) == 2 * prompts * 3 and len({id(c) for c in calls}) == 3
    turns = [calls[i : i + 3] for i in range(0, len(calls), 3)]
    assert all(len({id(c) for c in t}) == 3 for t in turns)  # every spec once per prompt
    firsts = [id(t[0]) for t in turns]
    assert len(set(firsts[:3])) == 3  # the first spec rotates
    rows = {r["spec"]: r for r in json.loads(out.read_text())["rows"]}
    assert (
        rows["ngram"]["tokens_identical_to_plain"] is True
        and rows["auto"]["tokens_identical_to_plain"] is True
    )
