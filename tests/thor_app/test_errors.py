"""Bad input: one clear line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from thor_app.cli import main


def _run(capsys, *argv):
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _assert_clean_error(rc, err, *needles):
    assert rc == 2
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_model_path(capsys, tmp_path):
    rc, _, err = _run(capsys, "generate", "hi", "--model", str(tmp_path / "nope"))
    _assert_clean_error(rc, err, "not found", "nope")


def test_truncated_safetensors(capsys, tiny_dirs, tmp_path):
    d = tmp_path / "trunc"
    shutil.copytree(tiny_dirs["llama"], d)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    rc, _, err = _run(capsys, "generate", "hi", "--model", str(d))
    _assert_clean_error(rc, err, "model.safetensors")


def test_pickle_weights_refused(capsys, tiny_dirs, tmp_path):
    d = tmp_path / "pickled"
    shutil.copytree(tiny_dirs["llama"], d)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    rc, _, err = _run(capsys, "generate", "hi", "--model", str(d))
    _assert_clean_error(rc, err, "pickle", "pytorch_model.bin")
    rc, _, err = _run(capsys, "generate", "hi", "--model", str(d / "pytorch_model.bin"))
    _assert_clean_error(rc, err, "pickle")


def test_unknown_architecture(capsys, tiny_dirs, tmp_path):
    d = tmp_path / "arch"
    shutil.copytree(tiny_dirs["llama"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    rc, _, err = _run(capsys, "generate", "hi", "--model", str(d))
    _assert_clean_error(rc, err, "unknown architecture", "MambaForCausalLM")


def test_shape_mismatch_names_the_tensor(capsys, tiny_dirs, tmp_path):
    d = tmp_path / "shape"
    shutil.copytree(tiny_dirs["llama"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] += 8
    (d / "config.json").write_text(json.dumps(cfg))
    rc, _, err = _run(capsys, "generate", "hi", "--model", str(d))
    _assert_clean_error(rc, err, "model.layers.0.mlp.gate_proj.weight", "shape")


def test_unsupported_gguf_tensor_type(capsys, tiny_llama, tmp_path):
    from pathlib import Path

    import gguf

    from tests.helpers.gguf_writer import write_tiny_gguf
    from thor_runtime.loading.hf_weights import hf_weights

    cfg = tiny_llama.cfg
    rows, cols = cfg.num_heads * cfg.head_dim, cfg.hidden_size
    bad = {
        "blk.0.attn_q.weight": (
            np.zeros((rows, cols // 32 * 40), dtype=np.uint8),
            gguf.GGMLQuantizationType.Q8_1,
        )
    }
    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path, cfg, hf_weights(Path(tiny_llama.source)), override=bad)
    from thor_runtime.errors import ThorError
    from thor_runtime.loading.gguf_weights import gguf_config, gguf_weights, open_reader

    r = open_reader(path)
    with pytest.raises(ThorError, match="blk.0.attn_q.weight has unsupported GGUF type Q8_1"):
        gguf_weights(r, gguf_config(r, path), path)


def test_not_a_gguf_file(capsys, tmp_path):
    p = tmp_path / "junk.gguf"
    p.write_bytes(b"GGUF" + b"\x00" * 10)
    rc, _, err = _run(capsys, "generate", "hi", "--model", str(p))
    _assert_clean_error(rc, err, "junk.gguf")


def test_prompt_longer_than_context(capsys, tiny_dirs):
    rc, _, err = _run(
        capsys, "generate", "pick up the cup " * 400, "--model", str(tiny_dirs["llama"])
    )
    _assert_clean_error(rc, err, "context")


def test_bad_flag_values(capsys, tiny_dirs):
    rc, _, err = _run(
        capsys, "generate", "hi", "--model", str(tiny_dirs["llama"]), "--max-tokens", "0"
    )
    _assert_clean_error(rc, err, "max-tokens")
    rc, _, err = _run(capsys, "generate", "hi", "--kv-dtype", "int3")
    _assert_clean_error(rc, err, "kv-dtype")
    rc, _, err = _run(
        capsys, "generate", "hi", "--model", str(tiny_dirs["llama"]), "--temperature", "-1"
    )
    _assert_clean_error(rc, err, "temperature")


def test_kv_scales_file_checked(capsys, tiny_dirs, tmp_path):
    p = tmp_path / "scales.json"
    p.write_text(json.dumps({"format": "thor-kv-scales/1", "k": [[1.0]], "v": [[1.0]]}))
    rc, _, err = _run(
        capsys,
        "generate",
        "hi",
        "--model",
        str(tiny_dirs["llama"]),
        "--kv-dtype",
        "fp8",
        "--kv-scales",
        str(p),
    )
    _assert_clean_error(rc, err, "scales", "match")


def test_generate_json_output(capsys, tiny_dirs):
    rc, out, _ = _run(
        capsys,
        "generate",
        "pick up",
        "--model",
        str(tiny_dirs["llama"]),
        "--json",
        "--max-tokens",
        "8",
        "--kv-dtype",
        "fp8",
        "--chat",
    )
    assert rc == 0
    doc = json.loads(out)
    assert set(doc) >= {"text", "token_ids", "prompt_tokens", "stats"}
    assert set(doc["stats"]) >= {"ttft_s", "prefill_tok_s", "decode_tok_s", "kv_dtype", "kv_bytes"}
    assert doc["stats"]["kv_dtype"] == "fp8" and 1 <= len(doc["token_ids"]) <= 8
