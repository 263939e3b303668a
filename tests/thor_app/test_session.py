"""The plan session (thor_app/session.py): what lives across plans. Its planners take the config's
planner settings and its world starts; each prompt start is attached once; what auto learned is
read once and written after a plan, at most as often as the session says, and a failed write is
said, never raised; a bench hands it from one session to the next in memory."""

from __future__ import annotations

import json

import pytest

import thor_runtime.speculative
from agent.planner import Planner, specialize_request
from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import good_plan, world_and_skills
from thor_app import session as session_mod
from thor_app.assembly import assembled_with, with_settings
from thor_app.session import PlanSession
from thor_runtime.config import RuntimeConfig

TASK = "put the apple on the table"


class Shelf:
    """World starts that record their flushes and report ``problems`` each time."""

    def __init__(self, problems=()):
        self.flushes, self.problems = 0, list(problems)

    @staticmethod
    def usable(runtime) -> bool:  # a scripted runtime keeps no prompts
        return False

    def flush(self):
        self.flushes += 1
        return self.problems


def _config(**planner):
    base = with_settings(RuntimeConfig(), speculation__method="none", planner__thinking="off")
    return with_settings(base, **{f"planner__{k}": v for k, v in planner.items()})


def _session(tiny, plans: int = 0, config=None, **kw):
    """A session over a scripted runtime that answers ``plans`` good plans."""
    rt = ScriptedRuntime(tiny.tokenizer, [json.dumps(good_plan())] * plans)
    kw.setdefault("shelf", None)
    return PlanSession(assembled_with(config or _config(), tiny, rt), **kw)


@pytest.fixture
def saves(monkeypatch):
    """save_auto_state recorded (and raising what ``saves.error`` holds)."""
    calls = []

    def save(rt, speculation):
        calls.append(rt)
        if getattr(save, "error", None) is not None:
            raise save.error

    save.calls = calls
    monkeypatch.setattr(thor_runtime.speculative, "save_auto_state", save)
    return save


def test_its_planners_take_the_config_settings_and_its_world_starts(tiny_llama):
    shelf = Shelf()
    s = _session(tiny_llama, config=_config(max_tokens=64, attempts=1, solver=False), shelf=shelf)
    p = s.planner()
    assert isinstance(p, Planner) and p.rt is s.runtime and p.speculation is s.speculation
    assert (p.max_tokens, p.attempts, p.solver, p.shelf, p.thinking) == (64, 1, False, shelf, False)
    view = object()
    q = s.planner(view, max_tokens=32, attempts=0)  # a request's own settings, a view of it
    assert (q.rt, q.max_tokens, q.attempts, q.shelf) == (view, 32, 0, shelf)
    assert _session(tiny_llama, shelf=None).planner().shelf is None


def test_the_world_starts_are_the_configs_unless_given(tiny_llama, tmp_path):
    config = with_settings(_config(), model__weight_cache=str(tmp_path), model__world_starts=3)
    s = _session(tiny_llama, config=config, shelf=session_mod.FROM_CONFIG)
    assert s.shelf.dir == tmp_path / "prefixes" / "worlds" and s.shelf.limit == 3
    off = with_settings(config, model__weight_cache="")
    assert _session(tiny_llama, config=off, shelf=session_mod.FROM_CONFIG).shelf is None


def test_a_plan_specialized_before_the_model_loaded_is_compiled_and_planned(tiny_llama, saves):
    w, sk = world_and_skills("kitchen")
    s = _session(tiny_llama, plans=2, shelf=Shelf())
    res = s.plan(specialize_request(TASK, w, sk))
    assert res.valid and res.plan == good_plan() and s.shelf.flushes == 0 and saves.calls == []
    s.after_plan()  # once the plan is out: the world starts and what auto learned
    assert s.shelf.flushes == 1 and saves.calls == [s.runtime]
    # the same session's own planner for the next plan, a task with its world this time
    assert s.plan(TASK, w, sk).valid and s._planner is not None


def test_what_cannot_be_stored_is_said_never_raised(tiny_llama, saves):
    said, warned = [], []
    s = _session(tiny_llama, shelf=Shelf(["disk full"]), log=said.append, warn=warned.append)
    saves.error = OSError(28, "No space left on device")
    s.after_plan()
    assert warned == [
        "world start not stored: disk full",
        "what --spec auto learned was not stored: No space left on device",
    ]
    assert said == []
    quiet = _session(tiny_llama, shelf=Shelf(["disk full"]))  # no log: silent
    quiet.after_plan()
    alone = []
    _session(tiny_llama, shelf=Shelf(["x"]), log=alone.append).after_plan()  # warn: the log
    assert alone[0] == "world start not stored: x"


def test_what_auto_learned_is_written_at_most_as_often_as_asked(tiny_llama, saves):
    every = _session(tiny_llama)
    every.after_plan(), every.after_plan()
    assert len(saves.calls) == 2  # `thor plan`: after its plan
    saves.calls.clear()
    service = _session(tiny_llama, save_every_s=60.0)
    for _ in range(3):
        service.after_plan()
    assert len(saves.calls) == 1  # the first plan writes, then once a minute
    service._saved_at -= 60.0
    service.after_plan()
    assert len(saves.calls) == 2
    saves.calls.clear()
    _session(tiny_llama, keep_learned=False).after_plan()
    assert saves.calls == []  # a bench hands it on in memory instead


def test_what_auto_learned_is_read_once(tiny_llama, monkeypatch):
    reads = []
    monkeypatch.setattr(
        thor_runtime.speculative, "load_auto_state", lambda rt, speculation: reads.append(rt) or 3
    )
    s = _session(tiny_llama)
    assert s.load_learned() == 3 and s.load_learned() == 0 and reads == [s.runtime]


def test_a_new_session_resumes_from_what_the_last_learned(tiny_llama):
    def auto_session():
        config = with_settings(_config(), speculation__method="auto")
        return _session(tiny_llama, config=config)

    first = auto_session()
    assert first.speculation.auto is not None
    first.speculation.auto.step_s = 0.0123
    learned = first.learned()
    assert json.loads(json.dumps(learned)) == learned  # as its file holds it
    second = auto_session()
    assert second.speculation.auto.step_s != 0.0123
    assert second.resume(learned) > 0 and second.speculation.auto.step_s == 0.0123
    assert second.load_learned() == 0  # resumed: nothing read from disk
    plain = _session(tiny_llama)
    assert plain.learned() is None and plain.resume(None) == 0


def test_each_prompt_start_is_attached_once(tiny_llama, monkeypatch, tmp_path):
    from agent.files.loader import DEFAULT_SKILLS, skills_from_dict

    attached = []
    monkeypatch.setattr(
        session_mod,
        "attach_prefix",
        lambda rt, tok, skills, d, log: (
            attached.append((skills.source, d)) or {"source": "built", "tokens": len(attached)}
        ),
    )
    config = with_settings(_config(), model__weight_cache=str(tmp_path))
    s = _session(tiny_llama, config=config)
    _, manipulation = world_and_skills("kitchen")
    _, mobile = world_and_skills("warehouse")
    same = skills_from_dict(json.loads(DEFAULT_SKILLS.read_text()), "another file, the same skills")
    assert s.attach(manipulation) == {"source": "built", "tokens": 1}
    assert s.attach(same) is s.attach(manipulation)  # one start, whatever file it came from
    s.attach(mobile)
    assert [d for _, d in attached] == [tmp_path / "prefixes"] * 2 and len(s.starts) == 2
