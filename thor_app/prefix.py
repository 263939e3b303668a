"""The planner's persistent prefix: the K/V of the prompt start every world and task on a skill
library shares, loaded from disk at start (or computed once and stored), so a new process and
a new world prefill only the world and the task. `thor plan` and the service call this after
building their runtime; the storage itself is thor_runtime/cache/prefix_store.py.
"""
from __future__ import annotations

import time
from pathlib import Path

from thor_runtime.fileio import default_cache_dir


def prefix_dir(config) -> Path | None:
    """Beside the prepared weights (model.weight_cache): '' there keeps nothing on disk here either."""
    where = config.model.weight_cache
    if where == "":
        return None
    return (default_cache_dir() if where == "auto" else Path(where)) / "prefixes"


def world_shelf(config):
    """The world starts kept on disk (thor_runtime/cache/prefix_shelf.py) under the prefix directory,
    or None: model.world_starts 0, or no cache directory."""
    from thor_runtime.cache import PrefixShelf

    where = prefix_dir(config)
    n = config.model.world_starts
    return PrefixShelf(where / "worlds", n) if where is not None and n > 0 else None


def shared_prefix_ids(tokenizer, skills) -> list[int]:
    """The token ids every planning prompt on ``skills`` starts with, whatever its world and task."""
    from agent.planner.prompt import shared_instructions, shared_start

    text = shared_instructions(skills)
    return shared_start(tokenizer, lambda w: [{"role": "system", "content": f"{text}\nWorld: {w}"},
                                              {"role": "user", "content": f"Task: {w}"}])


def attach_prefix(runtime, tokenizer, skills, directory: Path | None, log=None) -> dict:
    """Pin the shared prefix of ``skills`` in ``runtime``'s prefix cache: from ``directory`` when a
    matching file is there, else computed and written there. -> what happened (tokens, source, s)."""
    import torch

    from thor_runtime.cache import KVScales
    from thor_runtime.cache import load_prefix as load, prefix_key, prefix_path, save_prefix as save

    t0 = time.perf_counter()
    model = runtime.model
    # a runtime without a prefix cache (a scripted one in tests) simply gets none
    if (getattr(runtime, "prefixes", None) is None or directory is None or model.device.type != "cpu"
            or not getattr(model, "source", "")):
        return {"source": "off", "tokens": 0}
    ids = shared_prefix_ids(tokenizer, skills)
    if not runtime.prefixes.min_tokens <= len(ids) < model.cfg.max_position_embeddings - 1:
        return {"source": "off", "tokens": len(ids)}   # too short to pay, or no room left for a task
    scales = runtime.kv_scales or KVScales.unit(model.cfg)
    key = prefix_key(model, runtime.kv_dtype, scales, ids, runtime.prefill_chunk)
    path = prefix_path(directory, key)
    cache = load(path, key, ids, model.cfg, runtime.kv_dtype, model.dtype, scales)
    source = "disk"
    if cache is None:
        # the same call a prompt's first prefill chunk makes, so a restore equals a chunked prefill
        cache = runtime.new_cache(len(ids))
        with torch.inference_mode():
            model.prefill(torch.tensor(ids, dtype=torch.long), cache, runtime.prefill_chunk)
        source = "built"
        try:
            save(path, cache, ids, key)
        except OSError as e:             # a read-only cache dir: this process still has it in memory
            source = f"built (not stored: {e.strerror or e})"
    runtime.prefixes.pin(ids, cache)
    info = {"source": source, "tokens": len(ids), "s": round(time.perf_counter() - t0, 3), "path": str(path)}
    if log is not None:
        log(f"shared prompt prefix: {len(ids)} tokens, {source} ({info['s']:.2f} s)")
    return info


def attach_skill_sets(assembled, paths, log=None) -> list[dict]:
    """The prefix of every skill set in ``paths`` (files, or directories of *.json) — the service's
    warm-up, so a plan on any configured library starts from disk."""
    from agent.files.loader import load_skills
    from thor_runtime.errors import ThorError

    files = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.json")) if p.is_dir() else [p]
    out = []
    for f in files:
        try:
            skills = load_skills(f)
        except ThorError:
            continue                     # not a skill set: the request that names it gets the error
        out.append(attach_prefix(assembled.runtime, assembled.loaded.tokenizer, skills,
                                 prefix_dir(assembled.config), log))
    return out
