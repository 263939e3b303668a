"""Shipped drafters are found per target, and a drafter trained on another planner request
format is stale: said on stderr at load, declined by ``auto``, run as asked by dflash/combined.

Tiny random targets and drafters throughout; the last test holds every drafter shipped under
thor_runtime/drafters/ to today's plan format.
"""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import pytest
import torch

from agent.planner.plan_format import plan_format_fingerprint, stale_reason
from tests.helpers.tiny import random_drafter
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.speculative import SpecOptions, build_speculation, shipped
from thor_runtime.speculative.combined import CombinedProposer
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.dflash_io import save_drafter
from thor_runtime.speculative.ngram import NgramProposer

OTHER = "sha256:" + "0" * 64


def stamped(target_cfg, path, plan_format: str, target_weights: str = "fp32", seed: int = 0):
    """A tiny random drafter for ``target_cfg`` whose config records ``plan_format``."""
    d = random_drafter(target_cfg, block_size=4, num_taps=2, seed=seed)
    d.cfg = dataclasses.replace(d.cfg, plan_format=plan_format, target_weights=target_weights)
    save_drafter(d, path)
    return path


@pytest.fixture
def drafters_root(tmp_path, monkeypatch):
    """An empty shipped-drafters directory in place of thor_runtime/drafters/."""
    root = tmp_path / "drafters"
    root.mkdir()
    monkeypatch.setattr(shipped, "DRAFTERS_DIR", root)
    return root


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(shipped, "_warned", set())


def other_target(model):
    return SimpleNamespace(
        cfg=SimpleNamespace(name="another-model", hidden_size=model.cfg.hidden_size),
        quant=None,
        dtype=torch.float32,
    )


# ---------------------------------------------------------------- (a) current: used
def test_shipped_drafter_is_found_per_target_and_auto_uses_a_current_one(
    tiny_llama, drafters_root, capsys
):
    model, fp = tiny_llama.model, plan_format_fingerprint()
    stamped(
        tiny_llama.cfg, drafters_root / "a-int4", fp, target_weights="int4"
    )  # another weight kind
    stamped(tiny_llama.cfg, drafters_root / "b-any", fp, target_weights="")  # any weight kind
    stamped(tiny_llama.cfg, drafters_root / "c-fp32", fp, target_weights="fp32")  # exactly this one
    (drafters_root / "notes").mkdir()  # no config: not a drafter
    assert [d.name for d in shipped.shipped_drafters()] == ["a-int4", "b-any", "c-fp32"]
    assert shipped.drafter_for(model).name == "c-fp32"  # an exact weight kind first
    low = SimpleNamespace(cfg=model.cfg, quant="int4", dtype=model.dtype)
    assert shipped.drafter_for(low).name == "a-int4"
    assert (
        shipped.drafter_for(SimpleNamespace(cfg=model.cfg, quant="int8", dtype=model.dtype)).name
        == "b-any"
    )

    sp = build_speculation(SpecOptions("auto"), model, plan_format=fp)
    assert isinstance(sp.proposer, CombinedProposer) and sp.note == "" and sp.k == 3
    assert isinstance(sp.free_text.proposer, NgramProposer)
    sp = build_speculation(SpecOptions("dflash"), model, plan_format=fp)
    assert isinstance(sp.proposer, DFlashProposer) and sp.note == ""
    assert capsys.readouterr().err == ""  # nothing to warn about
    given = stamped(tiny_llama.cfg, drafters_root.parent / "given", fp, seed=1)
    assert isinstance(
        build_speculation(SpecOptions("auto", drafter=str(given)), model, plan_format=fp).proposer,
        CombinedProposer,
    )


def test_a_target_without_a_shipped_drafter(tiny_llama, drafters_root):
    stamped(tiny_llama.cfg, drafters_root / "mine", plan_format_fingerprint())
    other = other_target(tiny_llama.model)
    sp = build_speculation(SpecOptions("auto"), other, plan_format=plan_format_fingerprint())
    assert (
        isinstance(sp.proposer, NgramProposer) and sp.note == ""
    )  # the ordinary case: nothing declined
    for method in ("dflash", "combined"):
        with pytest.raises(
            ThorError,
            match=r"no shipped DFlash drafter for the target 'another-model' "
            r"\(fp32 weights.*shipped: mine \(for '.*', fp32 weights\)",
        ):
            build_speculation(SpecOptions(method), other)


# ---------------------------------------------------------------- (b) another format: stale
def test_a_stale_drafter_is_declined_by_auto_and_run_by_dflash(tiny_llama, tmp_path, capsys):
    model, fp = tiny_llama.model, plan_format_fingerprint()
    path = str(stamped(tiny_llama.cfg, tmp_path / "old", OTHER))
    reason = stale_reason(OTHER)
    assert reason and shipped.format_stale(OTHER, fp) == reason

    auto = build_speculation(SpecOptions("auto", drafter=path), model, plan_format=fp)
    assert isinstance(auto.proposer, NgramProposer) and auto.proposer.cfg.min_n == 2
    assert auto.free_text is not None  # free text keeps its own lookup
    assert path in auto.note and reason in auto.note and "declined" in auto.note
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("thor: warning: DFlash drafter ")
    assert (
        path in err[0]
        and reason in err[0]
        and "prompt lookup" in err[0]
        and "thor calib distill" in err[0]
    )

    for method, kind in (("dflash", DFlashProposer), ("combined", CombinedProposer)):
        sp = build_speculation(SpecOptions(method, drafter=path), model, plan_format=fp)
        assert isinstance(sp.proposer, kind) and reason in sp.note
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1
            and f"running it as asked (--spec {method})" in err[0]
            and reason in err[0]
        )
    # the same drafter again: reported once per process, not per build
    build_speculation(SpecOptions("dflash", drafter=path), model, plan_format=fp)
    assert capsys.readouterr().err == ""

    # the stats of what ran carry the note (a plan's stats merge it from their attempts)
    from agent.planner.planner import merge_stats

    ids = tiny_llama.tokenizer.encode("pick up the red cup")
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    res = Runtime(model, tiny_llama.tokenizer).generate(ids, params, sp)
    assert (
        res.stats.to_dict()["spec_note"] == sp.note == merge_stats([res.stats, res.stats]).spec_note
    )
    assert (
        Runtime(model, tiny_llama.tokenizer).generate(ids, params).stats.to_dict()["spec_note"]
        == ""
    )


def test_no_plan_format_is_stale_for_the_planner_and_fine_for_free_text(
    tiny_llama, tmp_path, capsys
):
    """A drafter that records none (distilled before fingerprints, or a z-lab one) is stale only
    where the caller plans; a caller that does not (plan_format None) is not warned."""
    model = tiny_llama.model
    path = str(stamped(tiny_llama.cfg, tmp_path / "unstamped", ""))
    sp = build_speculation(SpecOptions("auto", drafter=path), model)
    assert (
        isinstance(sp.proposer, CombinedProposer)
        and sp.note == ""
        and capsys.readouterr().err == ""
    )
    sp = build_speculation(
        SpecOptions("auto", drafter=path), model, plan_format=plan_format_fingerprint()
    )
    assert isinstance(sp.proposer, NgramProposer) and "records no plan format" in sp.note
    assert "records no plan format" in capsys.readouterr().err


def test_assembly_hands_the_plan_format_to_planning_runtimes(tiny_llama, tmp_path, capsys):
    from thor_app.assembly import build_speculation as assembled
    from thor_app.assembly import with_settings
    from thor_runtime.config import RuntimeConfig

    path = str(stamped(tiny_llama.cfg, tmp_path / "old", OTHER))
    config = with_settings(RuntimeConfig(), speculation__method="auto", speculation__drafter=path)
    sp = assembled(config, tiny_llama)  # `thor plan`, the service
    assert isinstance(sp.proposer, NgramProposer) and stale_reason(OTHER) in sp.note
    assert "stale for the planner" in capsys.readouterr().err
    sp = assembled(config, tiny_llama, plans=False)  # `thor generate`: free text only
    assert isinstance(sp.proposer, CombinedProposer) and sp.note == ""


# ---------------------------------------------------------------- (c) the format moves
def test_a_changed_prompt_format_makes_a_drafter_stale(tiny_llama, tmp_path, monkeypatch, capsys):
    import agent.planner.prompt

    before = plan_format_fingerprint()
    path = str(stamped(tiny_llama.cfg, tmp_path / "then", before))
    assert isinstance(
        build_speculation(
            SpecOptions("auto", drafter=path), tiny_llama.model, plan_format=before
        ).proposer,
        CombinedProposer,
    )
    original = agent.planner.prompt.shared_instructions
    monkeypatch.setattr(
        agent.planner.prompt, "shared_instructions", lambda skills: original(skills) + "\nBe brief."
    )
    plan_format_fingerprint.cache_clear()
    try:
        now = plan_format_fingerprint()
        assert now != before and stale_reason(before) is not None
        sp = build_speculation(SpecOptions("auto", drafter=path), tiny_llama.model, plan_format=now)
        assert isinstance(sp.proposer, NgramProposer) and stale_reason(before) in sp.note
        assert stale_reason(before) in capsys.readouterr().err
    finally:
        monkeypatch.undo()
        plan_format_fingerprint.cache_clear()
    assert plan_format_fingerprint() == before


# ---------------------------------------------------------------- (d) the drafters we ship
def retrain_commands(readme) -> str:
    """The `thor calib` commands in a drafter's README (how it was made)."""
    text = readme.read_text() if readme.is_file() else ""
    blocks = re.findall(r"```\n(.*?)```", text, flags=re.S)
    lines = [b.strip() for b in blocks if "thor calib" in b]
    return (
        "\n".join(lines)
        or "(no commands in the README: `thor calib gen-data --constrained`, "
        "then `thor calib distill`)"
    )


def test_shipped_drafters_match_plan_format():
    """Every shipped drafter was distilled on the planner's current request format. When this
    fails after a change to the planner's prompt, schema or grammar options, the drafter named
    here drafts a document the planner no longer writes (``auto`` declines it): retrain it."""
    dirs = sorted(p.parent for p in shipped.DRAFTERS_DIR.glob("*/config.json"))
    assert dirs, f"no drafters shipped under {shipped.DRAFTERS_DIR}"
    current, stale = plan_format_fingerprint(), []
    for d in dirs:
        doc = json.loads((d / "config.json").read_text())
        reason = stale_reason(doc.get("plan_format", ""))
        if reason is not None:
            commands = retrain_commands(d / "README.md").replace("\n", "\n    ")
            stale.append(
                f"{d.name}: {reason}.\n  Retrain it as its README.md says (gen-data stamps the "
                f"data with the current format, distill copies it into config.json), then copy "
                f"the drafter's files into thor_runtime/drafters/{d.name}/:\n    {commands}"
            )
    assert not stale, f"shipped drafters stale for plan format {current}:\n" + "\n".join(stale)
