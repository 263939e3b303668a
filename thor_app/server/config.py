"""`thor serve` configuration: one TOML file, one frozen dataclass per table.

Every value is checked when the file is read, so a typo fails at start-up with the key's name
(exit 2) instead of minutes later on the robot. Unknown tables and keys are refused for the same
reason. The only environment variable is ``THOR_CONFIG``, which points at the file.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from engines import BACKEND_NAMES
from thor_runtime.config import WEIGHT_DTYPES, WEIGHT_LAYOUTS
from thor_runtime.errors import ThorError
from thor_runtime.speculative import SPEC_METHODS

CONFIG_ENV = "THOR_CONFIG"
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8")
THINKING = ("auto", "on", "off")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ThorError(msg)


@dataclass(frozen=True)
class ServerSection:
    host: str = "127.0.0.1"
    port: int = 8700
    stall_s: float = 60.0          # a generation with no committed token this long stops the watchdog
    shutdown_grace_s: float = 20.0  # SIGTERM: how long in-flight work may finish before it is cancelled

    def __post_init__(self):
        _check(isinstance(self.host, str) and bool(self.host), "server.host must be a non-empty string")
        _check(isinstance(self.port, int) and 0 <= self.port <= 65535, f"server.port must be 0..65535, got {self.port!r}")
        _check(_num(self.stall_s) and self.stall_s > 0, "server.stall_s must be > 0")
        _check(_num(self.shutdown_grace_s) and self.shutdown_grace_s >= 0, "server.shutdown_grace_s must be >= 0")


@dataclass(frozen=True)
class ModelSection:
    name: str = "default"
    dtype: str = "fp32"
    kv_dtype: str = "fp32"
    weights_layout: str = "auto"
    prefill_chunk: int = 0
    prefix_cache: int = 2          # recent prompts whose K/V a request with the same start reuses
    kv_scales: str = ""            # FP8 KV scales file; "" = unit scales
    backend: str = "torch"

    def __post_init__(self):
        _check(isinstance(self.name, str) and bool(self.name), "model.name must be a non-empty string")
        _check(self.dtype in WEIGHT_DTYPES, f"model.dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {self.dtype!r}")
        _check(self.kv_dtype in KV_DTYPES, f"model.kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        _check(self.weights_layout in WEIGHT_LAYOUTS,
               f"model.weights_layout must be one of {', '.join(WEIGHT_LAYOUTS)}, got {self.weights_layout!r}")
        _check(_int(self.prefill_chunk) and self.prefill_chunk >= 0, "model.prefill_chunk must be an integer >= 0")
        _check(_int(self.prefix_cache) and self.prefix_cache >= 0, "model.prefix_cache must be an integer >= 0")
        _check(isinstance(self.kv_scales, str), "model.kv_scales must be a path string")
        _check(self.backend in BACKEND_NAMES,
               f"model.backend must be one of {', '.join(BACKEND_NAMES)}, got {self.backend!r}")
        # The graph backends export plain fp32/bf16 weights; weight-only int8/int4 (and auto, which
        # picks int4 for a quantized GGUF) run on torch.
        _check(self.backend == "torch" or self.dtype in ("fp32", "bf16"),
               f"model.backend {self.backend} runs fp32 or bf16 weights, not model.dtype {self.dtype}")


@dataclass(frozen=True)
class SpeculationSection:
    method: str = "auto"
    drafter: str = ""              # DFlash drafter dir; "" = the shipped one
    block_size: int = 0            # 0 = the drafter's own
    window: int = 128
    ngram_k: int = 8
    fixed_k: bool = False
    lookup_rate: float = 0.8

    def __post_init__(self):
        _check(self.method in SPEC_METHODS, f"speculation.method must be one of {', '.join(SPEC_METHODS)}")
        _check(isinstance(self.drafter, str), "speculation.drafter must be a path string")
        _check(_int(self.block_size) and (self.block_size == 0 or self.block_size >= 2),
               "speculation.block_size must be 0 (the drafter's) or >= 2")
        _check(_int(self.window) and self.window >= 1, "speculation.window must be an integer >= 1")
        _check(_int(self.ngram_k) and self.ngram_k >= 1, "speculation.ngram_k must be an integer >= 1")
        _check(isinstance(self.fixed_k, bool), "speculation.fixed_k must be true or false")
        _check(_num(self.lookup_rate) and 0 < self.lookup_rate < 1, "speculation.lookup_rate must be in (0, 1)")


@dataclass(frozen=True)
class LimitsSection:
    max_body_bytes: int = 1 << 20
    queue_size: int = 8            # requests waiting behind the running one; more -> 429
    request_timeout_s: float = 120.0
    default_max_tokens: int = 256  # chat, when the request gives none
    max_tokens: int = 2048         # chat, the most a request may ask for

    def __post_init__(self):
        _check(_int(self.max_body_bytes) and self.max_body_bytes >= 1024, "limits.max_body_bytes must be >= 1024")
        _check(_int(self.queue_size) and self.queue_size >= 1, "limits.queue_size must be an integer >= 1")
        _check(_num(self.request_timeout_s) and self.request_timeout_s > 0, "limits.request_timeout_s must be > 0")
        _check(_int(self.default_max_tokens) and self.default_max_tokens >= 1, "limits.default_max_tokens must be >= 1")
        _check(_int(self.max_tokens) and self.max_tokens >= self.default_max_tokens,
               "limits.max_tokens must be an integer >= limits.default_max_tokens")


@dataclass(frozen=True)
class AuthSection:
    api_keys_file: str = ""        # one key per line, '#' comments; "" = no authentication

    def __post_init__(self):
        _check(isinstance(self.api_keys_file, str), "auth.api_keys_file must be a path string")

    def load_keys(self) -> tuple[str, ...]:
        if not self.api_keys_file:
            return ()
        p = Path(self.api_keys_file)
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ThorError(f"auth.api_keys_file {p}: {e.strerror or e}") from None
        keys = tuple(s for s in (ln.strip() for ln in lines) if s and not s.startswith("#"))
        _check(bool(keys), f"auth.api_keys_file {p} holds no keys")
        _check(all(len(k) >= 16 and not any(c.isspace() for c in k) for k in keys),
               f"auth.api_keys_file {p}: every key must be at least 16 characters with no spaces")
        return keys


@dataclass(frozen=True)
class PlannerSection:
    worlds_dir: str = ""           # worlds by name: <dir>/<name>.json; "" = the shipped samples
    skills_dir: str = ""
    max_tokens: int = 512          # token budget per attempt
    attempts: int = 2              # repair attempts after the first
    max_steps: int = 0             # 0 = the schema's own cap
    thinking: str = "auto"

    def __post_init__(self):
        _check(isinstance(self.worlds_dir, str) and isinstance(self.skills_dir, str),
               "planner.worlds_dir / planner.skills_dir must be path strings")
        _check(_int(self.max_tokens) and self.max_tokens >= 16, "planner.max_tokens must be an integer >= 16")
        _check(_int(self.attempts) and 0 <= self.attempts <= 8, "planner.attempts must be 0..8")
        _check(_int(self.max_steps) and self.max_steps >= 0, "planner.max_steps must be an integer >= 0")
        _check(self.thinking in THINKING, f"planner.thinking must be one of {', '.join(THINKING)}")

    def worlds_path(self) -> Path:
        from agent.files import AGENT_DIR

        return Path(self.worlds_dir) if self.worlds_dir else AGENT_DIR / "worlds"

    def skills_path(self) -> Path:
        from agent.files import AGENT_DIR

        return Path(self.skills_dir) if self.skills_dir else AGENT_DIR / "skills"


@dataclass(frozen=True)
class ServeConfig:
    server: ServerSection = field(default_factory=ServerSection)
    model: ModelSection = field(default_factory=ModelSection)
    speculation: SpeculationSection = field(default_factory=SpeculationSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    auth: AuthSection = field(default_factory=AuthSection)
    planner: PlannerSection = field(default_factory=PlannerSection)
    source: str = "<defaults>"

    def with_overrides(self, host: str | None = None, port: int | None = None) -> "ServeConfig":
        server = replace(self.server, **{k: v for k, v in (("host", host), ("port", port)) if v is not None})
        return replace(self, server=server)


_SECTION_TYPES = {"server": ServerSection, "model": ModelSection, "speculation": SpeculationSection,
                  "limits": LimitsSection, "auth": AuthSection, "planner": PlannerSection}


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def config_from_dict(doc: dict, source: str = "<memory>") -> ServeConfig:
    sections = {}
    for name, table in doc.items():
        cls = _SECTION_TYPES.get(name)
        if cls is None:
            raise ThorError(f"{source}: unknown table [{name}] (known: {', '.join(_SECTION_TYPES)})")
        if not isinstance(table, dict):
            raise ThorError(f"{source}: {name} must be a table")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ThorError(f"{source}: unknown key {name}.{unknown[0]} (known: {', '.join(sorted(known))})")
        values = dict(table)
        for f in fields(cls):  # TOML writes 120 for 120.0; a float field takes either
            if f.type == "float" and _int(values.get(f.name)):
                values[f.name] = float(values[f.name])
        try:
            sections[name] = cls(**values)
        except ThorError as e:
            raise ThorError(f"{source}: {e}") from None
    return ServeConfig(**sections, source=source)


def load_config(path: str | None = None) -> ServeConfig:
    """--config wins, then $THOR_CONFIG, else every default."""
    path = path or os.environ.get(CONFIG_ENV) or None
    if path is None:
        return ServeConfig()
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ThorError(f"config file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ThorError(f"config file {p}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ThorError(f"config file {p}: not valid TOML ({e})") from None
    return config_from_dict(doc, str(p))
