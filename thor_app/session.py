"""One plan session: what lives across the plans of a runtime, beside the plans themselves.

Three things outlive a plan, each kept on disk for the next process:

- the prompt start every world and task on a skill library shares (instructions, goal forms,
  skills): attached once per skill set, from disk, or computed once and stored there
  (``attach_prefix``; the storage is thor_runtime/cache/prefix_store.py), so a new process
  prefills only the world and the task;
- the world starts (thor_runtime/cache/prefix_shelf.py): the planner fetches a world's start
  before its first attempt and keeps it after; the session writes them once a plan is out;
- what ``--spec auto`` learned (thor_runtime/speculative/auto_state.py): read once when the
  session opens, written after a plan (the service: at most once a minute).

Opt-in, beside them: the request log (calib/request_log.py; ``planner.log_requests``, off by
default), one record per plan, so every path that plans logs the same way.

``thor plan`` (thor_app/commands/plan.py), the service (thor_app/server/host.py) and
``thor bench --plan`` (thor_app/tools/bench_plan.py, which hands its sessions to
evals/plan_bench.py) each plan through a session built from an assembled runtime
(thor_app/assembly.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from thor_runtime.fileio import default_cache_dir

# PlanSession(shelf=...): the world starts the config says (model.world_starts under the cache)
FROM_CONFIG = object()


def prefix_dir(config) -> Path | None:
    """Beside the prepared weights (model.weight_cache): '' there keeps nothing on disk here
    either."""
    where = config.model.weight_cache
    if where == "":
        return None
    return (default_cache_dir() if where == "auto" else Path(where)) / "prefixes"


def world_shelf(config):
    """The world starts kept on disk (thor_runtime/cache/prefix_shelf.py) under the prefix
    directory, or None: model.world_starts 0, or no cache directory."""
    from thor_runtime.cache import PrefixShelf

    where = prefix_dir(config)
    n = config.model.world_starts
    return PrefixShelf(where / "worlds", n) if where is not None and n > 0 else None


def request_log(config, warn=None):
    """The request log ``config`` asks for (planner.log_requests), or None: off, the default,
    or a directory that cannot be made (said to ``warn``: planning goes on without it)."""
    if config is None:  # a session on a served runtime without a config of its own
        return None
    p = config.planner
    if not p.log_requests:
        return None
    from calib.request_log import RequestLog
    from thor_runtime.errors import ThorError

    try:
        return RequestLog(p.log_requests, p.log_requests_max_mb << 20)
    except ThorError as e:
        if warn is not None:
            warn(f"plan requests are not logged: {e}")
        return None


def shared_prefix_ids(tokenizer, skills) -> list[int]:
    """The token ids every planning prompt on ``skills`` starts with, whatever its world and
    task."""
    from agent.planner.prompt import shared_instructions, shared_start

    text = shared_instructions(skills)
    return shared_start(
        tokenizer,
        lambda w: [
            {"role": "system", "content": f"{text}\nWorld: {w}"},
            {"role": "user", "content": f"Task: {w}"},
        ],
    )


def attach_prefix(runtime, tokenizer, skills, directory: Path | None, log=None) -> dict:
    """Pin the shared prefix of ``skills`` in ``runtime``'s prefix cache: from ``directory`` when
    a matching file is there, else computed and written there. -> what happened (tokens,
    source, s)."""
    import torch

    from thor_runtime.cache import KVScales, prefix_key, prefix_path
    from thor_runtime.cache import load_prefix as load
    from thor_runtime.cache import save_prefix as save

    t0 = time.perf_counter()
    model = runtime.model
    # a runtime without a prefix cache (a scripted one in tests) simply gets none
    if (
        getattr(runtime, "prefixes", None) is None
        or directory is None
        or model.device.type != "cpu"
        or not getattr(model, "source", "")
    ):
        return {"source": "off", "tokens": 0}
    ids = shared_prefix_ids(tokenizer, skills)
    if not runtime.prefixes.min_tokens <= len(ids) < model.cfg.max_position_embeddings - 1:
        # too short to pay, or no room left for a task
        return {"source": "off", "tokens": len(ids)}
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
        except OSError as e:  # a read-only cache dir: this process still has it in memory
            source = f"built (not stored: {e.strerror or e})"
    runtime.prefixes.pin(ids, cache)
    info = {
        "source": source,
        "tokens": len(ids),
        "s": round(time.perf_counter() - t0, 3),
        "path": str(path),
    }
    if log is not None:
        log(f"shared prompt prefix: {len(ids)} tokens, {source} ({info['s']:.2f} s)")
    return info


class PlanSession:
    """What lives across the plans of one assembled runtime (thor_app.assembly.Assembled: its
    config, model, runtime and speculation).

    ``log``: where the session says what it did (the prompt starts attached); ``warn``: where it
    says what it could not store (default: ``log``; None for both: silent). ``shelf``: the world
    starts, by default the config's (``world_shelf``), or a given shelf, or None: none.
    ``save_every_s``: write what auto learned after a plan at most this often (0: after every
    plan); ``keep_learned=False``: never write it (a bench hands it on in memory: ``learned``,
    ``resume``). ``requests``: the request log (``request_log``), None when the config keeps
    none.
    """

    def __init__(
        self,
        assembled,
        log=None,
        warn=None,
        shelf=FROM_CONFIG,
        save_every_s: float = 0.0,
        keep_learned: bool = True,
    ):
        self.config = assembled.config
        self.runtime = assembled.runtime
        self.tokenizer = assembled.loaded.tokenizer
        self.speculation = assembled.speculation
        self.shelf = world_shelf(self.config) if shelf is FROM_CONFIG else shelf
        self.log, self.warn = log, warn or log
        self.save_every_s, self.keep_learned = save_every_s, keep_learned
        self.starts: dict[str, dict] = {}  # the prompt starts attached: text -> what happened
        self._learned_read = False
        self._saved_at = -save_every_s  # when auto's state was last written (a plan writes)
        self._planner = None
        self.requests = request_log(self.config, self._warn)
        if self.requests is not None and self.log is not None:
            self.log(
                f"logging plan requests to {self.requests.dir} "
                f"(at most {self.config.planner.log_requests_max_mb} MiB)"
            )

    # ---- the prompt start of a skill library --------------------------------------------------
    def attach(self, skills) -> dict:
        """The prompt start of ``skills`` pinned in the runtime's prefix cache, from disk or
        built and stored there (``attach_prefix``): once per distinct start, however many skill
        sets share it. -> what happened (tokens, source, s)."""
        from agent.planner.prompt import shared_instructions

        text = shared_instructions(skills)
        if text not in self.starts:
            self.starts[text] = attach_prefix(
                self.runtime, self.tokenizer, skills, prefix_dir(self.config), self.log
            )
        return self.starts[text]

    def attach_skill_sets(self, paths) -> list[dict]:
        """The prompt start of every skill set in ``paths`` (files, or directories of *.json): the
        service's start, so a plan on any configured library starts from disk."""
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
                continue  # not a skill set: the request that names it gets the error
            out.append(self.attach(skills))
        return out

    # ---- what --spec auto learned -------------------------------------------------------------
    def load_learned(self) -> int:
        """What auto learned in the last process on this runtime, read once. -> arms restored
        (0: nothing kept, another key's, or not --spec auto)."""
        from thor_runtime.speculative import load_auto_state

        if self._learned_read:
            return 0
        self._learned_read = True
        return load_auto_state(self.runtime, self.speculation)

    def learned(self) -> dict | None:
        """What auto has learned so far, as its file would hold it; None when not --spec auto."""
        from thor_runtime.speculative import auto_state_of

        auto = self.speculation.auto
        return json.loads(json.dumps(auto_state_of(auto))) if auto is not None else None

    def resume(self, learned: dict | None) -> int:
        """Start from what an earlier session learned (its ``learned()``), as a new process
        starts from the file. -> arms restored."""
        from thor_runtime.speculative import restore_auto_state

        self._learned_read = True
        if learned is None or self.speculation.auto is None:
            return 0
        return restore_auto_state(self.speculation.auto, learned)

    # ---- plans ----------------------------------------------------------------------------------
    def planner(self, runtime=None, on_progress=None, **settings):
        """A Planner on the session's runtime (or ``runtime``, a view of it), speculation and world
        starts, with the config's planner settings where ``settings`` (Planner's keywords) do not
        say otherwise."""
        from agent.planner import Planner

        p = self.config.planner
        kw = dict(
            max_tokens=p.max_tokens,
            attempts=p.attempts,
            thinking=p.think,
            max_steps=p.max_steps or None,
            on_progress=on_progress,
            complete=p.solver,
            goal_choice=p.goal_choice,
            lexicon=p.lexicon,
            shelf=self.shelf,
        )
        kw.update(settings)
        return Planner(
            self.runtime if runtime is None else runtime, self.tokenizer, self.speculation, **kw
        )

    def plan(self, request, world=None, skills=None, schema=None, *, planner=None, on_token=None):
        """Plan ``request`` with ``planner`` (default: the session's own, made on first use): a
        prepared request, one specialized before the model loaded (compiled here), or a task
        with its world and skills. The caller calls ``after_plan`` once the plan is out."""
        from agent.planner import SpecializedRequest

        if planner is None:
            if self._planner is None:
                self._planner = self.planner()
            planner = self._planner
        if isinstance(request, SpecializedRequest):
            request = planner.compile(request)
        res = planner.plan(request, world, skills, schema, on_token=on_token)
        if self.requests is not None:
            self._log_request(request, world, skills, res)
        return res

    def _log_request(self, request, world, skills, res) -> None:
        """One record in the request log: what was asked and the model's answer to it (the first
        attempt's text, before any repair or solver). A failure is said, never raised."""
        task = getattr(request, "task", request)
        world, skills = getattr(request, "world", world), getattr(request, "skills", skills)
        answer = res.history[0]["model_text"] if res.history else res.text
        try:
            kept = self.requests.append(
                world,
                skills,
                task,
                answer,
                model=self.config.model.name,
                valid=res.valid,
                attempts=res.attempts,
            )
        except OSError as e:
            self._warn(f"plan request not logged: {e.strerror or e}")
            return
        if not kept:
            self._warn("plan request not logged: larger than the whole request log")

    def after_plan(self) -> None:
        """What a plan left, for the next process, once the plan is out: the world starts written,
        and what auto learned (at most once every ``save_every_s``). What cannot be stored is
        said to ``warn``, never raised: the plan is out either way."""
        if self.shelf is not None:
            for problem in self.shelf.flush():
                self._warn(f"world start not stored: {problem}")
        if not self.keep_learned:
            return
        now = time.monotonic()
        if now - self._saved_at >= self.save_every_s:  # a synced write, not on every request
            self._saved_at = now
            from thor_runtime.speculative import save_auto_state

            try:
                save_auto_state(self.runtime, self.speculation)
            except OSError as e:
                self._warn(f"what --spec auto learned was not stored: {e.strerror or e}")

    def _warn(self, msg: str) -> None:
        if self.warn is not None:
            self.warn(msg)
