"""One frozen, validated tree of runtime settings: model, engine, speculation, sampling, planner.

Every default is stated once, here. Each field carries its metadata (``Setting``): the CLI flag,
the TOML key in its section's table, the help text and the accepted values. The CLI flags
(thor_app/flags.py) and the service's TOML file (thor_app/server/config.py) are both derived
from this table, so the two spellings cannot drift. No torch here: a config is read and checked
before anything heavy is imported, and ``thor --help`` stays light.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable

from thor_runtime.device import DEVICE_DEFAULT, check_device
from thor_runtime.errors import ThorError
from thor_runtime.models.config import WEIGHT_DTYPES, WEIGHT_LAYOUTS

# The vocabularies, once. engines/ re-exports the backend ones (its modules import torch).
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8")
SPEC_METHODS = (
    "none",
    "ngram",
    "dflash",
    "combined",
    "auto",
    "hybrid",
)  # hybrid: combined's earlier name
ENGINE_BACKENDS = ("torch", "onnxruntime", "tensorrt")
ENGINE_FORMS = ("segments", "fused")
ORT_OPT_LEVELS = ("disable", "basic", "extended", "all")
ENGINE_PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
# The graph backends export float weights; auto means fp32 there (assembly.load_model).
GRAPH_DTYPES = ("auto", "fp32", "bf16", "fp16")
THINKING = ("auto", "on", "off")
RELAXED_MARGINS = ("logit", "prob")
# Prompt lookup's n-gram lengths, shortest and longest: the proposer's and SpecOptions' default,
# not a CLI flag or TOML key.
NGRAM_SIZES = (2, 4)


@dataclass(frozen=True)
class Setting:
    """How one field is spelled and checked. ``flag`` None: TOML only; ``toml`` False: CLI only."""

    help: str
    flag: str | None = None
    toml: bool = True
    choices: tuple | None = None
    low: float | None = None  # inclusive lower bound for numbers
    high: float | None = None  # inclusive upper bound
    check: Callable[[Any], Any] | None = None  # raises ThorError; may normalize the value


def setting(default, help: str, flag: str | None = None, **kw):
    return field(default=default, metadata={"setting": Setting(help, flag, **kw)})


def meta(f) -> Setting:
    return f.metadata["setting"]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate(section: str, obj) -> None:
    for f in fields(obj):
        s, v, key = meta(f), getattr(obj, f.name), f"{section}.{f.name}"
        kind = type(f.default) if f.default is not None else None
        if v is None and f.default is None:
            continue
        if kind is bool and not isinstance(v, bool):
            raise ThorError(f"{key} must be true or false, got {v!r}")
        if kind is int and not _is_int(v):
            raise ThorError(f"{key} must be an integer, got {v!r}")
        if kind is float:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ThorError(f"{key} must be a number, got {v!r}")
            object.__setattr__(obj, f.name, float(v))  # TOML writes 2 for 2.0
            v = float(v)
        if kind is str and not isinstance(v, str):
            raise ThorError(f"{key} must be a string, got {v!r}")
        if s.choices is not None and v not in s.choices:
            shown = ", ".join(c or "''" for c in s.choices)
            raise ThorError(f"{key} must be one of {shown}, got {v!r}")
        if s.low is not None and v < s.low:
            raise ThorError(f"{key} must be >= {s.low:g}, got {v!r}")
        if s.high is not None and v > s.high:
            raise ThorError(f"{key} must be <= {s.high:g}, got {v!r}")
        if s.check is not None:
            try:
                object.__setattr__(obj, f.name, s.check(v))
            except ThorError as e:
                raise ThorError(f"{key}: {e}") from None


def _block_size(v: int) -> int:
    if v == 1:
        raise ThorError("must be 0 (the drafter's own) or >= 2")
    return v


def _open_unit(v: float) -> float:
    if not 0 < v < 1:
        raise ThorError(f"must be in (0, 1), got {v}")
    return v


@dataclass(frozen=True)
class ModelSettings:
    name: str = setting(
        "default",
        "default (the embedded SmolLM2-135M-Instruct; on CUDA the largest pulled catalog "
        "model within --latency-goal), a name from `thor models list`, an HF dir, or a .gguf "
        "file",
        "--model",
    )
    dtype: str = setting(
        "auto",
        "weights: auto (a quantized GGUF runs int4 with its own group scales, other "
        "checkpoints fp32; fp32 on a graph backend), fp32, bf16, fp16, int8 or int4 (weight-only)",
        "--dtype",
        choices=WEIGHT_DTYPES,
    )
    device: str = setting(
        DEVICE_DEFAULT,
        "auto (CUDA when torch sees one, else the CPU), cpu, cuda or cuda:N",
        "--device",
        check=check_device,
    )
    kv_dtype: str = setting(
        "fp32", "KV cache storage (fp8 = e4m3)", "--kv-dtype", choices=KV_DTYPES
    )
    kv_scales: str = setting(
        "", "FP8 KV scales file (thor calib kv-scales); '' = unit scales", "--kv-scales"
    )
    weights_layout: str = setting(
        "auto",
        "CPU: dense (MKL), packed (oneDNN), dual (both: fastest for fp32, twice "
        "the memory); auto = dual for fp32, packed for bf16, where oneDNN can pack",
        "--weights-layout",
        choices=WEIGHT_LAYOUTS,
    )
    prefill_chunk: int = setting(
        0, "prefill chunk size in tokens (0 = one pass)", "--prefill-chunk", low=0
    )
    prefix_cache: int = setting(
        2,
        "keep the K/V of this many recent prompts; a prompt that starts like one of "
        "them prefills only the rest (a repair, another task in the same world); 0 = off",
        "--prefix-cache",
        low=0,
    )
    world_starts: int = setting(
        16,
        "keep on disk, beside the weight cache, the K/V of the prompt start of this many "
        "worlds: a new process planning in one of them prefills only the task; 0 = off",
        "--world-starts",
        low=0,
    )
    weight_cache: str = setting(
        "auto",
        "prepared low-bit weight cache dir (auto = $THOR_CACHE_DIR or "
        "$XDG_CACHE_HOME/thor-runtime/weights; '' = no cache)",
        "--cache-dir",
    )
    int4_kernel: str = setting(
        "auto", "what int4 weights run on (auto: the fastest available)", "--int4-kernel"
    )
    step_rows: int = setting(
        16,
        "CUDA: rows of every decode forward — a plain step padded to them, a verify of "
        "up to this many — one shape, so speculative output equals plain output; caps K + 1",
        "--step-rows",
        low=1,
        high=64,
    )
    max_context: int = setting(
        4096,
        "CUDA: tokens of the static KV store (prompt + output of one request at most)",
        "--max-context",
        low=16,
    )
    compile: bool = setting(
        False,
        "CUDA: the decode forward through torch.compile (fewer, fused kernels; about a "
        "minute per shape at first use)",
        "--compile",
    )

    def __post_init__(self):
        _validate("model", self)


@dataclass(frozen=True)
class EngineSettings:
    backend: str = setting(
        "torch",
        "what runs the dense segments; attention and the KV cache stay in torch",
        "--backend",
        choices=ENGINE_BACKENDS,
    )
    form: str = setting(
        "segments",
        "segments: one graph per segment; fused: post_attn of layer i and pre_attn "
        "of i+1 as one (dense models)",
        "--engine-form",
        choices=ENGINE_FORMS,
    )
    cache_dir: str = setting(
        "", "engine cache dir ('' = $THOR_ENGINE_CACHE or ~/.cache/thor/engines)", "--engine-cache"
    )
    threads: int = setting(
        0, "onnxruntime intra-op threads (0 = torch's)", "--engine-threads", low=0
    )
    ort_opt_level: str = setting(
        "all", "onnxruntime graph optimizations", "--ort-opt-level", choices=ORT_OPT_LEVELS
    )
    trt_precision: str = setting(
        "",
        "tensorrt precision ('' = the weights' dtype; fp8 needs --fp8-scales)",
        "--trt-precision",
        choices=("",) + ENGINE_PRECISIONS,
    )
    fp8_scales: str = setting(
        "",
        "fp8 GEMMs through Q/DQ graphs with these activation scales (`thor calib "
        "fp8-scales`): tensorrt builds FP8 engines, onnxruntime runs the same graphs",
        "--fp8-scales",
    )

    def __post_init__(self):
        _validate("engine", self)


@dataclass(frozen=True)
class SpeculationSettings:
    method: str = setting(
        "auto",
        "speculative decoding: auto pairs the drafter (plans) with prompt lookup "
        "(free text) when a drafter fits",
        "--spec",
        choices=SPEC_METHODS,
    )
    drafter: str = setting("", "DFlash drafter dir ('' = the shipped one)", "--drafter")
    block_size: int = setting(
        0,
        "DFlash block size B, K = B-1 (0 = the drafter's own)",
        "--block-size",
        low=0,
        check=_block_size,
    )
    window: int = setting(128, "DFlash per-token context window W", "--window", low=1)
    seed_window: bool = setting(
        True, "seed the DFlash window from the prompt tail", "--no-window-seed"
    )
    ngram_k: int = setting(8, "prompt-lookup drafts per cycle", "--ngram-k", low=1)
    lookup_rate: float = setting(
        0.8,
        "combined: prior per-token acceptance of a prompt-lookup draft; the cycle "
        "verifies lookup's draft when it expects more accepted tokens than DFlash's",
        "--lookup-rate",
        check=_open_unit,
    )
    fixed_k: bool = setting(
        False,
        "verify all K drafts every cycle (default: only 2 while the proposer is rarely right)",
        "--fixed-k",
    )
    relaxed_thinking: bool = setting(
        False, "relaxed acceptance inside <think>...</think> (greedy only)", "--relaxed-thinking"
    )
    relaxed_spans: bool = setting(
        False,
        "relaxed acceptance inside the plan's free-text rationale too (greedy "
        "only); goal, steps and arguments stay exact",
        "--relaxed-spans",
    )
    relaxed_topk: int = setting(
        3, "relaxed acceptance: the draft is in the target's top k", "--relaxed-topk", low=1
    )
    relaxed_delta: float = setting(
        2.0,
        "relaxed acceptance: the most its margin may be below the top",
        "--relaxed-delta",
        low=0.0,
    )
    relaxed_margin: str = setting(
        "logit",
        "relaxed acceptance: margin in logits or probabilities",
        "--relaxed-margin",
        choices=RELAXED_MARGINS,
    )

    def __post_init__(self):
        _validate("speculation", self)


@dataclass(frozen=True)
class SamplingSettings:
    """Per request in the service (the request body), so these are CLI flags only."""

    temperature: float = setting(
        0.0, "sampling temperature (0 = greedy)", "--temperature", toml=False, low=0.0
    )
    top_k: int = setting(
        0, "sample from the k most likely tokens (0 = all)", "--top-k", toml=False, low=0
    )
    top_p: float = setting(1.0, "nucleus sampling mass", "--top-p", toml=False, low=0.0, high=1.0)
    seed: int | None = setting(None, "sampling seed (reproducible runs)", "--seed", toml=False)

    def __post_init__(self):
        _validate("sampling", self)


@dataclass(frozen=True)
class PlannerSettings:
    max_tokens: int = setting(512, "token budget per attempt", "--max-tokens", low=16)
    attempts: int = setting(2, "repair attempts after the first", "--attempts", low=0, high=8)
    max_steps: int = setting(0, "cap on plan steps (0 = the schema's own)", "--max-steps", low=0)
    thinking: str = setting(
        "auto",
        "a <think> span before the plan: auto = when the model has the tokens",
        "--thinking",
        choices=THINKING,
    )
    solver: bool = setting(
        True,
        "complete the steps from the plan's goal with the symbolic solver",
        "--no-solver",
        toml=False,
    )
    goal_choice: int = setting(
        2,
        "alternative goals weighed against the greedy one: this many branches where "
        "the greedy goal led least, and one goal per form the skills allow (a call "
        "of each skill, an order, a set), ranked by reachability, then by how much "
        "likelier the task makes each (0 = off: the greedy goal)",
        "--goal-choice",
        low=0,
        high=8,
        toml=False,
    )
    lexicon: str = setting(
        "shipped",
        "word knowledge the goal choice may take as hints: shipped (every "
        "lexicon that ships: English), none (no word knowledge), or a comma list of "
        "languages and lexicon files",
        "--lexicon",
    )
    # The plan-latency goal a default model is chosen by on CUDA (thor_runtime/model_choice.py):
    # 2 s is what the 0.5B planner takes on a 2-core CPU (docs/cuda.md): a GPU then runs the
    # largest model that still plans no slower than a small CPU does with that one.
    latency_goal_s: float = setting(
        2.0,
        "seconds a warm plan may take: on CUDA the model `default` is the largest pulled "
        "catalog model measured within it, else the embedded one (0 = always the embedded one)",
        "--latency-goal",
        low=0.0,
    )
    worlds_dir: str = setting(
        "", "the service's worlds by name: <dir>/<name>.json ('' = the shipped samples)"
    )
    skills_dir: str = setting("", "the service's skills by name ('' = the shipped samples)")
    # opt-in calibration data: what robots were asked may be private, so nothing by default
    log_requests: str = setting(
        "",
        "keep each plan request (world, skills, task) and the model's answer in this "
        "directory, for `thor calib gen-data --from-log` ('' = off: nothing is kept)",
        "--log-requests",
    )
    log_requests_max_mb: int = setting(
        64,
        "the most the request log keeps, in MiB: the oldest requests go first",
        "--log-requests-max-mb",
        low=1,
    )

    def __post_init__(self):
        _validate("planner", self)

    @property
    def think(self) -> bool | None:
        """What agent.planner.planner.Planner takes: None = decide from the tokenizer."""
        return {"auto": None, "on": True, "off": False}[self.thinking]


SECTIONS = {
    "model": ModelSettings,
    "engine": EngineSettings,
    "speculation": SpeculationSettings,
    "sampling": SamplingSettings,
    "planner": PlannerSettings,
}


@dataclass(frozen=True)
class RuntimeConfig:
    model: ModelSettings = field(default_factory=ModelSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    planner: PlannerSettings = field(default_factory=PlannerSettings)

    def __post_init__(self):
        # Checks that span two sections.
        if self.engine.backend != "torch" and self.model.dtype not in GRAPH_DTYPES:
            raise ThorError(
                f"engine.backend {self.engine.backend} runs float weights "
                f"({', '.join(GRAPH_DTYPES)}), not model.dtype {self.model.dtype}"
            )
        if self.engine.trt_precision == "fp8" and not self.engine.fp8_scales:
            raise ThorError(
                "fp8 GEMMs need calibrated activation scales: pass --fp8-scales FILE "
                "(write one with `thor calib fp8-scales`)"
            )


def toml_fields(section: str):
    """The fields of a section that the TOML file spells."""
    return [f for f in fields(SECTIONS[section]) if meta(f).toml]


def section_from_table(section: str, table: dict, source: str):
    """A TOML table -> the section's settings; unknown keys are refused by name."""
    if not isinstance(table, dict):
        raise ThorError(f"{source}: {section} must be a table")
    known = {f.name for f in toml_fields(section)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ThorError(
            f"{source}: unknown key {section}.{unknown[0]} (known: {', '.join(sorted(known))})"
        )
    try:
        return SECTIONS[section](**table)
    except ThorError as e:
        raise ThorError(f"{source}: {e}") from None


def defaults_table(section: str) -> dict:
    """The section's TOML keys with their defaults (what the example file states)."""
    return {f.name: f.default for f in toml_fields(section) if f.default is not MISSING}
