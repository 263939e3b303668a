"""The product's paths on CUDA (`make test-gpu`): decoding under a plan grammar with every
proposer, `--spec auto` with its verify-cost curve measured on the GPU, a whole plan through the
planner, and the service answering on the GPU. Each one's answer is the one plain greedy
decoding gives on the same device. On a machine without CUDA they skip (the CPU runs the same
logic through the forced fixed-shape decoder in test_fixed_shape.py)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.helpers.schemas import PLAN_LIKE
from tests.helpers.serving import (
    config,
    direct_plan,
    hosted_loader,
    long_context_copy,
    passing,
    wait_health,
)
from tests.helpers.tiny import random_drafter
from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative import SpecOptions, Speculation, build_speculation
from thor_runtime.speculative import cost as cost_mod
from thor_runtime.speculative.budget import DraftBudget
from thor_runtime.speculative.dflash_io import save_drafter
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: run `make test-gpu` on a GPU"
    ),
]


@pytest.fixture(scope="module")
def on_gpu(tiny_dirs, tmp_path_factory):
    """The tiny llama with a 4k context (a sample world's plan prompt fits), bf16 on CUDA."""
    from thor_runtime.loading import load

    path = long_context_copy(tiny_dirs["llama"], tmp_path_factory.mktemp("cuda_paths") / "llama")
    return load(str(path), "bf16", device="cuda")


def speculations(loaded, tmp_path) -> dict:
    save_drafter(random_drafter(loaded.cfg, block_size=6, num_taps=2, seed=1), tmp_path / "drafter")
    drafter = str(tmp_path / "drafter")
    return {
        "ngram": Speculation(NgramProposer(NgramConfig(1, 3, 6)), 6, DraftBudget()),
        "dflash": build_speculation(SpecOptions(method="dflash", drafter=drafter), loaded.model),
        "auto": build_speculation(SpecOptions(method="auto", drafter=drafter), loaded.model),
    }


def test_cuda_constrained_spec_equals_plain(on_gpu, tmp_path):
    from agent.schema.grammar import Grammar, GrammarTokenizer

    tok = on_gpu.tokenizer
    rt = Runtime(on_gpu.model, tok, cost_cache=str(tmp_path / "cache"))
    assert rt.decoder is not None and rt.decoder.graphs
    g = Grammar(GrammarTokenizer(tok), PLAN_LIKE)
    params = SamplingParams(max_tokens=90)
    for name, sp in speculations(on_gpu, tmp_path).items():
        for prompt in ['{"skill":"pick","target":{"name":"cup"', "pick up the red cup"]:
            ids = tok.encode(prompt)
            plain = rt.generate(ids, params, constraint=g.constraint())
            spec = rt.generate(ids, params, sp, constraint=g.constraint())
            assert spec.token_ids == plain.token_ids, (name, prompt)
            assert spec.stats.to_dict()["device"].startswith("cuda")
    assert rt.decoder.captured >= 1


def test_cuda_cost_curve_is_measured_on_the_gpu_and_auto_stays_exact(on_gpu, tmp_path, monkeypatch):
    monkeypatch.delenv(cost_mod.ENV, raising=False)
    tok = on_gpu.tokenizer
    rt = Runtime(on_gpu.model, tok, cost_cache=str(tmp_path / "cache"))
    curve = cost_mod.verify_costs(rt, 9, str(tmp_path / "cache"))
    key = cost_mod.curve_key(rt, curve.rows)
    assert curve.source == "measured" and key["device"].startswith("cuda") and key["gpu"]
    assert curve.rows == min(9, rt.pad_rows or 9) and curve.costs[0] == 1.0
    print(
        f"\nverify cost on {key['gpu']} (1..{curve.rows} rows, x one row): "
        + " ".join(f"{c:.3f}" for c in curve.costs)
    )
    assert cost_mod.verify_costs(rt, 9, str(tmp_path / "cache")).source == "cached"

    sp = speculations(on_gpu, tmp_path)["auto"]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    prompt = "pick up the red cup and place it on the table. pick up the red cup and place it"
    want = rt.generate(tok.encode(prompt), params).token_ids
    for i in range(6):
        res = rt.generate(tok.encode(prompt), params, sp)
        assert res.token_ids == want, i
        choice = res.stats.auto_choice
        assert (
            choice["cost_curve"] in ("measured", "cached") and 0 <= choice["k"] <= choice["k_max"]
        )
    print(f"auto's last choice on the GPU: {choice}")


def test_cuda_plan_with_auto_equals_the_plain_plan(on_gpu, tmp_path):
    from agent.files.loader import AGENT_DIR, load_skills, load_world, resolve_skills_path
    from agent.planner.planner import Planner

    world = load_world(AGENT_DIR / "worlds" / "kitchen.json")
    skills = load_skills(resolve_skills_path(world, None))
    rt = Runtime(on_gpu.model, on_gpu.tokenizer, cost_cache=str(tmp_path / "cache"))
    task = "put the red cup in the sink"
    plain = Planner(rt, on_gpu.tokenizer, max_tokens=60, attempts=0).plan(task, world, skills)
    auto = Planner(
        rt, on_gpu.tokenizer, speculations(on_gpu, tmp_path)["auto"], max_tokens=60, attempts=0
    ).plan(task, world, skills)
    assert auto.text == plain.text and auto.plan == plain.plan and auto.valid == plain.valid
    assert auto.report == plain.report
    assert plain.stats["device"].startswith("cuda")


@pytest.mark.asyncio
async def test_cuda_service_answers_on_the_gpu(aiohttp_client, on_gpu):
    from thor_app.server.app import STATE, make_app

    app = make_app(
        config(limits={"batch": 4, "queue_size": 8}),
        loader=hosted_loader(on_gpu, "ngram"),
        selftest=passing,
        watchdog_s=None,
    )
    client = await aiohttp_client(app)
    assert (await wait_health(client))[0] == 200
    report = await (await client.get("/health/report")).json()
    assert report["runtime"]["device"].startswith("cuda"), report["runtime"]
    decoder = client.app[STATE].host.hosted.runtime.decoder
    assert decoder is not None and decoder.slots == 4  # a KV slot per request generating

    async def plan(task):
        r = await client.post(
            "/v1/plan", json={"task": task, "world": "kitchen", "max_tokens": 40, "attempts": 0}
        )
        return r.status, await r.json()

    tasks = ["put the red cup in the sink", "move the apple to the table"]
    answers = await asyncio.gather(*(plan(t) for t in tasks))  # several clients: all answered
    for task, (status, body) in zip(tasks, answers):
        want = direct_plan(on_gpu, task, "kitchen", 40, 0, share=4)
        assert status in (200, 422), body
        assert body["plan"] == want.plan and body["valid"] == want.valid


@pytest.mark.parametrize("kind", ["none", "ngram", "dflash"])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_cuda_slots_commit_what_each_commits_alone(on_gpu, tmp_path, kind, kv):
    """In-flight batching on the GPU: four sequences at once, each in its KV slot of the
    fixed-shape decoder, commit what each commits alone, plain and speculative, half of them
    under a plan grammar; the graphs are captured while the other sequences run; and
    speculative == plain in the batch."""
    import threading

    from agent.schema.grammar import Grammar, GrammarTokenizer

    tok = on_gpu.tokenizer
    g = Grammar(GrammarTokenizer(tok), PLAN_LIKE)
    prompts = [
        tok.encode(p)
        for p in (
            '{"skill":"pick","target":{"name":"cup"',
            "pick up the red cup",
            "go to the dock and wait",
            '{"skill":"place","target":',
        )
    ]
    spec = {"none": Speculation(), **speculations(on_gpu, tmp_path)}[kind]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    rt = Runtime(on_gpu.model, tok, kv_dtype=kv, cost_cache=str(tmp_path / "cache"))
    assert rt.share(4) == 4 and rt.decoder.slots == 4 and rt.decoder.captured == 0

    def one(i, sp):
        return rt.generate(
            prompts[i], params, sp, constraint=g.constraint() if i % 2 == 0 else None
        ).token_ids

    together, errors = [None] * 4, []
    go = threading.Barrier(4)

    def run(i):
        try:
            go.wait()
            together[i] = one(i, spec)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert rt.decoder.captured >= 1 and max(rt.batch.rounds) > 1, rt.batch.rounds
    alone = [one(i, spec) for i in reversed(range(4))][::-1]  # each in another slot than before
    plain = [one(i, Speculation()) for i in range(4)]
    assert together == alone == plain
    assert sorted(rt.decoder._free) == [0, 1, 2, 3]
