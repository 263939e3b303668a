"""Which catalog model runs by default on a CUDA device: the largest pulled one whose measured
warm plan latency there meets the plan-latency goal (``planner.latency_goal_s``).

The rule (docs/cuda.md, "Which model a Thor should run"): candidates are the pulled catalog
models, largest file first; each is timed once per (device, model sha256, the settings that
change a plan's time) by a function the caller gives (thor_app/default_model.py times a warm
reference plan), and the figure is kept in ``plan-latency.json`` in the models directory, so
later runs only read it. The first candidate within the goal is chosen; none within it, none
pulled, or the goal 0 (off): the embedded default model, as on the CPU. Torch-free, and the
measurement is injected, so the rule is tested on a CPU with made-up timings.

A cache file that cannot be read as this format (truncated, edited, another version) is
measured again and replaced, never trusted in part: it holds only figures a few plans
reproduce, and a robot should not stop planning over one. What cannot be written is said, and
the choice of this run stands.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from thor_runtime.catalog import CATALOG, CatalogModel, is_pulled
from thor_runtime.errors import ThorError
from thor_runtime.fileio import write_json_atomic

CACHE_FILE = "plan-latency.json"
CACHE_FORMAT = 1
# The model a run without one named gets, and what any fallback returns to.
DEFAULT_MODEL = "default"
# What a measurement entry must hold, and of which type (anything else: the file is refused).
_ENTRY = {
    "device": str,
    "model": str,
    "sha256": str,
    "settings": dict,
    "latency_s": float,
    "plans": int,
    "measured": str,
}


@dataclass(frozen=True)
class Choice:
    """What runs, and the one line that says why (printed on stderr by the caller)."""

    name: str  # a catalog name, or DEFAULT_MODEL
    line: str
    latencies: dict[str, float] = field(default_factory=dict)  # model -> warm plan s, this device
    measured: tuple[str, ...] = ()  # the models timed in this run (the rest came from the cache)

    @property
    def substituted(self) -> bool:
        return self.name != DEFAULT_MODEL


def pulled_candidates(root: Path, catalog: dict[str, CatalogModel] = CATALOG) -> list:
    """The pulled catalog models, largest file first: at equal quantization a bigger file is
    more parameters, and the planning quality the catalog measured grows with them."""
    return sorted(
        (m for m in catalog.values() if is_pulled(m, root)), key=lambda m: (-m.size, m.name)
    )


class LatencyCache:
    """``plan-latency.json``: a list of measurements, each keyed by device, model sha256 and
    settings. Plain JSON (never pickle), written atomically; ``problem`` says why a file present
    was not used (then it is rewritten at the next measurement)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.problem = ""
        self.entries = self._read()

    def _read(self) -> list[dict]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            self.problem = f"cannot read it ({e.strerror or e})"
            return []
        try:
            doc = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # not UTF-8, or not JSON
            self.problem = f"not valid JSON ({e})"
            return []
        if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
            self.problem = f"not format {CACHE_FORMAT} of this file"
            return []
        entries = doc.get("measurements")
        if not isinstance(entries, list) or not all(_well_formed(e) for e in entries):
            self.problem = "a measurement in it lacks a field or holds a wrong value"
            return []
        return entries

    def get(self, device: str, entry: CatalogModel, settings: dict) -> dict | None:
        for e in self.entries:
            if (e["device"], e["sha256"], e["settings"]) == (device, entry.sha256, settings):
                return e
        return None

    def put(self, device: str, entry: CatalogModel, settings: dict, latency_s: float, plans: int):
        """Add (or replace) one measurement and write the file. Another process may have added
        its own meanwhile: the file is read again just before, so its entries are kept."""
        fresh = LatencyCache(self.path)
        kept = fresh.entries if not fresh.problem else []
        kept = [
            e
            for e in kept
            if (e["device"], e["sha256"], e["settings"]) != (device, entry.sha256, settings)
        ]
        record = {
            "device": device,
            "model": entry.name,
            "sha256": entry.sha256,
            "settings": settings,
            "latency_s": round(float(latency_s), 4),
            "plans": int(plans),
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self.entries = kept + [record]
        doc = {
            "format": CACHE_FORMAT,
            "what": "warm plan latency of the reference plan per device, model and settings "
            "(thor_runtime/model_choice.py); delete this file to measure again",
            "measurements": self.entries,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, doc)
        self.problem = ""


def _well_formed(e) -> bool:
    if not isinstance(e, dict):
        return False
    for key, kind in _ENTRY.items():
        v = e.get(key)
        ok = isinstance(v, (int, float)) if kind is float else isinstance(v, kind)
        if not ok or isinstance(v, bool):
            return False
    return e["latency_s"] > 0


@dataclass(frozen=True)
class Measured:
    """What a timing function returns: the warm plan's seconds and how many plans it timed."""

    latency_s: float
    plans: int = 1


def choose_model(
    device: str,
    settings: dict,
    goal_s: float,
    measure: Callable[[CatalogModel], Measured],
    root: Path,
    catalog: dict[str, CatalogModel] = CATALOG,
    say: Callable[[str], None] = lambda s: None,
) -> Choice:
    """The model to run on ``device`` (a CUDA card's name) when none is named.

    ``settings``: the config values that change a plan's time (part of the cache key, as the
    device and the model's sha256 are). ``measure(entry)`` times one candidate; a ThorError
    there (the model will not load, say) skips it with its reason. ``say``: notes on the way
    (an unusable cache file, a measurement starting); the decision itself is ``Choice.line``.
    """
    settings = json.loads(json.dumps(settings, sort_keys=True))  # as the file will hold them
    if goal_s <= 0:
        return Choice(
            DEFAULT_MODEL,
            "default model: the embedded one (planner.latency_goal_s is 0: no choice)",
        )
    candidates = pulled_candidates(root, catalog)
    goal = f"{goal_s:.2f} s goal (planner.latency_goal_s)"
    if not candidates:
        return Choice(
            DEFAULT_MODEL,
            f"default model: the embedded one; no catalog model is pulled to weigh against "
            f"the {goal} on {device} (thor models list)",
        )
    cache = LatencyCache(Path(root) / CACHE_FILE)
    if cache.problem:
        say(f"{cache.path}: {cache.problem}; measuring again and replacing it")
    latencies: dict[str, float] = {}
    measured: list[str] = []
    skipped: list[str] = []
    for entry in candidates:
        known = cache.get(device, entry, settings)
        if known is not None:
            latency = known["latency_s"]
        else:
            say(f"timing a warm plan of {entry.name} on {device} (once per device and settings)")
            try:
                m = measure(entry)
            except ThorError as e:
                skipped.append(f"{entry.name} not measured: {e}")
                continue
            latency = float(m.latency_s)
            measured.append(entry.name)
            try:
                cache.put(device, entry, settings, latency, m.plans)
            except OSError as e:
                say(f"{cache.path}: not written ({e.strerror or e}); this run's figure stands")
        latencies[entry.name] = latency
        how = "measured now" if entry.name in measured else "measured before"
        if latency <= goal_s:
            larger = [f"{n} {s:.2f} s" for n, s in latencies.items() if n != entry.name]
            larger += skipped
            return Choice(
                entry.name,
                f"default model: {entry.name} on {device}, the largest pulled catalog model whose "
                f"warm plan meets the {goal}: {latency:.2f} s ({how})"
                + (f"; larger ones over it: {', '.join(larger)}" if larger else "")
                + "; --model NAME runs another",
                latencies,
                tuple(measured),
            )
    figures = [f"{n} {s:.2f} s" for n, s in latencies.items()] + skipped
    return Choice(
        DEFAULT_MODEL,
        f"default model: the embedded one; no pulled catalog model plans within the {goal} on "
        f"{device} "
        f"({'; '.join(figures)})",
        latencies,
        tuple(measured),
    )
