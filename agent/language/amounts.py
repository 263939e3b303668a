"""Amounts a task says in words or digits: times ("20 seconds", "half a minute"), angles ("180°",
"a quarter turn"), lengths ("5 cm", "a couple of centimetres") and counts ("twice", "three camera
scans")."""
from __future__ import annotations

import re

# Durations: "20 seconds", "ten second pause", "a minute", "half a minute", "forty-five seconds"
_UNITS = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "min": 60, "mins": 60, "minute": 60,
          "minutes": 60}
_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen " \
        "sixteen seventeen eighteen nineteen".split()
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
         "ninety": 90}
NUMBER_WORDS = {**{w: i for i, w in enumerate(_ONES)}, **_TENS,
                **{t + o: v + i for t, v in _TENS.items() for i, o in enumerate(_ONES[:10]) if i}}


def _amount(toks: list[str], j: int) -> tuple[float, int] | None:
    """The number that ends at index ``j`` (inclusive) -> (value, its first index), else None."""
    if j < 0:
        return None
    t = toks[j]
    if re.fullmatch(r"\d+", t):
        return float(t), j
    if t == "hundred":                     # "a hundred", "two hundred"
        k = _amount(toks, j - 1) if j > 0 and toks[j - 1] != "hundred" else None
        return (100.0 * k[0], k[1]) if k is not None and k[0] < 10 else (100.0, j)
    if t in NUMBER_WORDS:
        # "forty five": tens then a unit word
        if j > 0 and toks[j - 1] in _TENS and 0 < NUMBER_WORDS[t] < 10:
            v, j = float(_TENS[toks[j - 1]] + NUMBER_WORDS[t]), j - 1
        else:
            v = float(NUMBER_WORDS[t])
        # "a hundred and eighty", "one hundred twenty"
        k = j - 1 - (j > 1 and toks[j - 1] == "and")
        if k >= 0 and toks[k] == "hundred":
            h = _amount(toks, k)
            return (h[0] + v, h[1]) if h is not None else (v, j)
        return v, j
    if t in ("a", "an"):
        return (0.5, j - 1) if j > 0 and toks[j - 1] == "half" else (1.0, j)
    return None


def durations(toks: list[str]) -> list[tuple[int, float]]:
    """Every length of time the words say, in seconds, as (index, seconds): "wait 20 seconds",
    "a ten second pause", "a minute apart", "half a minute", "45s". Only a number (digits, a
    number word, "a"/"an") right before a unit of time counts: "a sec" when you get one is an
    aside the reading has already cut."""
    out = []
    for i, t in enumerate(toks):
        m = re.fullmatch(r"(\d+|[a-z]+?)(s|secs?|seconds?|mins?|minutes?)", t)
        if t in _UNITS and t != "s" or t == "s" and i and toks[i - 1].isdigit():
            n = _amount(toks, i - 1)
            if n is not None:
                out.append((n[1], n[0] * _UNITS[t]))
        elif m and (m.group(1).isdigit() or m.group(1) in NUMBER_WORDS):
            # "45s", "tensecond" (a hyphen inside a word joins it: "ten-second")
            n = float(m.group(1)) if m.group(1).isdigit() else float(NUMBER_WORDS[m.group(1)])
            out.append((i, n * _UNITS[m.group(2)]))
    return out


def angles(toks: list[str]) -> list[tuple[int, float]]:
    """Every angle the words say, in degrees, as (index, degrees): "180 degrees", "thirty degrees",
    "90°", "a quarter turn" (90), "a half turn" (180)."""
    out = []
    for i, t in enumerate(toks):
        if t in ("degrees", "degree", "deg"):
            n = _amount(toks, i - 1)
            if n is not None:
                out.append((n[1], n[0]))
        elif t == "turn" and i > 1 and toks[i - 2] in ("a", "one") and toks[i - 1] in ("quarter", "half"):
            out.append((i - 2, 90.0 if toks[i - 1] == "quarter" else 180.0))
    return out


# Lengths: "5 cm", "a couple of centimetres", "30 mm" -> metres
_LENGTHS = {"cm": 0.01, "centimetre": 0.01, "centimetres": 0.01, "centimeter": 0.01, "centimeters": 0.01,
            "mm": 0.001, "millimetre": 0.001, "millimetres": 0.001, "millimeter": 0.001, "millimeters": 0.001,
            "metre": 1.0, "metres": 1.0, "meter": 1.0, "meters": 1.0}


def lengths(toks: list[str]) -> list[float]:
    """Every length the words say, in metres: "5 cm", "3 cm forward", "a couple of centimetres"."""
    out = []
    for i, t in enumerate(toks):
        m = re.fullmatch(r"(\d+)(cm|mm)", t)
        if m:                                         # "5cm"
            out.append(round(float(m.group(1)) * _LENGTHS[m.group(2)], 6))
            continue
        if t not in _LENGTHS and not (t == "m" and i and toks[i - 1].isdigit()):
            continue
        unit = _LENGTHS.get(t, 1.0)
        if toks[max(0, i - 3):i] == ["a", "couple", "of"]:
            out.append(round(2 * unit, 6))
            continue
        n = _amount(toks, i - 1)
        if n is not None:
            out.append(round(n[0] * unit, 6))
    return out


# "three camera scans", "two more looks", "3 turns in total": a count said as a plural noun
_LOOKS_SAID = frozenset({"scans", "looks", "checks", "sweeps", "passes", "inspections", "goes", "turns", "rotations"})


def times_said(toks: list[str]) -> int:
    """How many times the words ask for a thing: "twice" 2, "three times" 3, "three camera scans"
    3; 1 when they do not say."""
    for i, t in enumerate(toks):
        if t == "twice":
            return 2
        if t == "thrice":
            return 3
        for j in ([i - 1] if t == "times" else [i - 1, i - 2] if t in _LOOKS_SAID else []):
            n = _amount(toks, j) if j >= 0 else None
            if n is not None and n[0] >= 2 and float(n[0]).is_integer():
                return int(n[0])
    return 1
