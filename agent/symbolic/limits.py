"""One step argument against its declared type and the world: bounds, payload, workspace,
graspable, known names. Shared by the safety gate (every step), the solver (only calls that
pass are searched) and symbolic execution (a goal's required call, checked before any step)."""

from __future__ import annotations

import math

from agent.files.loader import ArgSpec, World
from agent.symbolic.findings import Finding


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt(v: float, unit: str | None) -> str:
    return f"{v:g} {unit}" if unit else f"{v:g}"


def _arg_findings(
    sid: str, name: str, spec: ArgSpec, v, world: World, carried: bool = False
) -> list[Finding]:
    f = lambda check, msg: Finding(sid, check, f"args.{name}: {msg}")  # noqa: E731
    t = spec.type
    if t in ("number", "integer"):
        if not _is_num(v) or (t == "integer" and v != int(v)):
            return [
                f(
                    "bounds",
                    f"expected {'an integer' if t == 'integer' else 'a number'}"
                    f"{' in ' + spec.unit if spec.unit else ''}, got {v!r}",
                )
            ]
        out = []
        if spec.min is not None and v < spec.min:
            out.append(
                f(
                    "bounds",
                    f"{_fmt(v, spec.unit)} is below the minimum {_fmt(spec.min, spec.unit)}",
                )
            )
        if spec.max is not None and v > spec.max:
            out.append(
                f(
                    "bounds",
                    f"{_fmt(v, spec.unit)} is above the maximum {_fmt(spec.max, spec.unit)}",
                )
            )
        if spec.unit == "kg" and v > world.robot.max_payload_kg:
            out.append(
                f(
                    "payload",
                    f"{_fmt(v, 'kg')} exceeds the robot's max payload "
                    f"{_fmt(world.robot.max_payload_kg, 'kg')}",
                )
            )
        return out
    if t == "string":
        if not isinstance(v, str) or not 0 < len(v) <= spec.max_length:
            return [f("bounds", f"expected a string of 1..{spec.max_length} characters, got {v!r}")]
        return []
    if t == "enum":
        return (
            []
            if v in spec.values
            else [f("bounds", f"{v!r} is not one of {', '.join(spec.values)}")]
        )
    if t == "position":
        if not (isinstance(v, list) and len(v) == 3 and all(_is_num(x) for x in v)):
            return [f("bounds", f"expected [x, y, z] in metres, got {v!r}")]
        if not world.robot.inside(v):
            return [
                f(
                    "workspace",
                    f"position {v} is outside the workspace "
                    f"{list(world.robot.workspace_min)}..{list(world.robot.workspace_max)} m",
                )
            ]
        return []
    if t == "place":
        p = world.place(v) if isinstance(v, str) else None
        if p is None:
            return [f("place", f"unknown place {v!r}")]
        if not world.robot.inside(p.position):
            return [f("workspace", f"place {v!r} at {list(p.position)} is outside the workspace")]
        return []
    # object
    o = world.object(v) if isinstance(v, str) else None
    if o is None:
        return [f("object", f"unknown object {v!r}")]
    out = []
    if spec.object_types and o.type not in spec.object_types:
        out.append(
            f(
                "object",
                f"{v!r} is a {o.type}; this skill needs one of {', '.join(spec.object_types)}",
            )
        )
    if not world.robot.inside(o.position):
        out.append(f("workspace", f"object {v!r} at {list(o.position)} is outside the workspace"))
    if (
        spec.payload or carried
    ):  # carried: the skill's effects hold or move it, whatever the flag says
        if o.mass_kg > world.robot.max_payload_kg:
            out.append(
                f(
                    "payload",
                    f"{v!r} weighs {o.mass_kg:g} kg, above the max payload "
                    f"{world.robot.max_payload_kg:g} kg",
                )
            )
        if not o.graspable:
            out.append(f("graspable", f"{v!r} cannot be grasped"))
    return out
