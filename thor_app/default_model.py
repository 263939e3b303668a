"""The model `thor plan` and `thor serve` run when none is named, in one place for both.

``model.name = "default"`` (the default, whether spelled or not: the installed thor.toml spells
it) is a rule, not one file: on the CPU the embedded model, as always; on a CUDA device the
largest pulled catalog model whose warm plan there meets ``planner.latency_goal_s``
(thor_runtime/model_choice.py decides, and keeps the figures); a goal of 0 keeps the embedded
one there too. Any other name is run as given. This module supplies what the rule needs from
above the runtime: which card the config runs on, and a timing of a warm plan made by the same
assembly and session `thor plan` uses.

Why a whole plan and not a fixed decode: a plan's time is decode plus what a bare decode leaves
out (the grammar's masks and forced tokens, prefill of the task, the gate, the solver, the
speculation this config runs), and it is the figure the goal is about. One plan warms the
runtime up (CUDA graphs captured, grammar compiled, the world's prompt start cached), then the
median of three plans of other tasks in the same world is the warm latency. Nothing it does is
kept: no world starts, no learned speculation, no request log.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from thor_runtime.catalog import models_dir
from thor_runtime.config import RuntimeConfig
from thor_runtime.model_choice import DEFAULT_MODEL, Choice, Measured, choose_model

REFERENCE_WORLD = "kitchen"
WARM_UP_TASK = "put the blue mug in the dish rack"
TIMED_TASKS = (
    "put the red cup in the sink",
    "move the apple to the table",
    "put the plate in the dish rack",
)


def cuda_card(config: RuntimeConfig) -> str | None:
    """The name of the CUDA card ``config`` runs on, or None on the CPU (no torch for
    ``device = "cpu"``)."""
    if config.model.device == "cpu":
        return None
    import torch

    from thor_runtime.device import resolve_device

    d = resolve_device(config.model.device)
    return torch.cuda.get_device_name(d) if d.type == "cuda" else None


def measured_settings(config: RuntimeConfig) -> dict:
    """The settings a warm plan's time depends on: a cached figure is reused only under the same
    ones (with the same card and model sha256). Paths, sampling and the request log are left
    out: they change where things are kept, not how fast a plan runs."""
    import torch

    m, e, s, p = config.model, config.engine, config.speculation, config.planner
    return {
        "torch": torch.__version__,
        "reference": f"{REFERENCE_WORLD}: {len(TIMED_TASKS)} warm plans, median",
        "dtype": m.dtype,
        "kv_dtype": m.kv_dtype,
        "prefill_chunk": m.prefill_chunk,
        "prefix_cache": m.prefix_cache,
        "step_rows": m.step_rows,
        "max_context": m.max_context,
        "compile": m.compile,
        "backend": e.backend,
        "engine_form": e.form,
        "trt_precision": e.trt_precision,
        "speculation": s.method,
        "drafter": s.drafter,
        "max_tokens": p.max_tokens,
        "attempts": p.attempts,
        "thinking": p.thinking,
        "solver": p.solver,
        "goal_choice": p.goal_choice,
        "lexicon": p.lexicon,
    }


def time_warm_plan(config: RuntimeConfig, name: str) -> Measured:
    """Load ``name`` with ``config``'s settings, plan once to warm up, and time the reference
    plans (the module docstring says which and why). The model is freed before returning, so the
    next candidate, or the one chosen, has the card to itself. A card too small for it is a
    ThorError: the rule then skips the model with that reason."""
    import gc

    import torch

    from thor_runtime.errors import ThorError

    try:
        times = _timed_plans(config, name)
    except torch.cuda.OutOfMemoryError:
        raise ThorError("out of GPU memory while loading or planning") from None
    finally:
        gc.collect()  # the runtime went with _timed_plans' frame; its cycles go here
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return Measured(statistics.median(times), len(times))


def _timed_plans(config: RuntimeConfig, name: str) -> list[float]:
    from agent.files.loader import AGENT_DIR, load_skills, load_world, resolve_skills_path
    from agent.planner import specialize_request
    from thor_app.assembly import build_runtime, with_settings
    from thor_app.session import PlanSession

    cfg = with_settings(config, model__name=name, planner__log_requests="")
    world = load_world(AGENT_DIR / "worlds" / f"{REFERENCE_WORLD}.json")
    skills = load_skills(resolve_skills_path(world, None))
    p = cfg.planner

    def request(task):
        return specialize_request(task, world, skills, None, p.max_steps or None, p.lexicon)

    # no world starts on disk, nothing learned written: a measurement leaves nothing behind
    session = PlanSession(build_runtime(cfg), shelf=None, keep_learned=False)
    session.attach(skills)
    planner = session.planner()
    session.plan(request(WARM_UP_TASK), planner=planner)
    times = []
    for task in TIMED_TASKS:
        t0 = time.perf_counter()
        session.plan(request(task), planner=planner)
        times.append(time.perf_counter() - t0)
    return times


def choose_default(
    config: RuntimeConfig,
    say: Callable[[str], None],
    card: Callable[[RuntimeConfig], str | None] | None = None,
    measure: Callable[[RuntimeConfig, str], Measured] | None = None,
) -> RuntimeConfig:
    """``config`` with the model the default rule picks (the module docstring), said in one line
    to ``say`` whenever the device is a CUDA card (a goal of 0 included); unchanged, and nothing
    said, where a model is named or the device is the CPU. ``card`` and ``measure`` default to
    ``cuda_card`` and ``time_warm_plan`` (tests give their own)."""
    if config.model.name != DEFAULT_MODEL:
        return config
    device = (card or cuda_card)(config)
    if device is None:
        return config
    timer = measure or time_warm_plan
    choice: Choice = choose_model(
        device,
        measured_settings(config),
        config.planner.latency_goal_s,
        lambda entry: timer(config, entry.name),
        models_dir(),
        say=say,
    )
    say(choice.line)
    if not choice.substituted:
        return config
    from thor_app.assembly import with_settings

    return with_settings(config, model__name=choice.name)
