"""Target tap features for distillation, computed once and cached on disk as safetensors.

The frozen target is run over each training sequence (prompt + response) exactly as at
inference (``TargetModel.forward`` with an fp32 ``KVCache``), and the tap-layer outputs are
kept only where a drafter block can look: anchors lie in the response, and a block sees at
most W features before its anchor, so rows before ``prompt_len - W`` are never read and are
not stored. Rows are stored in bf16 (half the disk and RAM; the drafter's fc sees the fp32
value at inference — the difference is below bf16's 3-digit precision and did not matter in
training), in parts of ``PART`` sequences written atomically, so an interrupted run keeps its
finished parts.

Each part records a hash of the sequences it holds, and a part is reused only while that
hash matches. A data set extended by ``gen-data --n`` (a prefix of the larger set, sorted by
index) therefore keeps every full part of the old set; only the last, partial part and the
new sequences are computed. Tap rows cost one target forward per sequence (~1 s each here), from
where the sequence leaves the previous one's prompt in the same part (``_Prefill``; each part
starts afresh, so its rows depend on its own sequences alone — which run, or which worker,
computes it does not change a bit). Under torchrun the workers split the missing parts.

features/meta.json         {"format": "thor-calib-features/2", key fields}
features/part-NNNNN.safetensors   (metadata: format, seqs_sha256)
    taps  bf16 [sum rows_i, n_taps * D]   concatenated in tap_layers order
    first int64 [n]   absolute position of each sequence's first stored row
    offs  int64 [n+1] row offsets into taps
    index int64 [n]   the sequence's prompt_index in the data set
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from thor_runtime.errors import ThorError
from thor_runtime.fileio import write_json_atomic

from .dist import ONE, World

FEAT_FORMAT = "thor-calib-features/2"
PART = 16


class _Prefill:
    """Runs the target over one sequence after another, keeping the last one's K/V: planner
    prompts share their instructions and skills, so each sequence computes only from where it
    leaves the previous one (a hybrid target's recurrent state cannot be cut back: it starts over).
    Reused rows differ from a whole-sequence forward only by float rounding, as at inference,
    where the runtime's prefix cache does the same."""

    def __init__(self, model, capacity: int):
        self.model, self.capacity = model, capacity
        self.reuse = not model.is_hybrid
        self.cache, self.prev = None, []

    def taps(self, seq: dict, taps: tuple[int, ...], window: int) -> tuple[torch.Tensor, int]:
        """-> (rows [T - first, n_taps * D] bf16, first)."""
        ids = seq["ids"]
        first = max(0, seq["prompt_len"] - window)
        keep = 0
        if self.reuse and self.cache is not None:
            while keep < min(len(self.prev), first) and self.prev[keep] == ids[keep]:
                keep += 1
            self.cache.crop(keep)
        else:
            self.cache = self.model.new_cache(
                self.capacity
            )  # a hybrid's holds its recurrent state too
        out = self.model.forward(
            torch.tensor(ids[keep:], dtype=torch.long), self.cache, taps=taps, logits_rows="none"
        )
        self.prev = ids
        raw = torch.cat(
            [out.taps[t][first - keep :] for t in taps], dim=-1
        )  # [T - first, n_taps*D]
        return raw.to(torch.bfloat16).cpu(), first


def seqs_hash(seqs: list[dict]) -> str:
    """What a part's rows depend on: each sequence's index, prompt length and token ids."""
    h = hashlib.sha256()
    for s in seqs:
        h.update(json.dumps([s["index"], s["prompt_len"], s["ids"]]).encode())
    return h.hexdigest()


def _part_hash(f: Path) -> str | None:
    """The seqs_sha256 a part was written for; None if it is missing or unreadable."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(f), "pt") as t:
            return (t.metadata() or {}).get("seqs_sha256")
    except (SafetensorError, OSError, ValueError):
        return None


def build_features(
    model,
    seqs: list[dict],
    taps: tuple[int, ...],
    window: int,
    out_dir: Path,
    key: dict,
    progress: bool = True,
    world: World = ONE,
) -> "Features":
    """Compute missing parts under out_dir (refusing a cache made for other settings). With
    several workers each computes the missing parts it owns; then, where a machine does not
    share out_dir with the others, its first worker computes what its disk still lacks."""
    _compute_parts(model, seqs, taps, window, out_dir, key, progress and world.main, world)
    if world.size > 1:
        world.barrier()
        if world.local_rank == 0:  # finds nothing to do where out_dir is one shared disk
            _compute_parts(model, seqs, taps, window, out_dir, key, False, ONE)
        world.barrier()
    return Features.load(out_dir, seqs)


def _compute_parts(model, seqs, taps, window, out_dir: Path, key: dict, progress, world: World):
    """The missing parts ``world`` says are this process's."""
    from safetensors.torch import save_file
    from tqdm import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"format": FEAT_FORMAT, **key, "taps": list(taps), "window": window, "part": PART}
    mf = out_dir / "meta.json"
    if mf.exists():
        try:
            old = json.loads(mf.read_text())
        except json.JSONDecodeError as e:
            raise ThorError(f"{mf}: not valid JSON ({e})") from None
        if old != meta:
            diff = sorted(k for k in set(old) | set(meta) if old.get(k) != meta.get(k))
            raise ThorError(
                f"{out_dir}: feature cache was made with other settings ({', '.join(diff)}); "
                "delete it or use another --out"
            )
    else:
        write_json_atomic(mf, meta)
    n_parts = (len(seqs) + PART - 1) // PART
    todo = [
        p
        for p in range(n_parts)
        if world.owns(p)
        and _part_hash(out_dir / f"part-{p:05d}.safetensors")
        != seqs_hash(seqs[p * PART : (p + 1) * PART])
    ]
    mine = [p for p in range(n_parts) if world.owns(p)]
    size = sum(len(seqs[p * PART : (p + 1) * PART]) for p in mine)
    bar = tqdm(
        total=size,
        initial=size - sum(len(seqs[p * PART : (p + 1) * PART]) for p in todo),
        desc="target taps" if world.size == 1 else f"target taps ({world})",
        unit="seq",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    cap = max((len(s["ids"]) for s in seqs), default=1)
    with torch.inference_mode():
        for p in todo:
            run = _Prefill(model, cap)
            part = seqs[p * PART : (p + 1) * PART]
            rows, firsts, offs = [], [], [0]
            for s in part:
                r, f = run.taps(s, taps, window)
                rows.append(r)
                firsts.append(f)
                offs.append(offs[-1] + r.shape[0])
                bar.update(1)
            f = out_dir / f"part-{p:05d}.safetensors"
            tmp = str(f) + ".tmp"
            save_file(
                {
                    "taps": torch.cat(rows),
                    "first": torch.tensor(firsts, dtype=torch.int64),
                    "offs": torch.tensor(offs, dtype=torch.int64),
                    "index": torch.tensor([s["index"] for s in part], dtype=torch.int64),
                },
                tmp,
                metadata={"format": FEAT_FORMAT, "seqs_sha256": seqs_hash(part)},
            )
            os.replace(tmp, f)
    bar.close()


class Features:
    """All sequences' stored tap rows in RAM (bf16): ``rows(i, a, b)`` -> [b - a, n_taps*D]."""

    def __init__(self, taps: torch.Tensor, first: list[int], offs: list[int]):
        self.taps, self.first, self.offs = taps, first, offs  # taps [R, n_taps*D] bf16

    @classmethod
    def load(cls, out_dir: Path, seqs: list[dict]) -> "Features":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        chunks, first, offs = [], [], [0]
        n_parts = (len(seqs) + PART - 1) // PART
        for p in range(n_parts):
            f = out_dir / f"part-{p:05d}.safetensors"
            try:
                t = load_file(str(f))
            except (SafetensorError, OSError, ValueError) as e:
                raise ThorError(f"{f}: cannot read feature part (truncated?): {e}") from None
            if _part_hash(f) != seqs_hash(seqs[p * PART : (p + 1) * PART]):
                raise ThorError(f"{f}: feature part does not match the data set; delete {out_dir}")
            base = offs[-1]
            chunks.append(t["taps"])
            first += t["first"].tolist()
            offs += [base + o for o in t["offs"].tolist()[1:]]
        taps = torch.cat(chunks) if chunks else torch.zeros(0, 0, dtype=torch.bfloat16)
        return cls(taps, first, offs)

    def rows(self, i: int, a: int, b: int) -> torch.Tensor:
        """Tap rows of sequence i for absolute positions a..b-1 (a >= first[i])."""
        if a < self.first[i]:
            raise ThorError(f"features: position {a} of sequence {i} was not stored")
        o = self.offs[i] + a - self.first[i]
        return self.taps[o : o + (b - a)]
