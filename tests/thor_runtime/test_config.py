"""One config tree, two spellings: the service's TOML keys and the CLI flags come from one field
table with the same defaults; one assembly builds the runtime from it; --device is checked
without torch and refused in one line where CUDA is absent; every --help stays torch-free."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest
import tomllib

from tests.helpers.paths import ROOT
from thor_app.assembly import build_runtime, with_settings
from thor_app.cli import build_parser, main
from thor_app.flags import config_from_args
from thor_app.server.config import RUNTIME_TABLES, config_from_dict
from thor_runtime.config import SECTIONS, ModelSettings, RuntimeConfig, meta, toml_fields
from thor_runtime.errors import ThorError

EXAMPLE = ROOT / "deploy" / "thor.toml.example"
# Keys only the service reads (the worlds and skills a request names): no command has them.
SERVICE_ONLY = {"planner.worlds_dir", "planner.skills_dir"}
# `thor plan` reads every runtime table the service reads, with no default of its own.
PLAN = ["plan", "a task", "--world", "w.json"]


def _plan_actions() -> dict:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    actions = {}
    for a in sub.choices["plan"]._actions:  # an alias (--no-thinking) comes after its flag
        actions.setdefault(a.dest, a)
    return actions


def test_every_toml_key_is_a_plan_flag_with_the_same_default():
    example = tomllib.loads(EXAMPLE.read_text())
    actions, parsed = _plan_actions(), config_from_args(build_parser().parse_args(PLAN))
    keys = [(t, f) for t in RUNTIME_TABLES for f in toml_fields(t)]
    assert len(keys) > 30
    for table, f in keys:
        key = f"{table}.{f.name}"
        assert example[table][f.name] == f.default, f"{key}: the example states another default"
        if key in SERVICE_ONLY:
            assert meta(f).flag is None
            continue
        action = actions.get(f"cfg__{table}__{f.name}")
        assert action is not None and meta(f).flag in action.option_strings, f"{key} has no flag"
        assert getattr(getattr(parsed, table), f.name) == example[table][f.name], key
    # and no table key is missing from the example
    assert {t: set(example[t]) for t in RUNTIME_TABLES} == {
        t: {f.name for f in toml_fields(t)} for t in RUNTIME_TABLES
    }


def test_a_flag_default_that_drifts_is_caught(monkeypatch):
    """The check above reads the parser: a command stating its own default shows up there."""
    from thor_app.commands import plan as plan_cmd

    real = plan_cmd.add_config_args
    monkeypatch.setattr(
        plan_cmd,
        "add_config_args",
        lambda p, sections, **kw: real(p, sections, defaults={"model.kv_dtype": "fp8"}, **kw),
    )
    with pytest.raises(AssertionError, match="model.kv_dtype"):
        test_every_toml_key_is_a_plan_flag_with_the_same_default()


def test_a_config_from_toml_equals_the_one_from_the_same_flags():
    doc = {
        "model": {
            "name": "some/dir",
            "dtype": "bf16",
            "device": "cpu",
            "kv_dtype": "fp8",
            "prefill_chunk": 64,
            "prefix_cache": 0,
            "weight_cache": "",
        },
        "engine": {"form": "fused", "threads": 2},
        "speculation": {
            "method": "ngram",
            "ngram_k": 5,
            "lookup_rate": 0.7,
            "seed_window": False,
            "fixed_k": True,
        },
        "planner": {"attempts": 1, "thinking": "off", "max_steps": 4, "max_tokens": 300},
    }
    argv = [
        *PLAN,
        "--model",
        "some/dir",
        "--dtype",
        "bf16",
        "--device",
        "cpu",
        "--kv-dtype",
        "fp8",
        "--prefill-chunk",
        "64",
        "--prefix-cache",
        "0",
        "--cache-dir",
        "",
        "--engine-form",
        "fused",
        "--engine-threads",
        "2",
        "--spec",
        "ngram",
        "--ngram-k",
        "5",
        "--lookup-rate",
        "0.7",
        "--no-window-seed",
        "--fixed-k",
        "--attempts",
        "1",
        "--no-thinking",
        "--max-steps",
        "4",
        "--max-tokens",
        "300",
    ]
    from_toml = config_from_dict(doc, "x.toml").runtime
    assert from_toml == config_from_args(build_parser().parse_args(argv))
    assert from_toml != RuntimeConfig() and from_toml.planner.think is False


def test_sections_state_each_default_once():
    """Every field of the tree has its help and, where spelled on the CLI, one flag name."""
    flags = [meta(f).flag for s in SECTIONS.values() for f in fields(s) if meta(f).flag]
    assert len(flags) == len(set(flags))
    assert all(meta(f).help for s in SECTIONS.values() for f in fields(s))


@pytest.mark.parametrize(
    "argv, words",
    [
        (["generate", "hi", "--prefill-chunk", "-1"], "--prefill-chunk must be >= 0"),
        (["plan", "t", "--world", "w.json", "--attempts", "9"], "--attempts must be <= 8"),
        (["generate", "hi", "--lookup-rate", "1.5"], "--lookup-rate: must be in (0, 1)"),
        (["generate", "hi", "--backend", "onnxruntime", "--dtype", "int8"], "not --dtype int8"),
        (["generate", "hi", "--device", "bogus"], "expected auto, cpu, cuda or cuda:N"),
        (["selftest", "--device", "gpu0"], "expected auto, cpu, cuda or cuda:N"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_the_flag(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("thor: error:") and words in err, err


def test_device_cuda_without_cuda_is_one_line_exit_2(capsys, tiny_dirs):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal cannot happen here")
    assert main(["generate", "hi", "--model", str(tiny_dirs["llama"]), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err and "--device cpu" in err, err


def test_device_spellings_are_normalized_without_torch():
    assert ModelSettings(device=" CUDA:1 ").device == "cuda:1"
    with pytest.raises(ThorError, match="model.device"):
        ModelSettings(device="tpu")


HELP_SCRIPT = """
import sys
from thor_app.cli import build_parser
subs = [[]]
for cmd in ("generate", "plan", "bench", "calib", "models", "engines", "selftest", "serve"):
    subs.append([cmd])
subs += [["engines", v] for v in ("build", "list", "verify", "prune")]
subs += [["calib", v] for v in ("gen-data", "distill", "draft-vocab", \
"eval-drafter", "kv-scales", "fp8-scales")]
for argv in subs:
    try:
        build_parser().parse_args(argv + ["--help"])
    except SystemExit as e:
        assert e.code == 0, argv
print("TORCH" if "torch" in sys.modules else "NO TORCH", len(subs))
"""


def test_every_help_answers_without_torch():
    out = subprocess.run(
        [sys.executable, "-c", HELP_SCRIPT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    ).stdout
    assert out.strip().splitlines()[-1] == "NO TORCH 19"


def test_the_assembly_builds_what_the_config_says(tiny_dirs):
    config = with_settings(
        RuntimeConfig(),
        model__name=str(tiny_dirs["llama"]),
        model__device="cpu",
        model__kv_dtype="bf16",
        model__prefix_cache=3,
        speculation__method="ngram",
        speculation__ngram_k=5,
    )
    a = build_runtime(config)
    assert str(a.device) == "cpu" and a.backend is None
    assert a.runtime.kv_dtype == "bf16" and a.runtime.prefixes.entries == 3
    assert a.speculation.name == "ngram" and a.speculation.k == 5


def test_the_service_loads_through_the_assembly_and_reports_its_device(tiny_dirs):
    from thor_app.server.host import default_loader, runtime_settings
    from thor_app.tools.bench import device_info

    cfg = config_from_dict(
        {
            "model": {"name": str(tiny_dirs["llama"]), "device": "cpu"},
            "speculation": {"method": "none"},
        }
    )
    settings = runtime_settings(default_loader(cfg), False)
    assert (
        settings["device"] == "cpu"
        and settings["speculation"] == "none"
        and settings["prefix_cache"] == 2
    )
    assert device_info(cfg.runtime)["model_device"] == "cpu"
    json.dumps(settings)


def test_config_flags_show_what_to_give_not_where_it_is_kept(capsys):
    """--help shows a config flag's value as a word (DEVICE, N, FILE) or its choices, never the
    argparse destination the flag is read back from (CFG__MODEL__DEVICE)."""
    for argv in (
        ["generate"],
        ["plan"],
        ["bench"],
        ["serve"],
        ["selftest"],
        ["engines", "build"],
        ["calib", "eval-drafter"],
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv + ["--help"])
    out = capsys.readouterr().out
    assert "CFG__" not in out
    for shown in (
        "--device DEVICE",
        "--prefill-chunk N",
        "--kv-scales FILE",
        "--lookup-rate X",
        "--model MODEL",
        "--kv-dtype {fp32,bf16,fp16,fp8}",
    ):
        assert shown in out, shown


def test_a_flag_that_turns_a_setting_off_says_so(capsys):
    """A setting that is on by default has a --no-... flag; its help says what the flag does
    (the setting's own help says what it does when on)."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--no-solver do not complete the steps from the plan's goal" in out
    assert "--no-window-seed do not seed the DFlash window" in out
