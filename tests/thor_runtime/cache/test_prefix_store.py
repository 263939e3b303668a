"""The persistent prefix: the shared prompt start's K/V on disk, loaded by a new runtime, refused
on any mismatch (and rebuilt), never read half-written; a plan with it is byte-identical to one
without, for fp32 and FP8 KV."""

from __future__ import annotations

import os

import pytest

import thor_runtime.cache.prefix_store as store
from agent.planner.planner import Planner
from agent.planner.prompt import build_messages
from tests.helpers.worlds import world_and_skills
from thor_app.session import attach_prefix, shared_prefix_ids
from thor_runtime.cache.kv_cache import KVScales
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams

TASK = "put the apple on the table"


@pytest.fixture(scope="module")
def small_skills():
    """Two skills: a shared start that fits the tiny models' 1024-token context."""
    import json

    from agent.files.loader import DEFAULT_SKILLS, skills_from_dict

    doc = json.loads(DEFAULT_SKILLS.read_text())
    return skills_from_dict({**doc, "skills": doc["skills"][:2]}, "two skills")


def _runtime(m, kv="fp32", prefix_cache=2):
    return Runtime(m.model, m.tokenizer, kv_dtype=kv, prefix_cache=prefix_cache)


def _key(rt, ids):
    return store.prefix_key(rt.model, rt.kv_dtype, KVScales.unit(rt.model.cfg), ids)


def test_the_shared_ids_open_every_prompt(default_model):
    tok = default_model.tokenizer
    w, s = world_and_skills("kitchen")
    ids = shared_prefix_ids(tok, s)
    for world in ("kitchen", "warehouse"):
        full = tok.encode_chat(build_messages(TASK, world_and_skills(world)[0], s))
        assert full[: len(ids)] == ids and len(full) > len(ids)
    assert len(ids) > 100  # instructions, examples and skills, not a stub


def test_stored_then_loaded_by_a_new_runtime(default_model, tmp_path):
    tiny_llama = default_model
    w, s = world_and_skills("kitchen")
    first = attach_prefix(_runtime(tiny_llama), tiny_llama.tokenizer, s, tmp_path)
    assert first["source"] == "built" and os.path.exists(first["path"])
    rt = _runtime(tiny_llama)
    again = attach_prefix(rt, tiny_llama.tokenizer, s, tmp_path)
    assert again["source"] == "disk" and again["path"] == first["path"]
    assert list(tmp_path.iterdir()) == [
        tmp_path / os.path.basename(first["path"])
    ]  # no temp files left
    ids = list(rt.prefixes.pinned()[0])
    res = rt.generate(
        tiny_llama.tokenizer.encode_chat(build_messages(TASK, w, s)), SamplingParams(max_tokens=2)
    )
    assert res.stats.cached_prompt_tokens == len(ids)  # a new process prefills only world + task
    d = res.stats.to_dict()  # and says where its prompt came from
    assert d["prompt_tokens_from_disk"] == len(ids) and d["prompt_tokens_from_memory"] == 0
    assert d["prompt_tokens_computed"] == d["prompt_tokens"] - len(ids) > 0
    again = rt.generate(
        tiny_llama.tokenizer.encode_chat(build_messages(TASK, w, s)), SamplingParams(max_tokens=2)
    )
    d = again.stats.to_dict()  # the same prompt again: the recent copy
    assert (
        d["prompt_tokens_from_disk"] == 0
        and d["prompt_tokens_from_memory"] == d["prompt_tokens"] - 1
    )


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_a_plan_with_the_stored_prefix_is_byte_identical(default_model, tmp_path, kv):
    tiny_llama = default_model
    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer

    def plan(rt):
        return Planner(rt, tok, attempts=0, thinking=False, max_tokens=48, complete=False).plan(
            TASK, w, s
        )

    without = plan(_runtime(tiny_llama, kv, prefix_cache=0))
    attach_prefix(_runtime(tiny_llama, kv), tok, s, tmp_path)  # another process stored it
    rt = _runtime(tiny_llama, kv)
    assert attach_prefix(rt, tok, s, tmp_path)["source"] == "disk"
    with_prefix = plan(rt)
    assert rt.prefixes.hits == 1 and rt.prefixes.tokens_reused == len(rt.prefixes.pinned()[0])
    assert with_prefix.text == without.text and with_prefix.plan == without.plan
    # where the plan's time went: the grammar, the checks, prefill and decode, within the latency
    st = with_prefix.stats
    assert (
        st["prompt_tokens_from_disk"] == rt.prefixes.tokens_reused
        and without.stats["prompt_tokens_from_disk"] == 0
    )
    assert st["time_grammar_s"] > 0 and st["time_check_s"] > 0 and st["attempts"] == 1
    assert st["time_prefill_s"] + st["time_decode_s"] + st["time_check_s"] <= st["plan_latency_s"]


def _stored(tiny_llama, tmp_path, s, kv="fp32"):
    rt = _runtime(tiny_llama, kv)
    info = attach_prefix(rt, tiny_llama.tokenizer, s, tmp_path)
    return rt, list(rt.prefixes.pinned()[0]), info["path"]


def test_refused_on_any_mismatch(tiny_llama, tmp_path, small_skills):
    rt, ids, path = _stored(tiny_llama, tmp_path, small_skills)
    cfg, dt, sc = rt.model.cfg, rt.model.dtype, KVScales.unit(rt.model.cfg)
    key = _key(rt, ids)
    assert store.load(path, key, ids, cfg, "fp32", dt, sc) is not None
    assert store.load(path, {**key, "kv_dtype": "fp8"}, ids, cfg, "fp8", dt, sc) is None  # KV dtype
    assert (
        store.load(path, {**key, "dtype": "torch.bfloat16"}, ids, cfg, "fp32", dt, sc) is None
    )  # weights
    assert (
        store.load(path, {**key, "source": "/elsewhere/model"}, ids, cfg, "fp32", dt, sc) is None
    )  # model
    other = ids[:-1] + [ids[-1] + 1]
    assert store.load(path, key, other, cfg, "fp32", dt, sc) is None  # a token
    assert store.load(path, _key(rt, other), other, cfg, "fp32", dt, sc) is None  # ids inside
    # another KV dtype or another token sequence is another file: never this one
    fp8 = _runtime(tiny_llama, "fp8")
    assert store.prefix_path(tmp_path, _key(fp8, ids)) != store.prefix_path(tmp_path, key)


def test_rebuilt_after_a_truncated_or_damaged_file(tiny_llama, tmp_path, small_skills):
    _, ids, path = _stored(tiny_llama, tmp_path, small_skills)
    whole = open(path, "rb").read()
    for bad in (whole[: len(whole) // 2], whole[:7], whole + b"\0", b"\xff" * 64):
        with open(path, "wb") as f:
            f.write(bad)
        rt, again, p2 = _stored(tiny_llama, tmp_path, small_skills)
        assert p2 == path and again == ids
        assert len(open(path, "rb").read()) == len(
            whole
        )  # rebuilt whole (the header's order may vary)
        assert (
            attach_prefix(_runtime(tiny_llama), tiny_llama.tokenizer, small_skills, tmp_path)[
                "source"
            ]
            == "disk"
        )


def test_a_killed_write_leaves_no_file_that_is_read(
    tiny_llama, tmp_path, monkeypatch, small_skills
):
    import safetensors.torch

    def dies(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x10\x00\x00\x00half a header")
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(safetensors.torch, "save_file", dies)
    with pytest.raises(KeyboardInterrupt):
        _stored(tiny_llama, tmp_path, small_skills)
    assert list(tmp_path.iterdir()) == []  # neither the name nor the temp file
    # a temp file left by a process killed outright (no cleanup) is never read either
    (tmp_path / ".x.safetensors.tmp").write_bytes(b"\x10\x00\x00\x00half")
    monkeypatch.undo()
    rt, ids, path = _stored(tiny_llama, tmp_path, small_skills)
    assert (
        os.path.basename(path) != ".x.safetensors.tmp"
        and _stored(tiny_llama, tmp_path, small_skills)[1] == ids
    )


def test_every_configured_skill_set_at_start(tiny_llama, tmp_path, small_skills, monkeypatch):
    """The service's start: one prefix per skill set in its skills directory; a file that is not a
    skill set, or a set too long for the model, is passed over (its requests get the error)."""
    import json
    from types import SimpleNamespace

    from agent.files.loader import DEFAULT_SKILLS
    from thor_app import session
    from thor_runtime.speculative import PLAIN

    skills_dir = tmp_path / "skills"
    skills_dir.mkdir()
    doc = json.loads(DEFAULT_SKILLS.read_text())
    (skills_dir / "two.json").write_text(json.dumps({**doc, "skills": doc["skills"][:2]}))
    (skills_dir / "all.json").write_text(json.dumps(doc))  # past the tiny model's context
    (skills_dir / "notes.json").write_text("{}")
    monkeypatch.setattr(session, "prefix_dir", lambda config: tmp_path / "prefixes")
    rt = _runtime(tiny_llama)
    served = SimpleNamespace(runtime=rt, loaded=tiny_llama, config=None, speculation=PLAIN)
    out = session.PlanSession(served, shelf=None).attach_skill_sets([skills_dir])
    assert sorted(o["source"] for o in out) == ["built", "off"]
    assert len(rt.prefixes.pinned()) == 1


def _sessions(loaded, rt):
    """`thor bench --plan`'s sessions over ``rt``: 16 tokens a plan, no world starts."""
    from thor_app.tools.bench_plan import spec_sessions
    from thor_runtime.config import RuntimeConfig

    return spec_sessions(RuntimeConfig(), loaded, rt, max_tokens=16)


def test_bench_plan_says_where_each_plan_went(default_model):
    """`thor bench --plan` keeps, per plan, where its prompt came from and where its time went."""
    from evals.plan_bench import WHERE_TIME_GOES, plan_bench

    rt = _runtime(default_model)
    row = plan_bench(_sessions(default_model, rt), ["none"], repeats=2, limit=1)[0]
    first, second = row["per_plan"]
    assert (
        set(first) == {"case", "decode_tok_s", *WHERE_TIME_GOES} and first["case"] == second["case"]
    )
    assert (
        first["prompt_tokens_computed"] > 0
        and first["time_prefill_s"] > 0
        and first["time_decode_s"] > 0
    )
    # the same request again: its prompt comes from the recent prompts kept in memory
    assert (
        second["prompt_tokens_from_memory"] > 0
        and second["prompt_tokens_computed"] < first["prompt_tokens_computed"]
    )


def test_bench_plan_fresh_starts_each_plan_as_a_new_process(default_model, tmp_path):
    """`--plan-start process`: every plan prefills world and task again from the pinned start
    alone (the recent prompts forgotten), with a new planner; the plans are the same."""
    from evals.plan_bench import plan_bench, plan_cases

    rt = _runtime(default_model)
    skills = plan_cases(1)[0][3]
    attach_prefix(rt, default_model.tokenizer, skills, tmp_path)
    pinned = len(rt.prefixes.pinned()[0])
    row = plan_bench(_sessions(default_model, rt), ["none"], repeats=2, limit=1, fresh=True)[0]
    for p in row["per_plan"]:
        assert p["prompt_tokens_from_disk"] == pinned and p["prompt_tokens_from_memory"] == 0
        assert p["prompt_tokens_computed"] > 0
    assert (
        len(rt.prefixes) == 0 and len(rt.prefixes.pinned()) == 1
    )  # the runtime's own memory untouched
    # without it each spec keeps its own recent prompts: none starts warm from another's
    first, second = plan_bench(_sessions(default_model, rt), ["none", "ngram"], repeats=2, limit=1)
    for row in (first, second):
        alone, again = row["per_plan"]
        assert (
            alone["prompt_tokens_from_memory"] == 0 and alone["prompt_tokens_from_disk"] == pinned
        )
        assert again["prompt_tokens_from_memory"] > pinned  # its own copy, the second time
    assert first.get("plans_identical_to_first", True) and second["plans_identical_to_first"]
    # the paired ratio: the median of the per-request ratios, request by request
    ratios = sorted(
        b["decode_tok_s"] / a["decode_tok_s"] for a, b in zip(first["per_plan"], second["per_plan"])
    )
    assert second["decode_vs_first_paired"] == round((ratios[0] + ratios[1]) / 2, 2)
    assert "decode_vs_first_paired" not in first
