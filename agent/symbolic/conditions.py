"""The symbolic vocabulary shared by skills (preconditions, effects), plans (goal) and the executor.

A condition is a small JSON object; its key set says which kind it is:

    {"hand": "empty"} / {"hand": "full"}   the robot's one carrying slot (gripper or deck)
    {"holding": X}                          the robot holds / carries object X
    {"object": X, "at": P}                  object X rests at place P
    {"object": X, "is": S}                  X is open / closed / inspected (X may be a place:
                                            inspected)
    {"robot_at": P}                         the robot (base) is at place P
    {"object": X, "on": Y}                  object X rests on object Y (a block on a block)
    {"clear": X}                            skills only: nothing rests on X and it is not held
    {"missing": NAME}                       goal only: the task needs NAME, which the world lacks

In a skills file a name may be ``$arg``, the value of that argument of the step. The kinds are a
registry (dict) so a new one is one entry here plus its rule in symbolic.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from thor_runtime.errors import ThorError

HAND_WORDS = ("empty", "full")
# state -> its opposite (None: nothing is undone by it)
IS_STATES = {"open": "closed", "closed": "open", "inspected": None}
# kind -> (key set, which key holds the subject, which holds the value, subject kind, value kind)
KINDS = {
    "hand": (frozenset({"hand"}), None, "hand", None, "hand"),
    "holding": (frozenset({"holding"}), "holding", None, "object", None),
    "at": (frozenset({"object", "at"}), "object", "at", "object", "place"),
    "is": (frozenset({"object", "is"}), "object", "is", "object", "state"),
    "place_is": (frozenset({"place", "is"}), "place", "is", "place", "state"),
    "robot_at": (frozenset({"robot_at"}), None, "robot_at", None, "place"),
    "missing": (frozenset({"missing"}), "missing", None, "name", None),
    # objects as places: what an object rests on is another object ("the red block on the blue")
    "on": (frozenset({"object", "on"}), "object", "on", "object", "object"),
    # derived from where everything rests, never set by an effect: only a precondition asks it
    "clear": (frozenset({"clear"}), "clear", None, "object", None),
}
EFFECT_KINDS = ("hand", "holding", "at", "is", "place_is", "robot_at", "on")
SKILL_PRE_KINDS = ("hand", "holding", "at", "is", "place_is", "robot_at", "on", "clear")
# `on` last: a parse error lists the forms in this order, and the older forms come first
GOAL_KINDS = ("holding", "at", "is", "place_is", "robot_at", "hand", "missing", "on")
# the value kinds that name a thing of the world (a place, or an object standing as one)
NAME_VALUES = ("place", "object")


@dataclass(frozen=True)
class Cond:
    kind: str
    subject: str | None = None  # object / place name (or "$arg" in a skill)
    value: str | None = None  # place, state word or hand word

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ThorError(f"unknown condition kind {self.kind!r}")
        if self.kind in ("hand",) and self.value not in HAND_WORDS:
            raise ThorError(f"hand must be one of {', '.join(HAND_WORDS)}, got {self.value!r}")
        if self.kind in ("is", "place_is") and self.value not in IS_STATES:
            raise ThorError(f"`is` must be one of {', '.join(IS_STATES)}, got {self.value!r}")
        if self.kind == "place_is" and self.value != "inspected":
            raise ThorError("a place can only be `inspected`")

    def to_dict(self) -> dict:
        keys, skey, vkey, _, _ = KINDS[self.kind]
        out = {}
        for k in sorted(keys, key=lambda k: (k != skey, k)):
            out[k] = self.subject if k == skey else self.value
        return out

    def text(self) -> str:
        """Short words for prompts, notes and findings: "apple at table", "hand empty"."""
        s, v = self.subject, self.value
        return {
            "hand": f"hand {v}",
            "holding": f"holding {s}",
            "at": f"{s} at {v}",
            "is": f"{s} {v}",
            "place_is": f"{s} {v}",
            "robot_at": f"robot at {v}",
            "missing": f"{s} is not in this world",
            "on": f"{s} on {v}",
            "clear": f"{s} clear",
        }[self.kind]

    def ground(self, args: dict) -> "Cond":
        """Replace ``$arg`` names with the step's argument values (non-strings stay unresolved)."""

        def sub(x):
            if isinstance(x, str) and x.startswith("$"):
                v = args.get(x[1:])
                return v if isinstance(v, str) else None
            return x

        return Cond(
            self.kind,
            sub(self.subject),
            sub(self.value) if KINDS[self.kind][4] in NAME_VALUES else self.value,
        )

    def refs(self) -> list[tuple[str, str]]:
        """[(name, "object"|"place"|"name")] this condition mentions (skills: "$arg" names)."""
        _, _, _, skind, vkind = KINDS[self.kind]
        out = []
        if skind is not None and self.subject is not None:
            out.append((self.subject, skind))
        if vkind in NAME_VALUES and self.value is not None:
            out.append((self.value, vkind))
        return out


def parse_cond(d, allowed: tuple[str, ...], where: str) -> Cond:
    if not isinstance(d, dict):
        raise ThorError(f"{where}: a condition must be a JSON object, got {d!r}")
    keys = frozenset(d)
    kind = next((k for k, spec in KINDS.items() if spec[0] == keys), None)
    if kind is None or kind not in allowed:
        forms = ", ".join("{" + ", ".join(sorted(KINDS[k][0])) + "}" for k in allowed)
        raise ThorError(f"{where}: {d} is not a condition here (one of {forms})")
    _, skey, vkey, _, _ = KINDS[kind]
    for k in keys:
        if not isinstance(d[k], str) or not d[k]:
            raise ThorError(f"{where}: {k!r} must be a non-empty string")
    try:
        return Cond(kind, d[skey] if skey else None, d[vkey] if vkey else None)
    except ThorError as e:
        raise ThorError(f"{where}: {e}") from None


def parse_conds(items, allowed: tuple[str, ...], where: str) -> tuple[Cond, ...]:
    if not isinstance(items, list):
        raise ThorError(f"{where}: expected a list of conditions")
    return tuple(parse_cond(d, allowed, f"{where}[{i}]") for i, d in enumerate(items))
