"""What ``--spec auto`` has learned (auto.py), kept on disk from one process to the next.

Why. auto learns as it runs: each proposer's acceptance per draft position, how often it has a
draft, its drafting and upkeep time, what a cycle spends besides, the grammar's forced tokens.
A service learns that over its first requests; a `thor plan` process plans once, so every plan
started from the priors and chose its blocks on them (planner model, Zen 5: ~8 tokens a cycle
and 418 tok/s, against ~9.5 and 515 in a process that had seen a few plans). A process now
starts from what the last one left and leaves what it learned.

The file sits beside the verify cost curves (cost.py), keyed by the curve's key (machine, model,
how it runs) and the candidates (class, proposer, K, the drafter's config): a file of another
key, a damaged one or an entry that fits no candidate is ignored, and a write is atomic. What
auto learns only moves speed, never output.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

from thor_runtime.fileio import write_json_atomic
from thor_runtime.speculative.cost import cost_dir, curve_key

FORMAT = 1
_NUMS = ("draft", "keep", "since_best")
_CLASS_NUMS = ("forced", "by_id", "rest")


def _drafter_id(proposer) -> str:
    """The drafter's config as a digest ('' for a proposer without one)."""
    d = getattr(getattr(proposer, "dflash", proposer), "drafter", None)
    cfg = getattr(d, "cfg", None)
    if cfg is None or not dataclasses.is_dataclass(cfg):
        return ""
    return hashlib.sha256(
        json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str).encode()
    ).hexdigest()[:16]


def state_key(rt, policy) -> dict:
    arms = [
        [c.name, a.name, a.kmax, _drafter_id(a.proposer)]
        for c in policy.classes.values()
        for a in c.arms
    ]
    return {"format": FORMAT, "curve": curve_key(rt, policy.rows), "arms": arms}


def state_path(rt, policy) -> Path | None:
    root = cost_dir(getattr(rt, "cost_cache", None))
    if root is None:
        return None
    digest = hashlib.sha256(json.dumps(state_key(rt, policy), sort_keys=True).encode()).hexdigest()[
        :24
    ]
    return root / f"auto-{digest}.json"


def state(policy) -> dict:
    """The policy's learned numbers, as JSON types."""
    classes = {}
    for c in policy.classes.values():
        arms = {
            a.name: {
                "tracks": [[t.sums, t.counts, t.offer] for t in a.tracks],
                **{k: getattr(a, k) for k in _NUMS},
            }
            for a in c.arms
        }
        classes[c.name] = {"arms": arms, **{k: getattr(c, k) for k in _CLASS_NUMS}}
    return {"step_s": policy.step_s, "classes": classes}


def restore(policy, doc: dict) -> int:
    """Put ``doc`` (``state``'s) into ``policy`` where it fits its candidates: -> arms restored."""

    def num(x) -> bool:
        return (
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
        )

    done = 0
    if not isinstance(doc, dict) or not isinstance(doc.get("classes"), dict):
        return 0
    if num(doc.get("step_s")):
        policy.step_s = float(doc["step_s"])
    for c in policy.classes.values():
        got = doc["classes"].get(c.name)
        if not isinstance(got, dict):
            continue
        for k in _CLASS_NUMS:
            if num(got.get(k)):
                setattr(c, k, float(got[k]))
        for a in c.arms:
            saved = (
                (got.get("arms") or {}).get(a.name) if isinstance(got.get("arms"), dict) else None
            )
            tracks = saved.get("tracks") if isinstance(saved, dict) else None
            if not (
                isinstance(tracks, list)
                and len(tracks) == len(a.tracks)
                and all(
                    isinstance(t, list)
                    and len(t) == 3
                    and len(t[0]) == len(t[1]) == a.kmax
                    and all(num(x) for x in [*t[0], *t[1], t[2]])
                    for t in tracks
                )
            ):
                continue
            for t, (sums, counts, offer) in zip(a.tracks, tracks):
                t.sums, t.counts, t.offer = (
                    [float(x) for x in sums],
                    [float(x) for x in counts],
                    float(offer),
                )
            for k in _NUMS:
                if num(saved.get(k)):
                    setattr(a, k, type(getattr(a, k))(saved[k]))
            done += 1
    return done


def load(rt, speculation) -> int:
    """The state the last process left for this runtime and auto's candidates: -> arms restored
    (0: none kept, another key's, damaged, or not ``--spec auto``)."""
    policy = getattr(speculation, "auto", None)
    path = state_path(rt, policy) if policy is not None else None
    if path is None:
        return 0
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    if not isinstance(doc, dict) or doc.get("key") != state_key(rt, policy):
        return 0
    return restore(policy, doc.get("state"))


def save(rt, speculation) -> Path | None:
    """What auto has learned in this process, for the next (atomically); None when not kept."""
    policy = getattr(speculation, "auto", None)
    path = state_path(rt, policy) if policy is not None else None
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"key": state_key(rt, policy), "state": state(policy)})
    return path
