"""The plan session's request log (thor_app/session.py over calib/request_log.py): off unless the
config names a directory, and then one record per plan, whatever form the request came in; a
log that cannot be written is said, never raised: the plan is out either way."""

from __future__ import annotations

import json

from agent.planner import specialize_request
from calib import request_log
from calib.request_log import doc_hash, read_log, world_doc
from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import good_plan, world_and_skills
from thor_app.assembly import assembled_with, with_settings
from thor_app.session import PlanSession
from thor_runtime.config import RuntimeConfig

TASK = "put the apple on the table"


def _session(tiny, plans=1, **planner):
    config = with_settings(
        RuntimeConfig(),
        speculation__method="none",
        planner__thinking="off",
        **{f"planner__{k}": v for k, v in planner.items()},
    )
    rt = ScriptedRuntime(tiny.tokenizer, [json.dumps(good_plan())] * plans)
    said = []
    s = PlanSession(assembled_with(config, tiny, rt), log=said.append, shelf=None)
    return s, said


def test_off_by_default(tiny_llama, monkeypatch):
    assert RuntimeConfig().planner.log_requests == ""

    def refuse(*a, **kw):
        raise AssertionError("no request log unless one is configured")

    monkeypatch.setattr(request_log, "RequestLog", refuse)
    s, said = _session(tiny_llama)
    assert s.requests is None and s.plan(TASK, *world_and_skills("kitchen")).valid
    assert not any("logging" in line for line in said)


def test_one_record_per_plan_in_any_form(tiny_llama, tmp_path):
    s, said = _session(tiny_llama, plans=6, log_requests=str(tmp_path / "log"))
    assert said == [f"logging plan requests to {tmp_path / 'log'} (at most 64 MiB)"]
    w, sk = world_and_skills("kitchen")
    assert s.plan(specialize_request(TASK, w, sk)).valid  # as `thor plan` and the service do
    assert s.plan("open the drawer", w, sk) is not None  # a task with its world and skills
    got, skipped = read_log(tmp_path / "log")
    assert skipped == 0 and [g.task for g in got] == [TASK, "open the drawer"]
    rec = got[0].record
    assert rec["model"] == "default" and rec["valid"] is True and rec["attempts"] == 1
    assert json.loads(rec["response"]) == good_plan()  # the model's own text
    assert rec["world"] == doc_hash(world_doc(w)) and got[0].world == world_doc(w)


def test_a_log_that_cannot_be_written_is_said_never_raised(tiny_llama, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    s, said = _session(tiny_llama, log_requests=str(blocked / "log"))
    assert s.requests is None and said[0].startswith("plan requests are not logged:")
    s, said = _session(tiny_llama, log_requests=str(tmp_path / "log"))

    def full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s.requests, "append", full)
    assert s.plan(TASK, *world_and_skills("kitchen")).valid
    assert said[-1] == "plan request not logged: No space left on device"
