"""The planner model with its shipped DFlash drafter, as `thor plan` runs them (int4 weights):
speculative plans and chat are token for token plain decoding's, on every KV dtype kind the
drafter sees (fp32, fp8), and the drafter really drafts. Needs the pulled planner model."""

from __future__ import annotations

import pytest

from evals.plan_bench import eval_cases, plan_cases
from tests.helpers.pulled import QWEN_05B, pulled_or_skip
from thor_app.assembly import build_runtime, load_model, make_planner, with_settings
from thor_runtime.config import RuntimeConfig
from thor_runtime.engine.sampling import SamplingParams

CHAT = [{"role": "user", "content": "In two sentences: why does a robot arm have a payload limit?"}]


@pytest.fixture(scope="module")
def planner_model():
    pulled_or_skip(QWEN_05B)
    return load_model(with_settings(RuntimeConfig(), model__name=QWEN_05B))


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_shipped_planner_drafter_output_is_plain_decodings(planner_model, kv):
    cases = plan_cases()[:1] + eval_cases(limit=8)[:1]  # a sample world, an unseen one
    runs = {}
    for spec in ("none", "dflash", "combined"):
        cfg = with_settings(
            RuntimeConfig(), model__name=QWEN_05B, model__kv_dtype=kv, speculation__method=spec
        )
        a = build_runtime(cfg, planner_model)
        planner = make_planner(a)
        plans = [planner.plan(task, world, skills) for _, task, world, skills in cases]
        chat = a.runtime.generate(
            planner_model.tokenizer.encode_chat(CHAT), SamplingParams(max_tokens=48), a.speculation
        )
        runs[spec] = ([p.text for p in plans], chat.token_ids, plans[0].stats["accept_length_mean"])
    for spec in ("dflash", "combined"):
        assert runs[spec][:2] == runs["none"][:2], spec
        # drafts were accepted beyond what the grammar forces into plain decoding
        assert runs[spec][2] > runs["none"][2] + 1.5, (spec, runs[spec][2], runs["none"][2])
