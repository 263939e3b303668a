"""The generation loop: prefill, then cycles of propose -> verify -> accept -> commit.

Plain decoding is the same cycle with no drafts (K = 0), so speculative and plain
decoding share every line that decides which token is committed and when to stop.
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from thor_runtime.cache.kv_cache import KVScales
from thor_runtime.cache.prefix_cache import PrefixCache
from thor_runtime.engine.constraint import (
    TimedConstraint,
    masked,
    masked_argmax,
    narrow_share,
    read_ids,
)
from thor_runtime.engine.fixed_shape import STEP_ROWS
from thor_runtime.engine.runner import DecodeAsk, pick_decode
from thor_runtime.engine.sampling import SamplingParams, make_generator, target_probs
from thor_runtime.engine.stats import Stats
from thor_runtime.engine.threads import ThreadGovernor, one_torch_thread
from thor_runtime.errors import ThorError
from thor_runtime.models.target import Target
from thor_runtime.speculative import PLAIN, Speculation
from thor_runtime.speculative.accept import (
    accept_greedy,
    accept_relaxed_at,
    accept_sampling,
    accept_strict,
    in_thinking,
    thinking_flags,
)
from thor_runtime.speculative.budget import Cycle

# rows of drafter taps a kept prompt holds beyond the drafter's seed window (prefix_cache.py)
TAP_MARGIN = 64


@dataclass
class Result:
    token_ids: list[int]
    text: str
    finish_reason: str  # "eos" | "stop" | "length"
    prompt_tokens: int
    stats: Stats = field(default_factory=Stats)


class _Stopper:
    """Decides, token by token, where plain decoding would have stopped."""

    def __init__(self, tokenizer, params: SamplingParams, eos_ids: tuple[int, ...]):
        self.tok, self.p, self.eos = tokenizer, params, set(() if params.ignore_eos else eos_ids)
        self.out: list[int] = []
        self.reason: str | None = None
        self.text_end: int | None = None  # char index where a stop string starts

    def push(self, t: int) -> bool:
        """Commit one token; True when generation must end after it."""
        self.out.append(t)
        if t in self.eos:
            self.reason = "eos"
        elif self.p.stop:
            text = self.tok.decode(self.out)
            hits = [i for i in (text.find(s) for s in self.p.stop) if i >= 0]
            if hits:
                self.reason, self.text_end = "stop", min(hits)
        if self.reason is None and len(self.out) >= self.p.max_tokens:
            self.reason = "length"
        return self.reason is not None

    def text(self) -> str:
        ids = self.out[:-1] if self.reason == "eos" else self.out
        text = self.tok.decode(ids)
        return text[: self.text_end] if self.text_end is not None else text


class Runtime:
    """Holds the target (and tokenizer); one ``generate`` call per sequence."""

    def __init__(
        self,
        model: Target,
        tokenizer,
        kv_dtype: str = "fp32",
        prefill_chunk: int = 0,
        kv_scales: KVScales | None = None,
        cache_options: dict | None = None,
        prefix_cache: int = 0,
        fixed_shape: bool | None = None,
        step_rows: int = STEP_ROWS,
        max_context: int | None = None,
        compile: bool = False,
        cost_cache: str | None = None,
    ):
        """fixed_shape: run every decode forward at ``step_rows`` rows (fixed_shape.py); None =
        where kernels are not row-invariant (CUDA), for dense targets. cost_cache: where the
        verify cost curve is kept (speculative/cost.py; None = the default cache dir, '' = not
        kept)."""
        self.model, self.tok = model, tokenizer
        self.kv_dtype, self.prefill_chunk, self.kv_scales = kv_dtype, prefill_chunk, kv_scales
        # Passed to a model that builds its own cache (hybrid: {"naive": True} = replay rollback).
        self.cache_options = dict(cache_options or {})
        # The K/V of the last ``prefix_cache`` prompts (0: none). Not for hybrid targets: their
        # recurrent state cannot be cut back to a shorter common start.
        self.prefixes = (
            PrefixCache(prefix_cache) if prefix_cache > 0 and not model.is_hybrid else None
        )
        # who runs the verifies and holds the request's cache (runner.py)
        self._ask = DecodeAsk(
            model, kv_dtype, kv_scales, fixed_shape, step_rows, max_context, compile
        )
        self.decode = pick_decode(self._ask)
        self.decoder, self.pad_rows, self.verify = (
            self.decode.decoder,
            self.decode.pad_rows,
            self.decode.verify,
        )
        self.threads = ThreadGovernor()  # pools sized to the idle cores (threads.py)
        self.cost_cache, self._curve = cost_cache, None
        # Sequences generated at once from several threads share verifies (inflight.py); None:
        # one caller at a time, every forward its own.
        self.batch = None
        self._shared = threading.Lock()  # the prefix cache and the cost curve, between callers

    def share(self, limit: int) -> int:
        """Let up to ``limit`` concurrent ``generate`` calls decode together: their verifies run
        as one forward (what each commits stays what it would commit alone), their prefill
        chunks and rounds one at a time on the cores. -> how many calls may run at once.
        A fixed-shape decoder is rebuilt with a KV slot per call (its forwards then always run
        every slot's rows: fixed_shape.py); one whose forwards a graph backend runs keeps one
        store and serves one call at a time."""
        from thor_runtime.engine.inflight import StepBatch

        if self.decoder is not None:
            slots = limit if limit > 1 and self.model.backend is None else 1
            if self.decoder.slots != slots:
                self.decode = pick_decode(replace(self._ask, slots=slots))
                self.decoder, self.verify = self.decode.decoder, self.decode.verify
            if slots == 1:
                self.batch = None
                return 1
        self.batch = StepBatch(self.model, self.verify, limit) if limit > 1 else None
        return max(1, limit)

    def _compute(self):
        return self.batch.compute if self.batch is not None else nullcontext()

    def _drafting(self, proposer):
        """The context a drafter's forwards run in: torch at one thread where the target's run
        on the row kernel (threads.one_torch_thread), as they are otherwise."""
        rows = (
            getattr(getattr(self.model, "runner", None), "rows", None) is not None
        )  # hybrid models: no runner
        drafter = (
            proposer is not None and bool(proposer.tap_layers) and self.model.device.type == "cpu"
        )
        return one_torch_thread if rows and drafter else nullcontext

    def new_cache(self, capacity: int):
        """An empty cache of the model's own kind (hybrid targets: KV cache + recurrent state)."""
        return self.model.new_cache(capacity, self.kv_dtype, self.kv_scales, **self.cache_options)

    def cost_curve(self, rows: int):
        """What this runtime's verify of 1..rows rows costs, in 1-row steps (speculative/cost.py):
        measured once per machine and model, then read from the cache dir."""
        with self._shared:
            if self._curve is None or self._curve.rows < min(rows, self.pad_rows or rows):
                from thor_runtime.speculative.cost import verify_costs

                with self._compute():  # measured alone on the cores
                    self._curve = verify_costs(self, rows, self.cost_cache)
            return self._curve

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams = SamplingParams(),
        speculation: Speculation = PLAIN,
        constraint=None,
        on_token: Callable[[int], None] | None = None,
        on_prefill: Callable[[int], None] | None = None,
    ) -> Result:
        """speculation: proposer, K, draft budget and relaxed acceptance (PLAIN: K = 0).
        on_prefill(rows done): called between prefill chunks (``prefill_chunk``), so a caller can
        mark progress or stop a long prompt by raising; the chunks are those of an unhooked call."""
        cfg = self.model.cfg
        if speculation.auto is not None:
            # auto: this request's proposer and its K per cycle, from the cost curve (auto.py)
            speculation = speculation.auto.pick(
                constraint is not None, self.cost_curve(speculation.auto.rows), speculation
            )
        elif constraint is None and speculation.free_text is not None:
            speculation = speculation.free_text  # per request: free text vs constrained plans
        proposer, k, relaxed = speculation.proposer, speculation.k, speculation.relaxed
        draft_budget = speculation.budget
        if self.batch is not None and proposer is not None:
            proposer = proposer.fork()  # other sequences may be drafting with it right now
        if not prompt_ids:
            raise ThorError("the prompt is empty")
        if len(prompt_ids) >= cfg.max_position_embeddings:
            raise ThorError(
                f"prompt of {len(prompt_ids)} tokens does not fit the model context "
                f"of {cfg.max_position_embeddings} tokens"
            )
        cache = self.decode.cache(self.new_cache, len(prompt_ids) + params.max_tokens, k)
        try:
            gen = None if params.greedy else make_generator(params.seed)
            stats = Stats(
                kv_dtype=self.kv_dtype,
                kv_bytes=cache.nbytes(),
                prompt_tokens=len(prompt_ids),
                device=str(self.model.device),
                spec_note=speculation.note,
            )
            if constraint is not None:
                constraint = TimedConstraint(constraint, stats)
            taps = proposer.tap_layers if proposer is not None else ()
            stop = _Stopper(self.tok, params, getattr(self.tok, "eos_token_ids", ()))

            # ---- prefill: fills the cache, seeds the drafter window from the prompt tail
            t0 = time.perf_counter()
            self.threads.start()
            ids = torch.tensor(prompt_ids, dtype=torch.long)
            P = len(prompt_ids)
            seed_rows = min(proposer.window, P) if proposer is not None and taps else 0
            # the kept copy holds the taps of TAP_MARGIN rows more than the seed: the next task in
            # the same world differs by a few tokens, so its seed rows start a little earlier
            kept_rows = (
                min(seed_rows + TAP_MARGIN, P)
                if seed_rows and self.prefixes is not None
                else seed_rows
            )
            # a start some recent prompt shared comes from the prefix cache, with the taps that
            # prompt kept of the rows among the drafter's seed rows and of the margin before them
            # (without the seed rows' taps the start ends before those rows); the last row always
            # runs
            with self._shared:
                reused, head_taps = (
                    self.prefixes.restore_seeded(
                        prompt_ids,
                        cache,
                        P - 1,
                        P - seed_rows if seed_rows else None,
                        P - kept_rows if seed_rows else None,
                    )
                    if self.prefixes is not None
                    else (0, {})
                )
                stats.pinned_prompt_tokens = (
                    reused if reused and self.prefixes.last_from_disk else 0
                )
            out = self._prefill(ids[reused:], cache, taps, min(kept_rows, P - reused), on_prefill)
            kept = (
                {i: torch.cat([head_taps[i], t]) for i, t in out.taps.items()}
                if head_taps
                else out.taps
            ) or None  # layer -> [>= seed_rows, D]
            seed = (
                {i: t[-seed_rows:] for i, t in kept.items()} if kept else None
            )  # layer -> [seed_rows, D]
            if self.prefixes is not None:
                with self._shared:
                    self.prefixes.store(prompt_ids, cache, kept)
            stats.cached_prompt_tokens = reused
            drafting = self._drafting(proposer)
            if proposer is not None:
                with drafting():
                    proposer.start(list(prompt_ids), seed)
            first = self._select(
                out.logits,
                torch.empty(0, dtype=torch.long),
                None,
                [],
                params,
                gen,
                relaxed,
                constraint,
            )[1]
            stats.ttft_s = time.perf_counter() - t0
            stats.prefill_s = stats.ttft_s
            seq = list(prompt_ids)
            done = self._commit(first, seq, stop, constraint, on_token)

            # ---- decode: one cycle per iteration
            t_dec = time.perf_counter()
            budget_state = draft_budget.start() if draft_budget is not None else None
            verify = self.batch.verify if self.batch is not None else self.verify
            with self.batch.member() if self.batch is not None else nullcontext():
                while not done:
                    self.threads.tick()
                    t_a = time.perf_counter()
                    forced_ids = self._forced(stop, params, constraint)
                    members = (
                        self.batch.members
                        if self.batch is not None and self.batch.shared_forward
                        else 1
                    )
                    if members > 1 and not self.batch.rows_free:
                        # In a shared round every row is compute the other sequences wait for: auto
                        # keeps the drafts worth a row of the whole round (CostBudget.cap_shared),
                        # other budgets none, as the others' anchors fill a CPU's round better than
                        # guesses do. The grammar's forced tokens always ride (they are certain).
                        shared = getattr(draft_budget, "cap_shared", None)
                        cap = shared(k, budget_state, len(forced_ids), members) if shared else 0
                    else:
                        cap = (
                            draft_budget.cap(k, budget_state, len(forced_ids))
                            if draft_budget is not None
                            else k
                        )
                    t_p = time.perf_counter()
                    with self._compute(), drafting():  # a drafter's forward: not beside a round's
                        drafts, draft_probs, forced = self.propose(
                            proposer, seq, k, stop, params, constraint, cap, forced_ids
                        )
                    t_b = time.perf_counter()
                    rows = torch.tensor([seq[-1]] + drafts, dtype=torch.long)  # [K+1]
                    # the ids each row may commit, known before the logits: only theirs are computed
                    allowed = (
                        constraint.allowed_rows(drafts, len(rows), cfg.vocab_size)
                        if constraint is not None
                        else None
                    )  # [K+1, V]
                    t_v = time.perf_counter()
                    cols = read_ids(allowed)
                    vout = verify(rows, cache, taps=taps, cols=cols)  # logits [K+1, V]
                    t_c = time.perf_counter()
                    n_acc, committed = self._select(
                        vout.logits,
                        rows[1:],
                        draft_probs,
                        seq,
                        params,
                        gen,
                        relaxed,
                        constraint,
                        stats,
                        allowed,
                        cols,
                    )
                    # Rows 0..n_acc (anchor + accepted drafts) stay in the cache; the last committed
                    # token becomes the next anchor.
                    cache.crop(len(seq) + n_acc)
                    t_k = time.perf_counter()
                    if proposer is not None:
                        with drafting():
                            proposer.commit(n_acc + 1, vout.taps or None)
                    keep_s = time.perf_counter() - t_k
                    done = self._commit(committed, seq, stop, constraint, on_token)
                    if draft_budget is not None:
                        cost = Cycle(
                            len(rows),
                            forced,
                            t_c - t_v,
                            t_b - t_p if cap else 0.0,
                            keep_s,
                            narrow_share(cols, len(rows)),
                            members,
                            time.perf_counter() - t_a,
                            len(committed),
                        )
                        budget_state = draft_budget.update(
                            budget_state, len(drafts) - forced, max(n_acc - forced, 0), cost
                        )
                    stats.record_cycle(
                        len(drafts),
                        n_acc,
                        len(committed),
                        forced,
                        t_b - t_a,
                        t_c - t_v,
                        time.perf_counter() - t_c + t_v - t_b,
                        capped=cap < k,
                    )
            stats.decode_s = time.perf_counter() - t_dec
            stats.auto_choice = (
                draft_budget.report(budget_state) if draft_budget is not None else None
            )
            stats.generated = len(stop.out)
            return Result(stop.out, stop.text(), stop.reason or "length", len(prompt_ids), stats)
        finally:
            self.decode.release(cache)  # a slot of a decoder with several goes back

    def _prefill(self, ids, cache, taps, seed_rows, on_prefill):
        """The model's chunked prefill, with ``on_prefill`` between whole chunks. The last call
        keeps the final row (its logits) and the drafter's seed rows (their taps)."""
        step, head = self.prefill_chunk, 0
        if on_prefill is not None and step > 0:
            head = max(0, len(ids) - max(1, seed_rows)) // step * step
        for s in range(0, head, step or 1):
            with self._compute():  # one chunk, then a waiting round may run
                self.model.prefill(ids[s : s + step], cache, step)
            on_prefill(s + step)
        with self._compute():
            return self.model.prefill(
                ids[head:], cache, self.prefill_chunk, taps=taps, tap_rows=seed_rows
            )

    # ---- the three verbs' helpers
    @staticmethod
    def _forced(stop, params, constraint) -> list[int]:
        """The tokens the grammar forces next, within the token budget."""
        budget = (
            params.max_tokens - len(stop.out) - 1
        )  # the cycle commits one token beyond the drafts
        return list(constraint.forced())[: max(budget, 0)] if constraint is not None else []

    def propose(self, proposer, seq, k, stop, params, constraint, cap, forced):
        """``forced`` grammar tokens first (they ride in the draft for free), then at most ``cap``
        of the proposer's drafts, cut at the first token the grammar rejects and at the token
        budget."""
        budget = (
            params.max_tokens - len(stop.out) - 1
        )  # the cycle commits one token beyond the drafts
        drafts, probs = list(forced), None
        room = min(k, budget, len(drafts) + cap) - len(drafts)
        if proposer is not None and room > 0:
            extra, probs = proposer.propose(seq + drafts, room)
            extra = list(extra)[:room]
            if probs is not None:
                probs = probs[: len(extra)]
                if forced:  # forced rows are certain: one-hot proposal probabilities
                    one = torch.zeros(len(forced), probs.shape[-1])
                    one[torch.arange(len(forced)), torch.tensor(forced)] = 1.0
                    probs = torch.cat([one, probs])
            drafts += extra
        if constraint is not None and len(drafts) > len(forced):
            ok = constraint.valid_prefix(drafts)
            drafts = drafts[:ok]
        if probs is not None:
            probs = probs[: len(drafts)]
        return drafts, probs, len(forced)

    def _select(
        self,
        logits,
        drafts,
        draft_probs,
        seq,
        params,
        gen,
        relaxed,
        constraint,
        stats=None,
        allowed=None,
        cols=None,
    ):
        """cols: the ids the verify computed (read_ids of ``allowed``), None: all."""
        relax = (
            self._relaxable(drafts, seq, relaxed, constraint)
            if params.greedy and relaxed is not None
            else []
        )
        if (
            params.greedy
            and not any(relax)
            and allowed is not None
            and (cols is not None or not logits.is_cuda)
        ):
            # the few legal columns only, and a row read whole masked only where its maximum is
            # illegal: masking and an argmax over the whole vocabulary took ~3 ms of a 16-row
            # cycle on CPU (a GPU's rows, all read whole, are masked and reduced on the device)
            return accept_greedy(masked_argmax(logits, allowed, cols), drafts)
        if allowed is not None:
            logits = masked(logits, allowed)  # [K+1, V], -inf where illegal
        elif constraint is not None:
            logits = constraint.mask_rows(logits, drafts.tolist())
        if params.greedy and not any(relax):
            return accept_strict(logits, drafts)  # the argmax on the device, K + 1 ids back
        # The token-by-token policies read single entries: one copy of the rows to the host
        # first, not one synchronisation per entry (logits on a GPU).
        logits = logits.cpu()
        if params.greedy:
            n, committed, kept = accept_relaxed_at(logits, drafts, relax, relaxed)
            if stats is not None:
                stats.relaxed_accepted += kept
            return n, committed
        return accept_sampling(target_probs(logits, params), drafts, gen, draft_probs)

    @staticmethod
    def _relaxable(drafts, seq, relaxed, constraint) -> list[bool]:
        """Per draft: may the relaxed rule keep it? Inside the thinking span, and with
        ``relaxed.spans`` inside the spans the constraint names (a plan's free-text rationale)."""
        ids = drafts.tolist()
        relax = thinking_flags(ids, in_thinking(seq, relaxed), relaxed)
        if relaxed.spans and constraint is not None and ids:
            relax = [a or b for a, b in zip(relax, constraint.relaxed_spans(ids))]
        return relax

    def _commit(self, tokens, seq, stop, constraint, on_token) -> bool:
        for t in tokens:
            seq.append(t)
            if constraint is not None:
                constraint.advance(t)
            if on_token is not None:
                on_token(t)
            if stop.push(t):
                return True
        return False
