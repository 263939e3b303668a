"""What a verify of R rows costs on this machine, relative to a 1-row step: the curve ``--spec
auto`` weighs drafts against (auto.py).

On a CPU the curve is steep (2-3 rows cost about one step, 16 rows about two), on a GPU nearly
flat (every decode forward runs the same padded row count), so the number of drafts worth
verifying differs by an order of magnitude between the two. The curve is measured through the
runtime's own verify (the decode owner in runner.py: the same kernels, cache kind and padding a
request's verifies run) on a scratch cache of ``CONTEXT`` tokens, R = 1 .. rows, in rounds
after one warm-up round (``REPEATS`` at least, more while they are quick, fewer past
``MAX_S``), the fastest per R: a busy neighbour only ever adds time, so the minimum is the
verify's own cost and the medians of a loaded machine are not. It is
kept as JSON in ``costs/`` under the weight cache's directory (``--cache-dir``, else
$THOR_CACHE_DIR, else $XDG_CACHE_HOME/thor-runtime/weights), one file per machine and model
(``curve_key``), and measured again when the file is missing, damaged or was written for
another key. Measuring touches no request's cache and decides no
token, so it never changes output.

A plan's verify under its grammar often computes only the logits of the ids its rows may commit
(``cols``, thor_runtime/engine/constraint.py), which skips most of the head: such a verify costs
less, and more so per extra row. So a second curve, ``by_id``, times the same verifies reading
``READ_IDS`` logits, in the same unit (a full 1-row step); auto weighs the two by the share of
its constrained verifies that read by id (auto.py).

``THOR_SPEC_COSTS=default`` skips measuring: a linear curve (``DEFAULT_SLOPE`` per extra row);
``THOR_SPEC_COSTS=measure`` measures again and replaces the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from thor_runtime.device import cpu_name
from thor_runtime.fileio import default_cache_dir, write_json_atomic

ENV = "THOR_SPEC_COSTS"  # "default": no measuring, the linear curve; "measure": measure again
FORMAT = 4
CONTEXT = 256  # cached tokens the verifies attend over (a short chat; plans run ~800)
REPEATS = 3  # timed rounds per row count, after one warm-up round, at least;
MAX_ROUNDS, MIN_S = 15, 0.25  # more (up to 15) while they took under 0.25 s: tiny models are noisy
MAX_S = 3.0  # no round starts after this many seconds (one timed round at least)
# Extra row's cost in 1-row steps when nothing is measured: 16 rows ~2.1x a step on a 2-core
# x86 CPU with the default model (docs/speculative-decoding.md, "Draft budget").
DEFAULT_SLOPE = 0.075
READ_IDS = 64  # logits a by-id verify reads: 78% of a plan's rows allow at most 64


@dataclass(frozen=True)
class CostCurve:
    costs: tuple[float, ...]  # costs[R - 1]: a verify of R rows in 1-row steps (costs[0] == 1)
    step_s: float = 0.0  # seconds of a 1-row step when measured (0: unknown)
    source: str = "default"  # measured | cached | default
    # by_id[R - 1]: the same verify computing only READ_IDS logits, in full 1-row steps (None:
    # not measured; a kernel that cannot read by id gives the full curve's costs)
    by_id: tuple[float, ...] | None = None

    def __call__(self, rows: float) -> float:
        """Cost of ``rows`` rows, linear between measured row counts (a mean of forced tokens
        is fractional); past the measured ones, the last measured slope goes on."""
        n, rows = len(self.costs), max(float(rows), 1.0)
        if rows >= n:
            slope = self.costs[-1] - self.costs[-2] if n > 1 else DEFAULT_SLOPE
            return self.costs[-1] + (rows - n) * max(slope, 0.0)
        i = int(rows)
        return self.costs[i - 1] + (rows - i) * (self.costs[i] - self.costs[i - 1])

    @property
    def rows(self) -> int:
        return len(self.costs)

    def mixed(self, share: float) -> "CostCurve":
        """The curve of verifies of which ``share`` read by id (the rest every logit)."""
        if self.by_id is None or share <= 0:
            return self
        costs = tuple(share * b + (1 - share) * c for b, c in zip(self.by_id, self.costs))
        return CostCurve(costs, self.step_s, self.source)


def linear_curve(rows: int, slope: float = DEFAULT_SLOPE, source: str = "default") -> CostCurve:
    return CostCurve(tuple(1.0 + slope * r for r in range(max(rows, 1))), 0.0, source)


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence (least squares: pool adjacent violators). A verify
    of more rows does not cost less; a dip is noise, and so is a lone spike, which a running
    maximum would carry to every longer verify."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def normalise(
    seconds: list[float], source: str = "measured", by_id: list[float] | None = None
) -> CostCurve:
    """Seconds per row count -> a non-decreasing curve in 1-row steps, costs[0] == 1 (and the
    by-id seconds in the same unit, never above the full curve)."""
    fit = monotone(seconds)
    base = fit[0]
    costs = tuple(round(s / base, 4) for s in fit)
    ids = None
    if by_id is not None:
        ids = tuple(min(round(s / base, 4), c) for s, c in zip(monotone(by_id), costs))
    return CostCurve(costs, base, source, ids)


def machine_key(device) -> dict:
    d = torch.device(device)
    if d.type == "cuda":
        where = {"gpu": torch.cuda.get_device_name(d)}
    else:
        where = {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    return {**where, "torch": torch.__version__, "threads": torch.get_num_threads()}


def curve_key(rt, rows: int) -> dict:
    """Everything the curve depends on: the machine, the model and how the runtime runs it."""
    m = rt.model
    backend = getattr(m, "backend", None)
    return {
        "format": FORMAT,
        **machine_key(m.device),
        "model": m.cfg.name,
        "hidden_size": m.cfg.hidden_size,
        "layers": m.cfg.num_layers,
        "quant": getattr(m, "quant", None) or "",
        "layout": str(getattr(m, "layout", "")),
        "device": str(m.device),
        "dtype": str(m.dtype).removeprefix("torch."),
        "kv_dtype": rt.kv_dtype,
        "decode": rt.decode.name,
        "kernel": str(getattr(m, "decode_kernel", "torch")),
        "kernel_build": str(getattr(m, "kernel_build", "")),
        "backend": getattr(backend, "name", type(backend).__name__)
        if backend is not None
        else "torch",
        "rows": rows,
        "context": CONTEXT,
        "repeats": REPEATS,
    }


def cost_dir(cache: str | None) -> Path | None:
    """The curves' directory: under the weight cache's (``--cache-dir``); None = ``''`` (none
    kept)."""
    if cache == "":
        return None
    return (Path(cache) if cache else default_cache_dir()) / "costs"


def _file(root: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return root / f"verify-{digest}.json"


def read_cached(path: Path, key: dict) -> CostCurve | None:
    """The curve a file holds for ``key``; None when it is missing, damaged or another key's."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("key") != key:
            return None
        costs = tuple(float(c) for c in doc["costs"])
        by_id = tuple(float(c) for c in doc["by_id"])
        if (
            len(costs) != key["rows"]
            or costs[0] != 1.0
            or any(b < a for a, b in zip(costs, costs[1:]))
        ):
            return None
        if len(by_id) != len(costs) or any(not 0 < b <= c for b, c in zip(by_id, costs)):
            return None
        return CostCurve(costs, float(doc.get("step_s", 0.0)), "cached", by_id)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def measure(rt, rows: int) -> CostCurve:
    """Time ``rt.verify`` for 1..rows rows at ``CONTEXT`` cached tokens (see the module doc)."""
    m = rt.model
    calls = verify_calls(range(rows))
    ctx = max(1, min(CONTEXT, m.cfg.max_position_embeddings - calls - rows - 1))
    cache = rt.decode.cache(rt.new_cache, ctx + calls, rows - 1)
    try:
        full, by_id = timed_verifies(rt, cache, ctx, range(1, rows + 1))
        return normalise(full, by_id=by_id)
    finally:
        rt.decode.release(cache)


def verify_calls(widths) -> int:
    """Verifies ``timed_verifies`` may run over ``widths``: each leaves its anchor row in the
    cache, as a cycle does, so the cache needs this many rows beyond the context and the widest."""
    return (MAX_ROUNDS + 1) * len(widths) * 2


def timed_verifies(rt, cache, ctx: int, widths) -> tuple[list[float], list[float]]:
    """The fastest of each verify's timings, one per row count in ``widths``, on ``cache``
    (empty) at ``ctx`` tokens: every logit, and ``READ_IDS`` of them (spread over the
    vocabulary)."""
    m = rt.model
    widths = list(widths)
    vocab = m.cfg.vocab_size
    ids = (
        torch.arange(ctx + max(widths), dtype=torch.long) * 7919 + 13
    ) % vocab  # [ctx + rows], any tokens
    few = np.unique(
        np.linspace(0, vocab - 1, min(READ_IDS, vocab)).astype(np.int64)
    )  # [n] ascending
    with torch.inference_mode():
        m.prefill(ids[:ctx], cache, rt.prefill_chunk)
        seconds = {c: [[] for _ in widths] for c in (False, True)}
        pos, spent, start = ctx, 0.0, time.perf_counter()
        for rnd in range(MAX_ROUNDS + 1):  # round 0 warms each shape up
            if (rnd > REPEATS and spent >= MIN_S) or (
                rnd > 1 and time.perf_counter() - start > MAX_S
            ):
                break
            # every other round backwards, so a drift in the machine's speed does not tilt the curve
            order = range(len(widths)) if rnd % 2 else range(len(widths) - 1, -1, -1)
            for j in order:
                for by_id in (False, True):
                    t0 = time.perf_counter()
                    out = rt.verify(
                        ids[ctx : ctx + widths[j]], cache, cols=few if by_id else None
                    )  # logits [r, V]
                    if out.logits.is_cuda:
                        torch.cuda.synchronize(out.logits.device)
                    dt = time.perf_counter() - t0
                    pos += 1
                    cache.crop(pos)  # the anchor stays, the drafts go
                    if rnd:
                        seconds[by_id][j].append(dt)
                        spent += dt
    return [min(s) for s in seconds[False]], [min(s) for s in seconds[True]]


def verify_costs(rt, rows: int, cache: str | None = None) -> CostCurve:
    """The runtime's curve for 1..rows rows: ``THOR_SPEC_COSTS=default``'s line, else the cached
    file for this machine and model, else measured now and kept."""
    mode = os.environ.get(ENV, "").strip().lower()
    if mode == "default":
        return linear_curve(rows)
    rows = min(rows, rt.pad_rows) if rt.pad_rows else rows  # a padded verify takes at most its rows
    key = curve_key(rt, rows)
    root = cost_dir(cache)
    path = _file(root, key) if root is not None else None
    if path is not None and mode != "measure":
        hit = read_cached(path, key)
        if hit is not None:
            return hit
    curve = measure(rt, rows)
    if path is not None:
        try:
            root.mkdir(parents=True, exist_ok=True)
            write_json_atomic(
                path,
                {
                    "key": key,
                    "costs": list(curve.costs),
                    "by_id": list(curve.by_id),
                    "step_s": curve.step_s,
                },
            )
        except OSError:
            pass  # an unwritable cache only means measuring again next time
    return curve
