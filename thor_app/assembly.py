"""One assembly: a RuntimeConfig in, a ready runtime out.

Every entry point builds its runtime here — the commands, the service's loader, the benchmarks,
the peers worker, the self-test, the engine builds and calibration — so a setting added to the
config tree is honoured everywhere by one edit. The steps, in order: the device, the model on
it (weight cache, dtype and layout for the backend), the speculation (its K sets the engines'
profiles), the backend attached to the model's dense segments, the KV scales, the Runtime.
What lives across the plans on that runtime is its PlanSession (thor_app/session.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from thor_runtime.config import RuntimeConfig
from thor_runtime.errors import ThorError


@dataclass(frozen=True)
class Assembled:
    config: RuntimeConfig
    loaded: object  # thor_runtime.loading.Loaded
    runtime: object  # thor_runtime.engine.generate.Runtime
    speculation: object  # thor_runtime.speculative.Speculation
    backend: object = None  # engines.backend.GraphBackend attached to the model; None = torch

    @property
    def device(self):
        return self.loaded.model.device


def load_model(config: RuntimeConfig, name: str | None = None, dtype: str | None = None):
    """The model of ``config`` on its device. A graph backend holds its own copy of the
    weights, so torch's side gets plain fp32 (auto) and no second, packed layout."""
    from thor_runtime.device import resolve_device
    from thor_runtime.loading import load

    m, graphs = config.model, config.engine.backend != "torch"
    device = resolve_device(m.device)
    dtype = dtype or m.dtype
    layout = m.weights_layout
    if graphs:
        dtype = "fp32" if dtype == "auto" else dtype
        layout = "dense" if layout == "auto" else layout
    cache = None if m.weight_cache == "auto" else m.weight_cache
    return load(
        name or m.name,
        dtype,
        device=device,
        layout=layout,
        cache_dir=cache,
        int4_kernel=m.int4_kernel,
    )


def spec_options(config: RuntimeConfig):
    from thor_runtime.speculative import SpecOptions

    s = config.speculation
    return SpecOptions(
        method=s.method,
        drafter=s.drafter or None,
        block_size=s.block_size or None,
        window=s.window,
        seed_window=s.seed_window,
        ngram_k=s.ngram_k,
        fixed_k=s.fixed_k,
        lookup_rate=s.lookup_rate,
    )


def relaxed_config(config: RuntimeConfig, tokenizer):
    """Relaxed acceptance in the thinking span (--relaxed-thinking) and in the plan's free-text
    spans (--relaxed-spans, which needs no thinking tokens); None when both are off."""
    s = config.speculation
    if not (s.relaxed_thinking or s.relaxed_spans):
        return None
    from thor_runtime.speculative import RelaxedConfig

    b = e = None
    if s.relaxed_thinking:
        b, e = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
        if b is None or e is None:
            raise ThorError("--relaxed-thinking: the tokenizer has no <think> / </think> tokens")
    return RelaxedConfig(
        b, e, s.relaxed_topk, s.relaxed_delta, s.relaxed_margin, spans=s.relaxed_spans
    )


def plan_format(config: RuntimeConfig, plans: bool = True) -> str | None:
    """Today's planner request format, for the staleness check of a planner drafter; None when
    the runtime will not plan (free text only) or its method runs no drafter."""
    from thor_runtime.speculative import DRAFTER_METHODS

    if not plans or config.speculation.method not in DRAFTER_METHODS + ("hybrid",):
        return None
    from agent.planner.plan_format import plan_format_fingerprint

    return plan_format_fingerprint()


def build_speculation(config: RuntimeConfig, loaded, plans: bool = True):
    """The one Speculation of a config (proposer, K, budget, relaxed acceptance). ``plans``:
    the runtime serves the planner, so a drafter trained on another plan format is stale
    (thor_runtime/speculative/shipped.py); False for free text only (`thor generate`)."""
    from thor_runtime.speculative import build_speculation as build

    return build(
        spec_options(config),
        loaded.model,
        relaxed_config(config, loaded.tokenizer),
        plan_format=plan_format(config, plans),
    )


def backend_options(config: RuntimeConfig, spec_k: int = 0, **overrides):
    """``spec_k``: the most drafts the runtime verifies per cycle; with the prefill chunk it sets
    TensorRT's optimization profiles. ``overrides``: BackendOptions fields (bench sweeps)."""
    from engines.backend import BackendOptions, profile_tokens

    e = config.engine
    opts = dict(
        form=e.form,
        cache_dir=e.cache_dir or None,
        threads=e.threads,
        opt_level=e.ort_opt_level,
        precision=e.trt_precision or None,
        fp8_scales=e.fp8_scales or None,
        profiles=profile_tokens(spec_k, config.model.prefill_chunk),
    )
    opts.update({k: v for k, v in overrides.items() if v is not None})
    return BackendOptions(**opts)


def progress_bar(desc: str, unit: str = "graph"):
    """A tqdm bar on stderr driven by the engines' progress(label, done, total) callbacks."""
    from tqdm import tqdm

    state = {}

    def progress(label: str, done: int, total: int) -> None:
        bar = state.get("bar")
        if bar is None or bar.total != total:
            if bar is not None:
                bar.close()
            bar = state["bar"] = tqdm(
                total=total, desc=desc, unit=unit, leave=False, file=sys.stderr
            )
        bar.set_postfix_str(label, refresh=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
            state.pop("bar")

    return progress


def make_backend(
    config: RuntimeConfig,
    loaded,
    speculation=None,
    name: str | None = None,
    attach: bool = True,
    **overrides,
):
    """The backend of ``config`` (or ``name``) for ``loaded``'s dense segments, attached unless
    ``attach`` is False; None for torch. Its profiles follow ``speculation``'s K."""
    from engines.backend import attach as attach_to
    from engines.backend import make_backend as make
    from engines.backend import spec_width

    name = name or config.engine.backend
    if name == "torch":
        if attach:
            attach_to(loaded.model, None)
        return None
    k = spec_width(speculation) if speculation is not None else 0
    if loaded.model.device.type != "cpu":
        # off the CPU every decode forward runs step_rows rows (fixed_shape.py): the engines'
        # verify profile must cover them
        k = max(k, config.model.step_rows - 1)
    b = make(
        name, loaded.model, backend_options(config, k, **overrides), progress_bar(f"{name} engines")
    )
    if attach:
        attach_to(loaded.model, b)
    return b


def make_runtime(config: RuntimeConfig, loaded):
    """The Runtime over a loaded model: KV dtype and scales, prefill chunk, prefix cache."""
    from thor_runtime.cache import KVScales
    from thor_runtime.engine import Runtime

    m = config.model
    scales = KVScales.load(m.kv_scales, loaded.cfg) if m.kv_scales else None
    return Runtime(
        loaded.model,
        loaded.tokenizer,
        kv_dtype=m.kv_dtype,
        prefill_chunk=m.prefill_chunk,
        kv_scales=scales,
        prefix_cache=m.prefix_cache,
        step_rows=m.step_rows,
        max_context=m.max_context,
        compile=m.compile,  # auto's cost curve: beside the weights
        cost_cache=None if m.weight_cache == "auto" else m.weight_cache,
    )


def build_runtime(config: RuntimeConfig, loaded=None, plans: bool = True) -> Assembled:
    """Load (unless ``loaded`` is given), speculate, attach the backend, and wrap it in a Runtime.
    ``plans``: see build_speculation."""
    if config.engine.backend != "torch":
        backend_options(config)  # a bad option combination fails before the model loads
    loaded = loaded if loaded is not None else load_model(config)
    spec = build_speculation(config, loaded, plans)
    backend = make_backend(config, loaded, spec)
    return Assembled(config, loaded, make_runtime(config, loaded), spec, backend)


def with_settings(config: RuntimeConfig, **changes) -> RuntimeConfig:
    """``config`` with some fields changed, by "section__field" name: with_settings(c,
    model__dtype="bf16"). The result is validated like any other."""
    from dataclasses import replace

    by_section: dict[str, dict] = {}
    for key, v in changes.items():
        section, name = key.split("__")
        by_section.setdefault(section, {})[name] = v
    return replace(config, **{s: replace(getattr(config, s), **kv) for s, kv in by_section.items()})


def assembled_with(config: RuntimeConfig, loaded, runtime, backend=None) -> Assembled:
    """An Assembled over a given runtime (a scripted one in tests), speculating per ``config``."""
    return Assembled(config, loaded, runtime, build_speculation(config, loaded), backend)


def make_planner(a: Assembled, on_progress=None, **kw):
    """A Planner over an assembled runtime with the config's planner settings and its world
    starts, for a caller that keeps no session (PlanSession.planner, thor_app/session.py;
    ``shelf=None``: no world starts)."""
    from thor_app.session import PlanSession

    return PlanSession(a).planner(on_progress=on_progress, **kw)
