"""The plan schema's validator: JSON Schema 2020-12 with an exact decimal ``multipleOf``.

Apart from the schema's construction (specialize.py), so the gate checks a plan against a
schema without importing anything that reads the task.
"""

from __future__ import annotations

from decimal import Decimal

import jsonschema


def _multiple_of(validator, m, instance, schema):
    """jsonschema's float multipleOf says 1.001 is not a multiple of 0.001 (binary rounding);
    the grammar counts decimal digits. Compare as decimals so both agree."""
    if not validator.is_type(instance, "number"):
        return
    q = Decimal(str(instance)) / Decimal(str(m))
    if q != q.to_integral_value():
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {m}")


PlanValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"multipleOf": _multiple_of}
)
