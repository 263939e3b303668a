"""The node's parameters: the runtime's, derived from the RuntimeConfig table, and its own.

Each field of the table's model, engine, speculation and planner sections is one parameter
named ``section.field`` (``model.name``, ``planner.max_tokens``): the same names, defaults,
help and checks as the CLI flags (thor_app/flags.py) and the service's TOML tables
(thor_app/server/config.py), so the three spellings cannot drift. A ROS parameter given with
``--ros-args -p`` or a ``--params-file`` wins over a `thor ros` flag, which wins over the table.
The parameters are read once, at start-up: changing the model means restarting the node.

No rclpy here: ``declare`` takes the node, the rest is plain data (tested without ROS).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from thor_runtime.config import SECTIONS, RuntimeConfig, meta
from thor_runtime.errors import ThorError

# the sections a plan reads (`thor plan` takes the same); sampling is per request, greedy here
RUNTIME_SECTIONS = ("model", "engine", "speculation", "planner")
WORLD_DURABILITY = ("volatile", "transient_local")


@dataclass(frozen=True)
class NodeParam:
    name: str
    default: object
    help: str
    choices: tuple | None = None
    low: float | None = None


# The node's own parameters (not runtime settings).
NODE_PARAMS = (
    NodeParam(
        "skills",
        "",
        "the skills file a goal that names none plans with ('' = the world's own "
        "`skills`, else agent/skills/manipulation.json); its `ros` entries map skills to actions",
    ),
    NodeParam(
        "world_topic",
        "world",
        "std_msgs/String topic whose latest message (a world as JSON) a "
        "goal that gives no world plans in ('' = no world topic)",
    ),
    NodeParam(
        "world_durability",
        "volatile",
        "the world topic's durability: transient_local also "
        "receives a world published before the node started",
        choices=WORLD_DURABILITY,
    ),
    NodeParam("self_test", True, "run the on-device self-test before the node is ready"),
    NodeParam("diagnostics_period_s", 1.0, "how often /diagnostics hears from the node", low=0.1),
    NodeParam(
        "queue_size", 4, "goals waiting for the model while one plans; more are aborted", low=0
    ),
    NodeParam(
        "max_retries",
        1,
        "a failed robot step runs again at most this many times (its "
        "on_failure retry, or a jump back to it)",
        low=0,
    ),
    NodeParam(
        "json_topics",
        True,
        "serve the JSON-in-strings interface on ~/json/* (std_msgs/String; "
        "no interface package needed)",
    ),
)


@dataclass(frozen=True)
class NodeSettings:
    skills: str = ""
    world_topic: str = "world"
    world_durability: str = "volatile"
    self_test: bool = True
    diagnostics_period_s: float = 1.0
    queue_size: int = 4
    max_retries: int = 1
    json_topics: bool = True


def runtime_params(base: RuntimeConfig) -> list[tuple[str, object, str]]:
    """(name, default, description) of every runtime parameter, defaults from ``base``."""
    out = []
    for section in RUNTIME_SECTIONS:
        current = getattr(base, section)
        for f in fields(SECTIONS[section]):
            s = meta(f)
            shown = ", ".join(c or "''" for c in s.choices or ())
            text = s.help + (f" (one of: {shown})" if s.choices else "")
            out.append((f"{section}.{f.name}", getattr(current, f.name), text))
    return out


def runtime_config(values: dict, base: RuntimeConfig) -> RuntimeConfig:
    """``base`` with the parameters in ``values`` ({"planner.max_tokens": 256, ...}), checked as
    the table checks a flag or a TOML key; an error names the parameter."""
    given: dict[str, dict] = {}
    for name, v in values.items():
        section, _, field = name.partition(".")
        if section not in RUNTIME_SECTIONS or field not in {
            f.name for f in fields(SECTIONS[section])
        }:
            raise ThorError(f"unknown parameter {name}")
        given.setdefault(section, {})[field] = v
    parts = {}
    try:
        for section in SECTIONS:
            current = getattr(base, section)
            changes = given.get(section)
            parts[section] = (
                type(current)(**{**_as_dict(current), **changes}) if changes else current
            )
        return RuntimeConfig(**parts)
    except ThorError as e:
        raise ThorError(f"parameter {e}") from None
    except TypeError as e:  # a value of a type no field takes (a list, say)
        raise ThorError(f"parameter: {e}") from None


def node_settings(values: dict) -> NodeSettings:
    """The node's own parameters, checked."""
    out = {}
    for p in NODE_PARAMS:
        v = values.get(p.name, p.default)
        kind = type(p.default)
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if type(v) is not kind:
            raise ThorError(f"parameter {p.name} must be {kind.__name__}, got {v!r}")
        if p.choices is not None and v not in p.choices:
            raise ThorError(f"parameter {p.name} must be one of {', '.join(p.choices)}, got {v!r}")
        if p.low is not None and v < p.low:
            raise ThorError(f"parameter {p.name} must be >= {p.low:g}, got {v!r}")
        out[p.name] = v
    return NodeSettings(**out)


def _as_dict(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def declare(
    node, base: RuntimeConfig, own: NodeSettings | None = None
) -> tuple[RuntimeConfig, NodeSettings]:
    """Declare every parameter on ``node`` (read-only: read once, at start-up) with ``base``'s
    values as defaults, and read them back, the overrides ROS was given applied."""
    from rcl_interfaces.msg import ParameterDescriptor

    own = own or NodeSettings()
    names = []
    for name, default, text in runtime_params(base):
        # dynamic typing: a YAML 2 for a float field is read, and a wrong type is named by the
        # table's own check rather than by a ROS exception
        node.declare_parameter(
            name,
            default,
            ParameterDescriptor(description=text, read_only=True, dynamic_typing=True),
        )
        names.append(name)
    for p in NODE_PARAMS:
        text = p.help + (f" (one of: {', '.join(p.choices)})" if p.choices else "")
        node.declare_parameter(
            p.name,
            getattr(own, p.name),
            ParameterDescriptor(description=text, read_only=True, dynamic_typing=True),
        )
    config = runtime_config({n: node.get_parameter(n).value for n in names}, base)
    settings = node_settings({p.name: node.get_parameter(p.name).value for p in NODE_PARAMS})
    return config, settings
