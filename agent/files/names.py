"""How a world's names and aliases are compared: the words of an alias, normalized.

The loader refuses aliases that collide under this comparison; the task's reading uses the
same words when it looks for a thing's alias in a task.
"""
from __future__ import annotations

import re


def alias_words(alias: str) -> list[str]:
    """The words of an alias as a task's reading compares them: lower case, letters and digits,
    no article ("the guitar" is "guitar")."""
    # a hyphen inside a word joins it, as the task's words are read ("top-up can": topup can)
    joined = re.sub(r"(?<=[a-z])-(?=[a-z])", "", alias.lower())
    return [w for w in re.findall(r"[a-z0-9]+", joined) if w not in ("the", "a", "an")]
