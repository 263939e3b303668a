"""`thor serve` configuration: one TOML file, one frozen dataclass per table.

The runtime's tables ([model], [engine], [speculation], [planner]) are the sections of
thor_runtime.config.RuntimeConfig, whose field table the CLI flags are derived from too;
[server], [limits] and [auth] are the service's own. Every value is checked when the file is
read, so a typo fails at start-up with the key's name (exit 2) instead of minutes later on the
robot. Unknown tables and keys are refused for the same reason. The only environment variable
is ``THOR_CONFIG``, which points at the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import tomllib

from thor_runtime.config import (
    SECTIONS,
    PlannerSettings,
    RuntimeConfig,
    section_from_table,
    toml_fields,
)
from thor_runtime.errors import ThorError

CONFIG_ENV = "THOR_CONFIG"


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ThorError(msg)


@dataclass(frozen=True)
class ServerSection:
    host: str = "127.0.0.1"
    port: int = 8700
    # a generation with no progress (a token, a prefill chunk) this long stops the watchdog
    stall_s: float = 60.0
    shutdown_grace_s: float = (
        20.0  # SIGTERM: how long in-flight work may finish before it is cancelled
    )
    # Host header names served besides the loopback ones (a web page that rebinds its own DNS
    # name to 127.0.0.1 sends that name, and is refused)
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self):
        _check(
            isinstance(self.allowed_hosts, (list, tuple))
            and all(isinstance(h, str) and h and h == h.strip() for h in self.allowed_hosts),
            "server.allowed_hosts must be a list of host names",
        )
        object.__setattr__(self, "allowed_hosts", tuple(h.lower() for h in self.allowed_hosts))
        _check(
            isinstance(self.host, str) and bool(self.host), "server.host must be a non-empty string"
        )
        _check(
            isinstance(self.port, int) and 0 <= self.port <= 65535,
            f"server.port must be 0..65535, got {self.port!r}",
        )
        _check(_num(self.stall_s) and self.stall_s > 0, "server.stall_s must be > 0")
        _check(
            _num(self.shutdown_grace_s) and self.shutdown_grace_s >= 0,
            "server.shutdown_grace_s must be >= 0",
        )


@dataclass(frozen=True)
class LimitsSection:
    max_body_bytes: int = 1 << 20
    queue_size: int = 8  # requests waiting for a generation slot; more -> 429
    batch: int = 4  # requests generating at once, their forwards shared; 1 = one at a time
    request_timeout_s: float = 120.0
    default_max_tokens: int = 256  # chat, when the request gives none
    max_tokens: int = 2048  # chat, the most a request may ask for

    def __post_init__(self):
        _check(
            _int(self.max_body_bytes) and self.max_body_bytes >= 1024,
            "limits.max_body_bytes must be >= 1024",
        )
        _check(
            _int(self.queue_size) and self.queue_size >= 1,
            "limits.queue_size must be an integer >= 1",
        )
        _check(_int(self.batch) and 1 <= self.batch <= 16, "limits.batch must be an integer 1..16")
        _check(
            _num(self.request_timeout_s) and self.request_timeout_s > 0,
            "limits.request_timeout_s must be > 0",
        )
        _check(
            _int(self.default_max_tokens) and self.default_max_tokens >= 1,
            "limits.default_max_tokens must be >= 1",
        )
        _check(
            _int(self.max_tokens) and self.max_tokens >= self.default_max_tokens,
            "limits.max_tokens must be an integer >= limits.default_max_tokens",
        )


@dataclass(frozen=True)
class AuthSection:
    api_keys_file: str = ""  # one key per line, '#' comments; "" = no authentication

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
        _check(
            all(len(k) >= 16 and not any(c.isspace() for c in k) for k in keys),
            f"auth.api_keys_file {p}: every key must be at least 16 characters with no spaces",
        )
        return keys


def worlds_path(p: PlannerSettings) -> Path:
    """planner.worlds_dir, else the shipped sample worlds."""
    from agent.files.loader import AGENT_DIR

    return Path(p.worlds_dir) if p.worlds_dir else AGENT_DIR / "worlds"


def skills_path(p: PlannerSettings) -> Path:
    from agent.files.loader import AGENT_DIR

    return Path(p.skills_dir) if p.skills_dir else AGENT_DIR / "skills"


@dataclass(frozen=True)
class ServeConfig:
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    server: ServerSection = field(default_factory=ServerSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    auth: AuthSection = field(default_factory=AuthSection)
    source: str = "<defaults>"

    # The runtime's sections, read where the service used to keep its own copies.
    @property
    def model(self):
        return self.runtime.model

    @property
    def engine(self):
        return self.runtime.engine

    @property
    def speculation(self):
        return self.runtime.speculation

    @property
    def planner(self):
        return self.runtime.planner

    def with_overrides(self, host: str | None = None, port: int | None = None) -> "ServeConfig":
        server = replace(
            self.server, **{k: v for k, v in (("host", host), ("port", port)) if v is not None}
        )
        return replace(self, server=server)


_SERVICE_TABLES = {"server": ServerSection, "limits": LimitsSection, "auth": AuthSection}
# The runtime sections the file spells (sampling is per request: the request body).
RUNTIME_TABLES = tuple(name for name in SECTIONS if toml_fields(name))
# Spellings of earlier releases, still read so a deployed file keeps working.
_MOVED = {("model", "backend"): ("engine", "backend")}


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def config_from_dict(doc: dict, source: str = "<memory>") -> ServeConfig:
    doc = _moved_keys(doc, source)
    service, runtime = {}, {}
    for name, table in doc.items():
        if name in RUNTIME_TABLES:
            runtime[name] = section_from_table(name, table, source)
            continue
        cls = _SERVICE_TABLES.get(name)
        if cls is None:
            known = ", ".join((*_SERVICE_TABLES, *RUNTIME_TABLES))
            raise ThorError(f"{source}: unknown table [{name}] (known: {known})")
        if not isinstance(table, dict):
            raise ThorError(f"{source}: {name} must be a table")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ThorError(
                f"{source}: unknown key {name}.{unknown[0]} (known: {', '.join(sorted(known))})"
            )
        values = dict(table)
        for f in fields(cls):  # TOML writes 120 for 120.0; a float field takes either
            if f.type == "float" and _int(values.get(f.name)):
                values[f.name] = float(values[f.name])
        try:
            service[name] = cls(**values)
        except ThorError as e:
            raise ThorError(f"{source}: {e}") from None
    try:
        rc = RuntimeConfig(**runtime)
    except ThorError as e:
        raise ThorError(f"{source}: {e}") from None
    return ServeConfig(rc, **service, source=source)


def _moved_keys(doc: dict, source: str) -> dict:
    doc = {k: dict(v) if isinstance(v, dict) else v for k, v in doc.items()}
    for (old_t, old_k), (new_t, new_k) in _MOVED.items():
        table = doc.get(old_t)
        if isinstance(table, dict) and old_k in table:
            target = doc.setdefault(new_t, {})
            if isinstance(target, dict) and new_k in target:
                raise ThorError(
                    f"{source}: {old_t}.{old_k} and {new_t}.{new_k} both set; keep {new_t}.{new_k}"
                )
            if isinstance(target, dict):
                target[new_k] = table.pop(old_k)
    return doc


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
