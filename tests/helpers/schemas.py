"""JSON Schemas the grammar tests decode under: PLAN_LIKE has a plan's shapes (an enum, a pattern,
bounded numbers, arrays of a fixed and of a bounded length)."""

from __future__ import annotations

PLAN_LIKE = {
    "type": "object",
    "properties": {
        "skill": {"enum": ["pick", "place", "wait"]},
        "target": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z_]+$", "maxLength": 8},
                "xyz": {
                    "type": "array",
                    "items": {"type": "number", "minimum": 0, "maximum": 2, "multipleOf": 0.01},
                    "minItems": 3,
                    "maxItems": 3,
                },
            },
            "required": ["name", "xyz"],
            "additionalProperties": False,
        },
        "notes": {
            "type": "array",
            "items": {"type": "string", "maxLength": 6},
            "minItems": 1,
            "maxItems": 2,
        },
    },
    "required": ["skill", "target", "notes"],
    "additionalProperties": False,
}
