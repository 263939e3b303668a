"""The model the server hosts: loaded once, warmed up, self-tested; and the jobs run on it.

Start-up goes loading -> warming_up -> self_test -> ready, or to failed with the reason. It is
never ready without a passing self-test: the self-test is a callable (injectable for tests; by
default the on-device parity check ``engines.selftest.run_selftest`` in its quick form).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from thor_app.server.config import ServeConfig
from thor_app.server.jobs import JobContext
from thor_app.server.openai_api import ChatRequest, TextStreamer, check_max_tokens
from thor_runtime.errors import ThorError

log = logging.getLogger("thor.serve")
STARTUP = ("starting", "loading", "warming_up", "self_test")
# The service's prefill chunk when the config says one pass (0): cancellation, the deadline and
# the watchdog's progress mark are checked between chunks. 256 is the prefill size TensorRT
# engines are built for when the chunk is 0, so the engine cache key does not change.
SERVICE_PREFILL_CHUNK = 256
# at most one write a minute of what --spec auto learned (speculative/auto_state.py): a request
# does not wait for a synced file each time, and a restart loses at most a minute's learning
LEARNED_EVERY_S = 60.0


@dataclass(frozen=True)
class Hosted:
    """What a loader returns: the loaded model and the runtime and speculation over it, and the
    backend its dense segments run on (None: torch's own methods)."""

    loaded: object  # thor_runtime.loading.Loaded
    runtime: object  # thor_runtime.engine.generate.Runtime
    speculation: object  # thor_runtime.speculative.Speculation
    backend: object = None  # engines.backend.GraphBackend, attached to the model
    session: object = None  # thor_app.session.PlanSession over it; None: the host makes one


def plan_session(assembled):
    """The service's plan session: its log, and what auto learned written at most once a minute."""
    from thor_app.session import PlanSession

    return PlanSession(assembled, log=log.info, warn=log.warning, save_every_s=LEARNED_EVERY_S)


def default_loader(cfg: ServeConfig) -> Hosted:
    """The runtime of the config's [model], [engine] and [speculation] tables, built as every
    command builds its own (thor_app.assembly)."""
    from dataclasses import replace

    from thor_app.assembly import build_runtime
    from thor_app.default_model import choose_default
    from thor_app.server.leftovers import cache_roots, remove_abandoned

    remove_abandoned(cache_roots(cfg))  # before this start builds (and perhaps is killed) itself
    rc = cfg.runtime
    if not rc.model.prefill_chunk:  # one pass: nothing could stop or mark a long prompt meanwhile
        rc = replace(rc, model=replace(rc.model, prefill_chunk=SERVICE_PREFILL_CHUNK))
    rc = choose_default(rc, log.info)  # `thor plan`'s rule for an unnamed model, said in the log
    a = build_runtime(rc)
    from thor_app.server.config import skills_path

    session = plan_session(a)
    # the planner prompt's shared start for each configured skill set: from disk, or stored there
    session.attach_skill_sets([skills_path(cfg.planner)])
    session.load_learned()  # what --spec auto learned in its last run
    return Hosted(a.loaded, a.runtime, a.speculation, a.backend, session)


def resolve_thinking(mode: str, gtok) -> bool:
    """planner.thinking: ``auto`` thinks when the tokenizer has the think tokens."""
    return gtok.think_ids is not None if mode == "auto" else mode == "on"


def runtime_settings(h: Hosted, thinking: bool) -> dict:
    """What a hosted model actually runs with, read back from the built objects (not the
    config): /health reports it, and `thor bench --serve` compares its in-process side to it."""
    import torch

    from thor_runtime.device import device_name

    rt, spec, model = h.runtime, h.speculation, h.loaded.model
    return {
        "source": Path(str(h.loaded.source)).name,  # the file, not where it lives
        "weights": getattr(model, "quant", None) or "float",
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": device_name(model.device),
        "weights_layout": model.layout,
        "decode_kernel": getattr(model, "decode_kernel", "torch"),
        "prefill_kernel": getattr(model, "prefill_kernel", "torch"),
        "kv_dtype": rt.kv_dtype,
        "prefill_chunk": rt.prefill_chunk,
        "prefix_cache": rt.prefixes.entries if rt.prefixes is not None else 0,
        "speculation": spec.name,
        "spec_k": spec.k,
        "speculation_free_text": spec.free_text.name if spec.free_text is not None else spec.name,
        "thinking": thinking,
        "threads": torch.get_num_threads(),
        "backend": h.backend.name if h.backend is not None else "torch",
    }


def default_selftest(loaded, backend):
    """``backend``: the attached backend object (what is served), or a backend name."""
    try:
        from engines.selftest import run_selftest
    except ImportError:
        raise ThorError(
            "the self-test is unavailable (engines.selftest is not installed)"
        ) from None
    return run_selftest(loaded, backend=backend if backend is not None else "torch", quick=True)


@dataclass(frozen=True)
class PreparedChat:
    ids: list
    params: object  # SamplingParams
    grammar: object | None  # agent.schema.grammar.Grammar


class ModelHost:
    def __init__(
        self,
        cfg: ServeConfig,
        loader: Callable[[ServeConfig], Hosted] | None = None,
        selftest: Callable | None = None,
    ):
        self.cfg = cfg
        self.loader = loader or default_loader
        self.selftest = selftest or default_selftest
        self.status, self.reason = "starting", "the model has not been loaded yet"
        self.hosted: Hosted | None = None
        self.gtok = None
        self.report = None
        self.startup_s: dict[str, float] = {}
        self.on_status: Callable[[str, str], None] | None = None  # each phase, as it begins
        self.concurrency = 1  # requests the runtime may generate at once (set when ready)
        self._lock = threading.Lock()
        self._session = None  # (hosted, its session) when the loader gave none

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def model_id(self) -> str:
        return self.cfg.model.name

    @property
    def session(self):
        """What lives across the hosted runtime's plans (thor_app/session.py): the loader's
        session, else one over the hosted runtime with the config's world starts."""
        h = self.hosted
        if h.session is not None:
            return h.session
        if self._session is None or self._session[0] is not h:
            from thor_app.assembly import Assembled

            made = plan_session(
                Assembled(self.cfg.runtime, h.loaded, h.runtime, h.speculation, h.backend)
            )
            self._session = (h, made)
        return self._session[1]

    def _set(self, status: str, reason: str) -> None:
        with self._lock:
            if self.status == "stopping":
                return
            self.status, self.reason = status, reason
        log.info("%s: %s", status, reason)
        if self.on_status is not None:
            self.on_status(status, reason)

    def stopping(self) -> None:
        with self._lock:
            self.status, self.reason = "stopping", "the server is shutting down"

    # ---- start-up (blocking: run in a thread) -------------------------------------------------
    def start(self) -> bool:
        try:
            t = time.perf_counter()
            self._set("loading", f"loading model {self.cfg.model.name}")
            hosted = self.loader(self.cfg)
            from agent.schema.grammar import GrammarTokenizer

            gtok = GrammarTokenizer(hosted.loaded.tokenizer)
            self.startup_s["load"] = time.perf_counter() - t
            t = time.perf_counter()
            self._set("warming_up", "warming up")
            self.warm_up(hosted, gtok)
            self.startup_s["warm_up"] = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - any start-up failure is reported, never served past
            return self._failed("start-up failed", e)
        try:
            t = time.perf_counter()
            self._set("self_test", "running the on-device self-test")
            # The backend the requests will run on, not a fresh one: same engines, same options.
            served = hosted.backend if hosted.backend is not None else self.cfg.engine.backend
            report = self.selftest(hosted.loaded, served)
            self.startup_s["self_test"] = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - a self-test that cannot run has not passed
            return self._failed("self-test failed", e)
        self.report = report
        if not getattr(report, "passed", False):
            self._set("failed", f"self-test failed: {_summary(report)}")
            return False
        # the requests the workers run at once share the target's forwards (inflight.py)
        self.concurrency = hosted.runtime.share(self.cfg.limits.batch)
        if self.concurrency < self.cfg.limits.batch:
            log.info(
                "limits.batch %d: one request at a time (the engine backend's fixed-shape decode "
                "keeps one KV store)",
                self.cfg.limits.batch,
            )
        self.hosted, self.gtok = hosted, gtok
        self._set("ready", f"self-test passed: {_summary(report)}")
        return True

    def _failed(self, what: str, e: Exception) -> bool:
        msg = str(e) if isinstance(e, ThorError) else f"{type(e).__name__}: {e}"
        self._set("failed", f"{what}: {msg}")
        if not isinstance(e, ThorError):
            log.exception(what)
        return False

    @staticmethod
    def warm_up(h: Hosted, gtok) -> None:
        """One short plain and one constrained generation: allocator, kernels, grammar engine."""
        from agent.schema.grammar import Grammar
        from thor_runtime.engine import SamplingParams

        tok = h.loaded.tokenizer
        ids = tok.encode_chat([{"role": "user", "content": "Say hello."}])
        h.runtime.generate(ids, SamplingParams(max_tokens=4), h.speculation)
        h.runtime.generate(
            ids,
            SamplingParams(max_tokens=4),
            h.speculation,
            constraint=Grammar(gtok, {"type": "object"}).constraint(),
        )

    # ---- chat ---------------------------------------------------------------------------------
    def prepare_chat(self, req: ChatRequest) -> PreparedChat:
        """Tokenize, size and compile the grammar before queueing (a 400 costs no queue slot)."""
        from agent.schema.grammar import Grammar
        from thor_runtime.engine import SamplingParams

        h, lim = self.hosted, self.cfg.limits
        try:
            ids = h.loaded.tokenizer.encode_chat(list(req.messages))
        except Exception as e:  # noqa: BLE001 - a chat template may refuse a message order
            raise ThorError(
                f"messages cannot be rendered by the model's chat template: {e}"
            ) from None
        context = h.loaded.cfg.max_position_embeddings
        max_tokens = check_max_tokens(
            len(ids), req.max_tokens, lim.default_max_tokens, lim.max_tokens, context
        )
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            stop=req.stop,
        )
        grammar = None
        if req.response_format == "json_object":
            grammar = Grammar(self.gtok, {"type": "object"})
        elif req.response_format == "json_schema":
            grammar = Grammar(self.gtok, req.schema)
        return PreparedChat(ids, params, grammar)

    def chat_job(self, p: PreparedChat, on_text: Callable[[str], None] | None = None, stop=()):
        h = self.hosted
        streamer = TextStreamer(h.loaded.tokenizer, stop) if on_text is not None else None

        def run(ctx: JobContext):
            def on_token(t):
                ctx.check(t)
                if streamer is not None:
                    delta = streamer.push(t)
                    if delta:
                        on_text(delta)

            constraint = p.grammar.constraint() if p.grammar is not None else None
            res = h.runtime.generate(
                p.ids,
                p.params,
                h.speculation,
                constraint=constraint,
                on_token=on_token,
                on_prefill=lambda rows: ctx.check(),
            )
            tail = streamer.finish(res.text) if streamer is not None else ""
            return res, tail

        return run

    # ---- plan ---------------------------------------------------------------------------------
    def prepare_plan(self, req):
        """The specialized schema and its grammar: a bad schema or skill set is a 400 here."""
        from agent.planner import prepare_request

        return prepare_request(
            self.gtok,
            req.world,
            req.skills,
            req.schema,
            req.max_steps,
            self._thinking(),
            req.task,
            self.cfg.planner.lexicon,
        )

    def _thinking(self) -> bool:
        return resolve_thinking(self.cfg.planner.thinking, self.gtok)

    def settings(self) -> dict:
        return runtime_settings(self.hosted, self._thinking())

    def plan_job(self, req, prepared):
        """The job for a request prepared by ``prepare_plan``: every committed token goes through
        the job's check (cancellation, deadline, progress)."""
        h, session = self.hosted, self.session

        def run(ctx: JobContext):
            planner = session.planner(
                _Checked(h.runtime, ctx),
                max_tokens=req.max_tokens,
                attempts=req.attempts,
                thinking=self._thinking(),
                max_steps=req.max_steps,
                grammar_tokenizer=self.gtok,
            )
            res = session.plan(prepared, planner=planner, on_token=ctx.check)
            # a world's first plan: its start goes to disk (~40 ms); what auto learned, for the
            # next start, at most once a minute
            session.after_plan()
            return res

        return run


class _Checked:
    """The runtime as a job's planner sees it: every generate also checks the job between
    prefill chunks (the planner passes only ``on_token``)."""

    def __init__(self, runtime, ctx: JobContext):
        self._rt, self._ctx = runtime, ctx

    def __getattr__(self, name):
        return getattr(self._rt, name)

    def generate(self, *args, **kw):
        return self._rt.generate(*args, on_prefill=lambda rows: self._ctx.check(), **kw)


def _summary(report) -> str:
    """The summary's first line: it goes into /health's reason and systemd's one-line STATUS."""
    s = getattr(report, "summary", None)
    text = s() if callable(s) else str(report)
    return text.strip().splitlines()[0] if text.strip() else "(no summary)"
