"""A plan request is prepared once and planned as is: the task read and the schema specialized
once per request, whatever the attempts; the token hook sees every committed token and can
stop the plan; the service plans with the Planner itself; the CLI and the API answer the same
document, built by one function."""

from __future__ import annotations

import json
import sys

import pytest

import agent.planner.request as request_mod
from agent.planner.planner import Planner, PlanResult
from tests.helpers.runtimes import Decoding, Echo
from tests.helpers.serving import config, hosted_loader, long_context_copy, passing, wait_health
from tests.helpers.worlds import WORLDS, good_plan, mutated_plan, world_and_skills
from thor_runtime.engine.stats import Stats
from thor_runtime.speculative import PLAIN

TASK = "put the apple on the table"
HEAVY = json.dumps(
    mutated_plan(lambda p: p["steps"][0]["args"].update(object="cast_iron_pan"))
)  # refused: payload
GOOD = json.dumps(good_plan())
CUT = GOOD[:40]  # not JSON, and no whole goal for the solver to complete from


def counting(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` by a wrapper that records each call's arguments."""
    calls, original = [], getattr(module, name)

    def spy(*a, **kw):
        calls.append(a)
        return original(*a, **kw)

    monkeypatch.setattr(module, name, spy)
    return calls


def test_the_task_is_read_and_the_schema_specialized_once_per_request(tiny_llama, monkeypatch):
    tok = tiny_llama.tokenizer
    reads = counting(monkeypatch, request_mod, "read_words")
    specs = counting(monkeypatch, request_mod, "specialize")
    w, s = world_and_skills("kitchen")
    pl = Planner(Echo(tok, [HEAVY]), tok, attempts=2, thinking=False, complete=False)
    res = pl.plan(TASK, w, s)
    assert not res.valid and res.attempts == 3
    assert len(reads) == 1 and len(specs) == 1
    prepared = pl.prepare(w, s, task=TASK)
    assert (
        prepared.reading is not None
        and prepared.task == TASK
        and (len(reads), len(specs)) == (2, 2)
    )
    for _ in range(2):  # a prepared request is planned as is: nothing read or specialized again
        assert pl.plan(prepared).attempts == 3
    assert (len(reads), len(specs)) == (2, 2)


def test_the_token_hook_sees_every_attempt_and_can_stop_the_plan(tiny_llama):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    seen: list[int] = []
    pl = Planner(Echo(tok, [HEAVY, GOOD]), tok, attempts=1, thinking=False, complete=False)
    res = pl.plan(pl.prepare(w, s, task=TASK), on_token=seen.append)
    assert res.valid and res.attempts == 2
    assert len(res.generations) == 2 and len(seen) == sum(g.generated for g in res.generations)

    class Stop(Exception):
        pass

    def stop_at_five(t):
        if len(seen) >= 5:
            raise Stop
        seen.append(t)

    seen.clear()
    rt = Echo(tok, [HEAVY, GOOD])
    with pytest.raises(Stop):
        Planner(rt, tok, attempts=1, thinking=False).plan(TASK, w, s, on_token=stop_at_five)
    assert rt.calls == 1 and len(seen) == 5


class Ctx:
    """The job context's per-token check, counting; raises once ``stop_after`` tokens passed."""

    def __init__(self, stop_after=None):
        self.tokens, self.stop_after = 0, stop_after

    def check(self, token=None):
        from thor_app.server.jobs import Cancelled

        if self.stop_after is not None and self.tokens >= self.stop_after:
            raise Cancelled("disconnect")
        self.tokens += 1


def test_the_service_plans_its_prepared_request_with_the_planner_itself(tiny_llama, monkeypatch):
    from agent.schema.grammar import GrammarTokenizer
    from thor_app.server.host import Hosted, ModelHost
    from thor_app.server.jobs import Cancelled
    from thor_app.server.plan_api import parse_plan

    tok = tiny_llama.tokenizer
    host = ModelHost(config())
    host.hosted, host.gtok = (
        Hosted(tiny_llama, Echo(tok, [CUT, GOOD]), PLAIN),
        GrammarTokenizer(tok),
    )
    req = parse_plan({"task": TASK, "world": "kitchen", "attempts": 1}, host.cfg.planner)
    specs = counting(monkeypatch, request_mod, "specialize")
    calls = []
    original = Planner.plan

    def plan(self, request, *a, **kw):
        calls.append((type(self), request, kw.get("on_token")))
        return original(self, request, *a, **kw)

    monkeypatch.setattr(Planner, "plan", plan)
    prepared = host.prepare_plan(req)
    ctx = Ctx()
    res = host.plan_job(req, prepared)(ctx)
    assert res.valid and res.attempts == 2 and len(specs) == 1
    ((kind, request, hook),) = calls
    assert kind is Planner and request is prepared and hook is not None
    assert ctx.tokens == sum(g.generated for g in res.generations)
    host.hosted = Hosted(tiny_llama, Echo(tok, [CUT, GOOD]), PLAIN)
    with pytest.raises(Cancelled):  # a cancelled job stops inside its first generation
        host.plan_job(req, prepared)(Ctx(stop_after=3))
    assert host.hosted.runtime.calls == 1


@pytest.fixture(scope="module")
def tiny_long(tiny_dirs, tmp_path_factory):
    from thor_runtime.loading import load

    d = long_context_copy(tiny_dirs["llama"], tmp_path_factory.mktemp("plan_request") / "llama")
    return d, load(str(d))


@pytest.mark.asyncio
async def test_the_cli_and_the_api_answer_one_document(
    tiny_long, aiohttp_client, capsys, monkeypatch
):
    from thor_app.cli import main
    from thor_app.server.app import make_app

    made = []
    original = PlanResult.document

    def document(self):
        made.append(original(self))
        return made[-1]

    monkeypatch.setattr(PlanResult, "document", document)
    path, loaded = tiny_long
    task = "put the red cup in the sink"
    rc = main(
        [
            "plan",
            task,
            "--world",
            str(WORLDS["kitchen"]),
            "--model",
            str(path),
            "--max-tokens",
            "24",
            "--attempts",
            "0",
            "--spec",
            "none",
            "--json",
        ]
    )
    cli = json.loads(capsys.readouterr().out)
    assert rc == 3 and len(made) == 1 and cli == made[0]

    client = await aiohttp_client(
        make_app(config(), loader=hosted_loader(loaded), selftest=passing, watchdog_s=None)
    )
    assert (await wait_health(client))[0] == 200
    r = await client.post(
        "/v1/plan", json={"task": task, "world": "kitchen", "max_tokens": 24, "attempts": 0}
    )
    body = await r.json()
    assert r.status == 422 and len(made) == 2
    api = {k: body[k] for k in made[1]}
    assert api == made[1] and set(api) == set(cli) == {
        "plan",
        "valid",
        "report",
        "expansion",
        "stats",
    }
    assert (api["plan"], api["valid"], api["report"]) == (cli["plan"], cli["valid"], cli["report"])
    assert set(api["stats"]) == set(cli["stats"])


def _goal_spies(monkeypatch):
    """Count every parse_goal and read_words call, whichever agent module makes it."""
    import agent.language.mentions
    import agent.symbolic.executor

    goals, reads = [], []
    for fn, log in (
        (agent.symbolic.executor.parse_goal, goals),
        (agent.language.mentions.read_words, reads),
    ):

        def spy(*a, _fn=fn, _log=log, **kw):
            _log.append(a)
            return _fn(*a, **kw)

        for name, mod in list(sys.modules.items()):
            if name.split(".")[0] == "agent" and getattr(mod, fn.__name__, None) is fn:
                monkeypatch.setattr(mod, fn.__name__, spy)
    return goals, reads


def test_the_goal_is_parsed_once_per_attempt_and_the_task_read_once(tiny_llama, monkeypatch):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    goals, reads = _goal_spies(monkeypatch)
    res = Planner(Echo(tok, [CUT, GOOD]), tok, attempts=1, thinking=False).plan(TASK, w, s)
    assert res.valid and res.attempts == 2
    assert len(reads) == 1 and len(goals) == res.attempts


def test_the_goal_check_during_decoding_and_the_plan_share_one_parse(tiny_llama, monkeypatch):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    compact = {"separators": (",", ":")}  # as the grammar writes a plan
    pan = "put the cast iron pan on the table"
    heavy = json.dumps(
        {**good_plan(), "task": pan, "goal": [{"object": "cast_iron_pan", "at": "table"}]},
        **compact,
    )
    goals, reads = _goal_spies(monkeypatch)
    res = Planner(Decoding(tok, [heavy]), tok, attempts=1, thinking=False).plan(pan, w, s)
    assert not res.valid and res.attempts == 2  # each attempt refused from its goal, at the steps
    assert all(h["model_text"].endswith('"steps":[') for h in res.history)
    assert "payload" in {r["check"] for r in res.report}
    assert len(reads) == 1 and len(goals) == res.attempts
    goals.clear(), reads.clear()
    res = Planner(
        Decoding(tok, [json.dumps(json.loads(GOOD), **compact)]), tok, thinking=False
    ).plan(TASK, w, s)
    assert res.valid and res.attempts == 1 and len(reads) == 1 and len(goals) == 1


def test_a_plans_stats_keep_what_its_attempts_ran_on():
    """The merged stats name the device, KV dtype and note of the generations (a plan on CUDA
    once reported "cpu"), and sum their counters."""
    from agent.planner.planner import merge_stats

    parts = [Stats(kv_dtype="fp8", device="cuda:0", generated=n, spec_note="stale") for n in (5, 7)]
    total = merge_stats(parts)
    assert (total.device, total.kv_dtype, total.spec_note, total.generated) == (
        "cuda:0",
        "fp8",
        "stale",
        12,
    )
    assert merge_stats([]).generated == 0
