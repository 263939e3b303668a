"""World starts on disk (thor_runtime/cache/prefix_shelf.py): the first plan in a world stores the
prompt start every task there shares, with the drafter's taps; a new process restores it and
prefills only the task, and its plan is byte-identical to one planned from nothing. The most
recently used files stay, a damaged one is refused."""

from __future__ import annotations

import pytest

from agent.planner.planner import Planner
from agent.planner.prompt import build_messages
from tests.helpers.worlds import world_and_skills
from thor_runtime.cache.prefix_shelf import PrefixShelf
from thor_runtime.engine.generate import Runtime
from thor_runtime.speculative import SpecOptions, build_speculation

TASKS = ("put the apple on the table", "put the cup in the sink")


def _plan(m, task, world="kitchen", shelf=None, spec=None, prefix_cache=2):
    """A plan as a new process makes it: a new runtime (nothing in memory) and planner."""
    w, s = world_and_skills(world)
    rt = Runtime(m.model, m.tokenizer, prefix_cache=prefix_cache)
    sp = build_speculation(SpecOptions(method=spec), m.model) if spec else None
    kw = {"shelf": shelf} if shelf is not None else {}
    p = Planner(
        rt,
        m.tokenizer,
        *([sp] if sp else []),
        attempts=0,
        thinking=False,
        max_tokens=40,
        complete=False,
        **kw,
    )
    res = p.plan(task, w, s)
    if shelf is not None:
        assert shelf.flush() == []
    return res, p


@pytest.mark.parametrize("spec", [None, "dflash"])
def test_a_world_start_stored_by_one_process_is_restored_by_the_next(default_model, tmp_path, spec):
    plain = [_plan(default_model, t, prefix_cache=0)[0] for t in TASKS]
    shelf = PrefixShelf(tmp_path)
    first, planner = _plan(default_model, TASKS[0], shelf=shelf, spec=spec)
    w, s = world_and_skills("kitchen")
    ids = default_model.tokenizer.encode_chat(build_messages(TASKS[1], w, s))
    start = planner._world_start(ids, w, s)
    assert 32 < len(start) < len(ids) - 4 and ids[: len(start)] == list(
        start
    )  # the world, not the task
    files = list(tmp_path.glob("*.safetensors"))
    assert len(files) == 1 and first.stats["prompt_tokens_from_disk"] == 0
    # a new process, another task in the same world: only the task's tokens run
    second, _ = _plan(default_model, TASKS[1], shelf=PrefixShelf(tmp_path), spec=spec)
    st = second.stats
    assert st["prompt_tokens_from_disk"] == len(start)
    assert st["prompt_tokens_computed"] == st["prompt_tokens"] - len(start)
    assert second.text == plain[1].text and first.text == plain[0].text
    # with a drafter its window's seed rows came with the start (no tap-less fallback prefill)
    if spec:
        assert st["prompt_tokens_computed"] < 32


def test_the_most_recent_worlds_stay_and_a_damaged_file_is_refused(default_model, tmp_path):
    shelf = PrefixShelf(tmp_path, keep=1)
    _plan(default_model, TASKS[0], "kitchen", shelf)
    (kitchen,) = tmp_path.glob("*.safetensors")
    _plan(default_model, "put the box on the shelf", "warehouse", shelf)
    files = list(tmp_path.glob("*.safetensors"))
    assert len(files) == 1 and files[0] != kitchen  # the least recently used went
    # a truncated file: refused, the world prefilled again, the plan the same, the file rewritten
    files[0].write_bytes(files[0].read_bytes()[:-100])
    res, _ = _plan(
        default_model, "put the box on the shelf", "warehouse", PrefixShelf(tmp_path, keep=1)
    )
    again, _ = _plan(default_model, "put the box on the shelf", "warehouse", prefix_cache=0)
    assert res.stats["prompt_tokens_from_disk"] == 0 and res.text == again.text
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    with pytest.raises(ValueError):
        PrefixShelf(tmp_path, keep=0)
