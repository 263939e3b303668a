"""The default model on a CUDA device: the largest pulled catalog model whose measured warm plan
meets the goal, each model timed once per device, sha256 and settings and the figure kept in
plan-latency.json. The timings here are made up (a function per test), the models are empty
files where a pulled model would lie: no GPU, no network."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from thor_runtime.catalog import CATALOG, model_path
from thor_runtime.errors import ThorError
from thor_runtime.model_choice import (
    CACHE_FILE,
    DEFAULT_MODEL,
    LatencyCache,
    Measured,
    choose_model,
    pulled_candidates,
)

Q05, Q15 = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
CARD = "NVIDIA Test Card"
SETTINGS = {"dtype": "auto", "speculation": "auto", "torch": "2.x"}


def _pull(root, *names):
    """An empty file where `thor models pull` leaves each model: pulled, as far as the rule can
    tell (it never opens one)."""
    for name in names:
        p = model_path(CATALOG[name], root)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")


class Timer:
    """A measurement with set figures (seconds, or the error it raises), recording what it was
    asked to time."""

    def __init__(self, seconds: dict):
        self.seconds, self.calls = seconds, []

    def __call__(self, entry):
        self.calls.append(entry.name)
        s = self.seconds[entry.name]
        if isinstance(s, Exception):
            raise s
        return Measured(s, 3)


def timer(q05, q15):
    return Timer({Q05: q05, Q15: q15})


def _choose(root, measure, goal=2.0, device=CARD, settings=SETTINGS, catalog=CATALOG, say=None):
    return choose_model(device, settings, goal, measure, root, catalog, say or (lambda s: None))


def test_the_largest_model_within_the_goal_is_chosen_and_the_smaller_never_timed(tmp_path):
    _pull(tmp_path, Q05, Q15)
    t = timer(0.4, 1.3)
    choice = _choose(tmp_path, t)
    assert choice.name == Q15 and choice.substituted
    assert t.calls == [Q15]  # largest first, and it met the goal: no reason to time the 0.5B
    assert "1.30 s" in choice.line and "2.00 s goal" in choice.line and CARD in choice.line


def test_a_large_model_over_the_goal_is_skipped_for_the_next(tmp_path):
    _pull(tmp_path, Q05, Q15)
    t = timer(0.4, 2.7)
    choice = _choose(tmp_path, t)
    assert choice.name == Q05 and t.calls == [Q15, Q05]
    assert choice.latencies == {Q15: 2.7, Q05: 0.4}
    assert f"{Q15} 2.70 s" in choice.line  # the line says why the larger one lost


def test_the_goal_is_a_bound_not_a_rounding(tmp_path):
    _pull(tmp_path, Q05, Q15)
    assert _choose(tmp_path, timer(0.4, 2.0)).name == Q15  # at the goal meets it
    (tmp_path / CACHE_FILE).unlink()
    assert _choose(tmp_path, timer(0.4, 2.0001)).name == Q05


def test_none_within_the_goal_keeps_the_default_and_says_the_figures(tmp_path):
    _pull(tmp_path, Q05, Q15)
    choice = _choose(tmp_path, timer(2.5, 6.0))
    assert choice.name == DEFAULT_MODEL and not choice.substituted
    assert f"{Q15} 6.00 s" in choice.line and f"{Q05} 2.50 s" in choice.line


def test_nothing_pulled_keeps_the_default_without_timing_anything(tmp_path):
    t = timer(0.1, 0.1)
    choice = _choose(tmp_path, t)
    assert choice.name == DEFAULT_MODEL and t.calls == []
    assert "no catalog model is pulled" in choice.line
    assert not (tmp_path / CACHE_FILE).exists()


def test_only_pulled_models_are_candidates_largest_first(tmp_path):
    _pull(tmp_path, Q05)
    assert [m.name for m in pulled_candidates(tmp_path)] == [Q05]
    _pull(tmp_path, Q15)
    assert [m.name for m in pulled_candidates(tmp_path)] == [Q15, Q05]
    assert CATALOG[Q15].size > CATALOG[Q05].size


def test_a_goal_of_zero_turns_the_choice_off(tmp_path):
    _pull(tmp_path, Q05, Q15)
    t = timer(0.1, 0.1)
    choice = _choose(tmp_path, t, goal=0.0)
    assert choice.name == DEFAULT_MODEL and t.calls == [] and "latency_goal_s is 0" in choice.line


def test_a_model_that_cannot_be_measured_is_skipped_with_its_reason(tmp_path):
    _pull(tmp_path, Q05, Q15)
    t = timer(0.4, ThorError("out of GPU memory while loading or planning"))
    choice = _choose(tmp_path, t)
    assert choice.name == Q05 and "out of GPU memory" in choice.line
    # nothing is kept for the failed one: the next run tries it again
    kept = json.loads((tmp_path / CACHE_FILE).read_text())["measurements"]
    assert [e["model"] for e in kept] == [Q05]


# ---- the cache ---------------------------------------------------------------------------------
def test_figures_are_kept_and_reused_without_measuring_again(tmp_path):
    _pull(tmp_path, Q05, Q15)
    first = _choose(tmp_path, timer(0.4, 2.7))
    assert first.measured == (Q15, Q05)
    doc = json.loads((tmp_path / CACHE_FILE).read_text())  # plain, readable JSON
    assert doc["format"] == 1
    assert {(e["model"], e["latency_s"], e["device"]) for e in doc["measurements"]} == {
        (Q15, 2.7, CARD),
        (Q05, 0.4, CARD),
    }
    assert all(e["sha256"] == CATALOG[e["model"]].sha256 for e in doc["measurements"])
    again = timer(9.0, 9.0)  # a second measurement would change the answer
    second = _choose(tmp_path, again)
    assert again.calls == [] and second.measured == ()
    assert second.name == Q05 and "measured before" in second.line


@pytest.mark.parametrize(
    "change",
    [
        {"device": "NVIDIA Other Card"},
        {"settings": {**SETTINGS, "dtype": "fp16"}},
        {"catalog": "another sha256"},
    ],
    ids=["device", "settings", "sha256"],
)
def test_a_figure_is_reused_only_for_the_same_device_settings_and_bytes(tmp_path, change):
    _pull(tmp_path, Q05)
    _choose(tmp_path, timer(0.4, None))
    kw = dict(change)
    if "catalog" in kw:
        kw["catalog"] = {Q05: replace(CATALOG[Q05], sha256="ab" * 32)}
    t = timer(0.5, None)
    choice = _choose(tmp_path, t, **kw)
    assert t.calls == [Q05] and choice.latencies == {Q05: 0.5}
    # both figures are kept: switching back measures nothing
    assert len(json.loads((tmp_path / CACHE_FILE).read_text())["measurements"]) == 2
    back = timer(9.0, None)
    assert _choose(tmp_path, back).latencies == {Q05: 0.4} and back.calls == []


def test_the_cache_is_replaced_atomically_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    import thor_runtime.fileio as fileio

    _pull(tmp_path, Q05, Q15)
    _choose(tmp_path, timer(0.4, 2.7))
    path = tmp_path / CACHE_FILE
    before = path.read_bytes()

    def power_cut(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(fileio.os, "fsync", power_cut)  # the write dies before its rename
    said = []
    choice = _choose(tmp_path, timer(0.3, 1.0), device="NVIDIA Other Card", say=said.append)
    assert choice.name == Q15  # this run's own figure stands
    assert path.read_bytes() == before  # the old file, whole: never a half-written one
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CACHE_FILE, Q05, Q15])
    assert any("not written" in s for s in said)


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"format": 1, "measurements": [', "not valid JSON"),
        ("[]", "not format 1"),
        ('{"format": 99, "measurements": []}', "not format 1"),
        ('{"format": 1, "measurements": [{"model": "x"}]}', "lacks a field"),
        (b"\xff\xfe\x00", "not valid JSON"),
    ],
    ids=["truncated", "a list", "another format", "an entry cut short", "not text"],
)
def test_a_corrupt_cache_is_measured_again_and_replaced(tmp_path, text, why):
    _pull(tmp_path, Q05)
    path = tmp_path / CACHE_FILE
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    said, t = [], timer(0.4, None)
    choice = _choose(tmp_path, t, say=said.append)
    assert choice.name == Q05 and t.calls == [Q05]
    assert any(why in s and "measuring again" in s for s in said), said
    assert LatencyCache(path).problem == "" and len(LatencyCache(path).entries) == 1


# a string would compare wrongly to the goal; no plan takes no time
@pytest.mark.parametrize("bad", ["0.4", -1.0, 0, True])
def test_a_figure_that_is_no_time_is_not_trusted(tmp_path, bad):
    _pull(tmp_path, Q05)
    _choose(tmp_path, timer(0.4, None))
    path = tmp_path / CACHE_FILE
    doc = json.loads(path.read_text())
    doc["measurements"][0]["latency_s"] = bad
    path.write_text(json.dumps(doc))
    assert "wrong value" in LatencyCache(path).problem
    t = timer(0.6, None)
    assert _choose(tmp_path, t).latencies == {Q05: 0.6} and t.calls == [Q05]
