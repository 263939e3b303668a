"""The default-model rule as `thor plan` and `thor serve` apply it (thor_app/default_model.py):
a named model is left alone, the CPU changes nothing, a CUDA card gets the measured choice in
one line; the service's loader applies the same rule; the real timing runs a warm plan."""

from __future__ import annotations

import json

import pytest

from thor_app import default_model
from thor_app.assembly import with_settings
from thor_runtime.catalog import CATALOG, MODELS_DIR_ENV, model_path
from thor_runtime.config import RuntimeConfig
from thor_runtime.model_choice import CACHE_FILE, Measured

Q05, Q15 = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"


@pytest.fixture
def pulled(tmp_path, monkeypatch):
    """A models directory where both catalog models look pulled (empty files)."""
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path))
    for name in (Q05, Q15):
        p = model_path(CATALOG[name], tmp_path)
        p.parent.mkdir(parents=True)
        p.write_bytes(b"")
    return tmp_path


def fake_timing(seconds: dict, calls: list):
    def measure(config, name):
        calls.append((name, config.model.name))
        return Measured(seconds[name], 3)

    return measure


def _card(name):
    return lambda config: name


def test_on_a_cuda_card_the_rule_picks_and_says_it(pulled):
    said, calls = [], []
    got = default_model.choose_default(
        RuntimeConfig(),
        said.append,
        card=_card("NVIDIA Test Card"),
        measure=fake_timing({Q15: 3.1, Q05: 0.7}, calls),
    )
    assert got.model.name == Q05
    assert [c[0] for c in calls] == [Q15, Q05]
    decision = [s for s in said if s.startswith("default model: ")]
    assert len(decision) == 1 and Q05 in decision[0] and "0.70 s" in decision[0]
    # every other setting is the config's own
    assert with_settings(got, model__name="default") == RuntimeConfig()


def test_the_measurement_runs_with_the_config_it_will_serve(pulled):
    calls = []
    config = with_settings(RuntimeConfig(), model__kv_dtype="bf16", planner__latency_goal_s=1.0)
    default_model.choose_default(
        config,
        lambda s: None,
        card=_card("X"),
        measure=lambda c, n: calls.append(c) or Measured(0.5),
    )
    assert calls[0].model.kv_dtype == "bf16" and calls[0].model.name == "default"


@pytest.mark.parametrize("model", [Q05, "some/dir", "/models/other.gguf"])
def test_a_named_model_is_never_replaced(pulled, model):
    said, calls = [], []
    config = with_settings(RuntimeConfig(), model__name=model)

    def card(config):
        raise AssertionError("a named model needs no device check")

    got = default_model.choose_default(config, said.append, card, fake_timing({}, calls))
    assert got == config and said == [] and calls == []


def test_on_the_cpu_nothing_changes(pulled):
    said, calls = [], []
    got = default_model.choose_default(
        RuntimeConfig(), said.append, card=_card(None), measure=fake_timing({}, calls)
    )
    assert got == RuntimeConfig() and said == [] and calls == []
    assert not (pulled / CACHE_FILE).exists()


def test_device_cpu_is_the_cpu_without_asking_torch():
    assert default_model.cuda_card(with_settings(RuntimeConfig(), model__device="cpu")) is None


def test_the_settings_that_key_a_figure_are_plain_values_and_follow_the_config():
    base = default_model.measured_settings(RuntimeConfig())
    json.dumps(base)  # kept in the JSON file as they are
    for change in (
        {"model__dtype": "fp16"},
        {"model__kv_dtype": "fp8"},
        {"speculation__method": "none"},
        {"planner__attempts": 0},
        {"model__compile": True},
    ):
        other = default_model.measured_settings(with_settings(RuntimeConfig(), **change))
        assert other != base, change
    # where things are kept and the goal itself do not change a plan's time
    same = with_settings(
        RuntimeConfig(),
        planner__log_requests="/tmp/log",
        planner__latency_goal_s=0.5,
        model__weight_cache="",
    )
    assert default_model.measured_settings(same) == base


def test_the_service_loader_applies_the_same_rule(pulled, monkeypatch):
    """thor serve's loader hands build_runtime the config the rule chose (stopped right there)."""
    import thor_app.assembly as assembly
    import thor_app.server.leftovers as leftovers
    from thor_app.server.config import config_from_dict
    from thor_app.server.host import default_loader

    class Built(Exception):
        pass

    def build(config, *a, **kw):
        raise Built(config)

    calls = []
    monkeypatch.setattr(leftovers, "remove_abandoned", lambda roots: None)
    monkeypatch.setattr(assembly, "build_runtime", build)
    monkeypatch.setattr(default_model, "cuda_card", _card("NVIDIA Test Card"))
    monkeypatch.setattr(default_model, "time_warm_plan", fake_timing({Q15: 1.1, Q05: 0.3}, calls))
    # the installed thor.toml spells the default name: it is the rule, not a choice of the 135M
    cfg = config_from_dict({"model": {"name": "default"}, "planner": {"latency_goal_s": 1.5}})
    with pytest.raises(Built) as e:
        default_loader(cfg)
    assert e.value.args[0].model.name == Q15 and [c[0] for c in calls] == [Q15]
    with pytest.raises(Built) as e:
        default_loader(config_from_dict({"model": {"name": Q05}}))
    assert e.value.args[0].model.name == Q05 and len(calls) == 1


def test_the_real_timing_plans_warm_and_logs_no_request(tiny_dirs, tmp_path, monkeypatch):
    """time_warm_plan on the CPU with a tiny random model: it loads, plans the warm-up and the
    timed tasks through the session `thor plan` uses, and returns their median."""
    from tests.helpers.serving import long_context_copy

    monkeypatch.setenv("THOR_CACHE_DIR", str(tmp_path / "cache"))
    model = long_context_copy(tiny_dirs["llama"], tmp_path / "llama")
    logs = tmp_path / "requests"
    config = with_settings(
        RuntimeConfig(),
        model__device="cpu",
        speculation__method="none",
        planner__max_tokens=16,
        planner__attempts=0,
        planner__goal_choice=0,
        planner__log_requests=str(logs),
    )
    planned = []
    import agent.planner as planner_pkg

    real = planner_pkg.specialize_request

    def spy(task, *a, **kw):
        planned.append(task)
        return real(task, *a, **kw)

    monkeypatch.setattr(planner_pkg, "specialize_request", spy)
    got = default_model.time_warm_plan(config, str(model))
    assert got.plans == len(default_model.TIMED_TASKS) == 3 and got.latency_s > 0
    assert planned == [default_model.WARM_UP_TASK, *default_model.TIMED_TASKS]
    assert not logs.exists()  # the request log is off while measuring


def test_the_ros_node_applies_the_same_rule(pulled, monkeypatch):
    """`thor ros` loads the model the rule chose, and its status names it."""
    from thor_app.ros.planning import Planning

    def build(config):
        raise RuntimeError(f"built {config.model.name}")

    calls = []
    monkeypatch.setattr(default_model, "cuda_card", _card("NVIDIA Test Card"))
    monkeypatch.setattr(default_model, "time_warm_plan", fake_timing({Q15: 0.9, Q05: 0.3}, calls))
    said = []
    planning = Planning(RuntimeConfig(), build=build, log=said.append)
    assert planning.start() is False
    assert planning.reason == f"start-up failed: RuntimeError: built {Q15}"
    assert planning.config.model.name == Q15 and [c[0] for c in calls] == [Q15]
    assert any(s.startswith("default model: ") and Q15 in s for s in said)
