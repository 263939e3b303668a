"""The calibration data set on disk (never pickle).

  manifest.json            {"format": "thor-calib-data/1", split, seed, n, max_tokens, target,
                            constrained, prompt_set_sha256}
  shard-NNNNN.safetensors  tokens int32 [sum T_i] (prompt + response, flat), offsets int64 [N+1],
                           prompt_lens int32 [N], prompt_index int64 [N] (index in the prompt set)

Shards are written atomically (tmp + os.replace), so a reader sees whole shards only, and an
interrupted ``gen-data`` resumes from what is there.

With several workers (torchrun) each rank writes its own shards, ``shard-rRRRR-NNNNN`` (one
process writes ``shard-NNNNN``): no two writers share a name, so the files of every rank (or
every machine) can lie in one directory, and a reader takes the union of whatever is there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from thor_runtime.errors import ThorError

DATA_FORMAT = "thor-calib-data/1"


def read_manifest(out: Path) -> dict | None:
    f = out / "manifest.json"
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ThorError(f"{f}: not valid JSON ({e})") from None


def read_shards(data_dir: str | Path) -> list[dict]:
    """-> [{"ids": list[int] (prompt + response), "prompt_len": int, "index": int}] sorted by
    index."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(data_dir)
    man = read_manifest(d)
    if man is None or man.get("format") != DATA_FORMAT:
        raise ThorError(
            f"{d}: not a calibration data directory (missing manifest.json with format "
            f"{DATA_FORMAT}); make one with `thor calib gen-data`"
        )
    seqs = []
    for f in sorted(d.glob("shard-*.safetensors")):
        try:
            t = load_file(str(f))
        except (SafetensorError, OSError, ValueError) as e:
            raise ThorError(f"{f}: cannot read shard (truncated?): {e}") from None
        need = {"tokens", "offsets", "prompt_lens", "prompt_index"}
        if set(t) != need:
            raise ThorError(f"{f}: expected tensors {sorted(need)}, found {sorted(t)}")
        toks, off = t["tokens"].tolist(), t["offsets"].tolist()
        for j, (pl, ix) in enumerate(zip(t["prompt_lens"].tolist(), t["prompt_index"].tolist())):
            seqs.append({"ids": toks[off[j] : off[j + 1]], "prompt_len": pl, "index": ix})
    return sorted(seqs, key=lambda s: s["index"])


def shard_path(out: Path, rank: int | None) -> Path:
    """The next free shard file of one writer (rank None: the one-process name)."""
    stem = "shard-" if rank is None else f"shard-r{rank:04d}-"
    nums = [f.name[len(stem) : -len(".safetensors")] for f in out.glob(f"{stem}*.safetensors")]
    nums = [int(x) for x in nums if x.isdigit()]  # "shard-" also matches the ranks' files
    return out / f"{stem}{max(nums, default=-1) + 1:05d}.safetensors"


def shard_indices(data_dir: str | Path) -> set[int]:
    """The prompt indices the shards present hold (no manifest needed: a rank that starts
    before rank 0 has written it still sees what is done)."""
    from safetensors import SafetensorError, safe_open

    done = set()
    for f in sorted(Path(data_dir).glob("shard-*.safetensors")):
        try:
            with safe_open(str(f), "pt") as t:
                done.update(t.get_tensor("prompt_index").tolist())
        except (SafetensorError, OSError, ValueError) as e:
            raise ThorError(f"{f}: cannot read shard (truncated?): {e}") from None
    return done


def write_shard(path: Path, seqs: list[dict]) -> None:
    from safetensors.torch import save_file

    flat = [t for s in seqs for t in s["ids"]]
    off = [0]
    for s in seqs:
        off.append(off[-1] + len(s["ids"]))
    tensors = {
        "tokens": torch.tensor(flat, dtype=torch.int32),
        "offsets": torch.tensor(off, dtype=torch.int64),
        "prompt_lens": torch.tensor([s["prompt_len"] for s in seqs], dtype=torch.int32),
        "prompt_index": torch.tensor([s["index"] for s in seqs], dtype=torch.int64),
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": DATA_FORMAT})
    os.replace(tmp, path)
