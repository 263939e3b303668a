"""Choosing the plan's goal among the few the grammar allows, by the model's own likelihood and by
reachability, rather than taking the first greedy guess.

The plan writes its goal before its steps, under a grammar specialized to this world, these
skills and (with the word rules) this task. Greedy decoding takes the likeliest token at each
point, which is not the likeliest goal: "wait 10" can lose to "wait 10.5" at the token after
"10" and still be the likelier whole. So after the attempt's greedy decode:

1. The prompt and the greedy plan's head (up to ``"steps":[``) run through the model once, and
   every goal token's distribution is masked by the grammar (a legal token's log-probability
   is renormalized over the legal ones, so a forced token costs nothing and a goal is not
   penalized for the grammar's punctuation).
2. At the ``branches`` goal tokens where the greedy token led the best other legal token by the
   least, that other token is taken instead and the goal completed greedily under the grammar
   from the shared cache (cropped back to the branch point), scoring its tokens as it goes.
3. Each candidate is judged: infeasible from the goal alone (payload, workspace, a missing
   thing, an empty set), reachable (the solver's steps for it pass the gate and the task's
   grounding check), or neither. A reachable candidate ranks above one that is not; among
   reachable ones the higher log-likelihood wins.
4. The few reachable candidates that rank best are read the other way round (``explain``): how
   likely the task's own words are after each goal, as if the model had to say the goal. A goal
   the words follow from ("keep hold of the pen": the pen held) gains on one that is merely
   likely after them (the pen inspected). The words are the task's in whatever language it
   came; the goal's things are shown with their aliases from the world file.

A goal saying a thing is missing is offered only in the task's own words (a run of them that
names nothing of the world, ``_lacking``), and is the refusal only where it ranks above every
reachable goal and the task reads back from it better than from each (``choose``).

A greedy goal infeasible from the goal alone is never replaced: that is the task's refusal for
its stated reason, and a likelier goal about another thing would turn it into a wrong plan.
Only a reachable candidate ever replaces the greedy goal.

The forwards here are the model's plain ``forward`` (not the decode loop's row-exact verify):
scores are deterministic for a given model and input, and the greedy goal's own tokens are the
decode loop's, so only the ranking reads these numbers.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

import torch

from agent.language.checks import names_in
from agent.planner.prompt import explain_messages
from agent.symbolic.executor import initial_state, parse_goal, reaches
from thor_runtime.cache import common_prefix

GOAL_OPEN = b'"goal":['
STEPS_OPEN = b'"steps":['
MISSING_OPEN = b'{"missing":"'
# where in the task a missing thing's name may start (``_lacking``): this many of its words, the
# likeliest first
MISSING_STARTS = 2
# a goal longer than this many tokens after its branch point is left unfinished (dropped)
MAX_GOAL_TOKENS = 160

REACHABLE, UNREACHED, INFEASIBLE = 0, 1, 2
# what one hint of a lexicon (a phrase of the task that asks for a form, a skill or a state the
# goal uses) adds to a goal's rank, in nats: as much as the task making the goal's wording
# e^4 times likelier; a hint ranks, it never decides alone
HINT_NATS = 4.0
# a goal's grounding (checks.grounding: the things the task names that it is about) ranks it as
# a hint does, per thing
GROUND_NATS = HINT_NATS
# end-state openings tried for at most this many of the objects a task names
MAX_NAMED_FORMS = 3
# the reachable goals ranked best that are also weighed by how well each explains the task's words
# (``explain``), and what one nat of that adds to a goal's rank: half a nat, so the task's words
# read back from the goal move a rank as much as the goal's own likelihood moves it by half
EXPLAIN_POOL = 3
EXPLAIN_NATS = 0.5
# the condition kinds that say where things end (an end state says them itself, no call needed)
END_KINDS = ("at", "holding", "on", "robot_at")
TIER_NAMES = {REACHABLE: "reachable", UNREACHED: "not reached", INFEASIBLE: "infeasible"}


@dataclass
class Candidate:
    ids: list[int]  # generated ids from the first through the one that opens the steps
    logprob: float  # sum over the goal's tokens of the grammar-masked log-probability
    tokens: int  # goal tokens scored
    branch: int | None  # index into ids where it left the greedy head; None: the greedy one
    text: str = ""
    tier: int = UNREACHED
    goal: list | None = None
    prior: float = 0.0  # the same goal's log-likelihood with no task (``priors``)
    start: int = 0  # index into ids of the goal's first token
    score: float | None = None  # its rank by ``choose``'s score (None: not ranked)
    grounded: tuple[int, int] | None = None  # ``choose``'s ``ground`` of it (None: not used)
    # log P(task | goal) less the best of the goals weighed so (``explain``); 0: not weighed
    explained: float = 0.0


@dataclass
class Choice:
    """What the choice did, for the plan's stats."""

    chosen: Candidate | None
    candidates: list[Candidate] = field(default_factory=list)
    changed: bool = False
    seconds: float = 0.0
    note: str = ""

    def summary(self) -> dict:
        return {
            "changed": self.changed,
            "seconds": round(self.seconds, 4),
            "note": self.note,
            "candidates": [
                {
                    "goal": c.goal,
                    "logprob": round(c.logprob, 4),
                    "tokens": c.tokens,
                    "greedy": c.branch is None,
                    "tier": TIER_NAMES[c.tier],
                    "prior": round(c.prior, 4),
                    "score": None if c.score is None else round(c.score, 4),
                    "grounded": None if c.grounded is None else list(c.grounded),
                    "explained": round(c.explained, 4),
                }
                for c in self.candidates
            ],
        }


def head_span(token_bytes: list[bytes], ids: list[int], start: int = 0) -> tuple[int, int] | None:
    """-> (g, h): ids[g] is the first token that writes into the goal array, ids[h - 1] the one
    that completes ``"steps":[``; None when the ids do not write a whole goal. ``start``: ignore
    tokens before it (a thinking span)."""
    text, g, ends = bytearray(), None, []
    for i in range(start, len(ids)):
        t = ids[i]
        text += token_bytes[t] if t < len(token_bytes) else b""
        ends.append(len(text))
        if g is None:
            at = text.find(GOAL_OPEN)
            if at >= 0:
                open_end = at + len(GOAL_OPEN)
                # the first token with a byte past the bracket: that one may already choose
                g = (
                    next(start + j for j, e in enumerate(ends) if e > open_end)
                    if len(text) > open_end
                    else i + 1
                )
        if g is not None and text.find(STEPS_OPEN, max(0, len(text) - len(STEPS_OPEN) - 16)) >= 0:
            return g, i + 1
    return None


def _masked_logprobs(constraint, logits: torch.Tensor, drafts: list[int]) -> torch.Tensor:
    """logits [R, V] -> log-probabilities [R, V] renormalized over each row's legal tokens (row j
    at the grammar's state after drafts[:j]); -inf where illegal."""
    return torch.log_softmax(constraint.mask_rows(logits.float(), drafts), dim=-1)


class GoalChooser:
    """``branches``: how many alternative goals to score (0: none, the chooser is off)."""

    def __init__(
        self, model, tokenizer, gtok, new_cache, branches: int, prefill_chunk: int = 0, restore=None
    ):
        """restore(prompt_ids, cache, limit) -> positions filled from the runtime's prefix cache
        (the prompt the attempt's decode just stored), or None when it keeps none."""
        self.model, self.tok, self.gtok = model, tokenizer, gtok
        self.new_cache, self.branches, self.prefill_chunk = new_cache, int(branches), prefill_chunk
        self.restore = restore

    def candidates(
        self,
        prompt_ids: list[int],
        gen_ids: list[int],
        grammar,
        start: int = 0,
        forms: tuple[str, ...] = (),
        branch: bool = True,
        unnamed: list[tuple[int, str]] = (),
    ) -> list[Candidate]:
        """The greedy goal (``gen_ids``' head), up to ``branches`` alternatives (none without
        ``branch``), one goal per text of ``forms`` (how a goal's first item opens:
        ``{"do":"inspect"``, or a whole goal), and goals that say a thing is missing in the
        task's own words (``unnamed``: ``TaskWords.unnamed``; ``_lacking``), each scored."""
        span = head_span(self.gtok.token_bytes, gen_ids, start)
        if span is None:
            return []
        g, h = span
        head, P = list(gen_ids[:h]), len(prompt_ids)
        cache = self.new_cache(P + h + 2 * MAX_GOAL_TOKENS)
        # the prompt's K/V: from the prefix cache when the runtime keeps one (the decode just
        # stored this very prompt), else one prefill; its last row always runs (its logits)
        done = self.restore(prompt_ids, cache, P - 1) if self.restore is not None else 0
        ids = torch.tensor(prompt_ids[done:], dtype=torch.long)
        last = self.model.prefill(ids, cache, self.prefill_chunk).logits  # [1, V]
        out = self.model.forward(
            torch.tensor(head[: h - 1], dtype=torch.long),
            cache,
            logits_rows=slice(max(g - 1, 0), None),
        )
        rows = (
            out.logits if g > 0 else torch.cat([last[-1:], out.logits])
        )  # [h - g, V]: predict head[g:h]
        c = grammar.constraint()
        for t in head[:g]:
            c.advance(t)
        lp = _masked_logprobs(c, rows, head[g : h - 1])  # [h - g, V]
        picked = lp[torch.arange(h - g), torch.tensor(head[g:h])]  # [h - g]
        greedy = Candidate(head, float(picked.sum()), h - g, None)
        tb = self.gtok.token_bytes
        rest = [b"".join(tb[t] for t in head[g + j : h] if t < len(tb)) for j in range(h - g)]

        def options(j: int, n: int) -> list[int]:
            """The likeliest legal tokens at goal token j other than the greedy one, one per text
            (leaving out those that only spell the greedy text, or an option taken, another way)."""
            row = lp[j].clone()
            row[head[g + j]] = float("-inf")
            top = torch.topk(row, min(32, row.numel()))
            kept: list[int] = []
            said = [rest[j]]
            for v, t in zip(top.values.tolist(), top.indices.tolist()):
                b = tb[t] if t < len(tb) else b""
                # one option per text: a token that begins, or is begun by, one taken already
                # (the greedy rest included) would mostly spell that text again
                if v == float("-inf") or len(kept) == n:
                    break
                if b and not any(x.startswith(b) or b.startswith(x) for x in said):
                    kept.append(int(t))
                    said.append(b)
            return kept

        alts = {j: options(j, max(self.branches // 2, 1)) for j in range(h - g)} if branch else {}
        choices = [j for j in range(h - g) if alts.get(j)]
        # The goal's first choice is what kind of thing it asks (an end state, a call, an order,
        # a set) or what its first condition is about: half the branches take its next likeliest
        # options there, so a goal of another kind is weighed at all. The rest go where the
        # greedy token led the best other legal one by the least.
        points = []
        if choices:
            first = choices[0]
            points = [(first, t) for t in alts[first]]
            lead = {j: float(picked[j] - lp[j, alts[j][0]]) for j in choices[1:]}
            points += [(j, alts[j][0]) for j in sorted(lead, key=lead.get)][
                : self.branches - len(points)
            ]
        out_c = [greedy]
        # latest branch first: each one only crops the cache back further, and the K/V before
        # its branch point are still the greedy head's
        for j, t in sorted(points, key=lambda p: -p[0]):
            cand = self._complete(
                cache,
                P,
                head[: g + j],
                t,
                float(picked[:j].sum() + lp[j, t]),
                grammar,
                j + 1,
                g + j,
            )
            if cand is not None:
                out_c.append(cand)
        forms = tuple(forms) + self._lacking(cache, P, head, g, start, unnamed, grammar)
        out_c += self._opened(cache, P, head, g, start, lp[0], forms, grammar)
        for cand in out_c:
            cand.start = g
        return out_c

    def priors(self, neutral_ids: list[int], cands: list[Candidate], grammar) -> None:
        """Each candidate's goal scored as ``candidates`` scores it, but after ``neutral_ids`` (the
        same request with no task, up to where the goal opens) in place of the prompt and the
        plan's head: what the goal costs when nothing asks for it. The difference from its
        score is how much the task itself makes that goal likelier (a pointwise mutual
        information), which does not favour a goal for being short."""
        if not cands:
            return
        g = cands[0].start
        N = len(neutral_ids)
        cache = self.new_cache(N + MAX_GOAL_TOKENS + max(len(c.ids) for c in cands))
        done = self.restore(neutral_ids, cache, N - 1) if self.restore is not None else 0
        last = self.model.prefill(
            torch.tensor(neutral_ids[done:], dtype=torch.long), cache, self.prefill_chunk
        ).logits  # [1, V]
        for cand in cands:
            goal = cand.ids[g:]
            cache.crop(N)
            rows = last[-1:]
            if len(goal) > 1:
                out = self.model.forward(torch.tensor(goal[:-1], dtype=torch.long), cache).logits
                rows = torch.cat([last[-1:], out])  # [n, V]
            c = grammar.constraint()
            for t in cands[0].ids[:g]:
                c.advance(t)
            lp = _masked_logprobs(c, rows, goal[:-1])  # [n, V]
            each = lp[torch.arange(len(goal)), torch.tensor(goal)]  # [n]
            cand.prior = float(each[torch.isfinite(each)].sum())

    def explain(self, task: str, world, cands: list[Candidate], key, lacking=()) -> int:
        """The second reading: for the ``EXPLAIN_POOL`` reachable candidates that rank best by
        ``key`` (the choice's own order), the log-likelihood of the task's words after the goal,
        as the model would word it (``prompt.explain_messages``: the goal and the aliases of
        what it names), so a goal the task's words follow from ranks above one that is only
        likely after them: "keep hold of the pen" reads back from the pen held, not from the pen
        inspected. Each weighed candidate's ``explained`` is that less the best one's (<= 0);
        every other reachable candidate gets the lowest of them, so none overtakes a weighed one
        for not having been weighed. The likeliest of ``lacking`` (goals that say a thing the
        task names is missing) is read back too, against the same best (``choose``: a refusal
        where it explains the words better). -> forwards run (none where fewer than two)."""
        seen: dict[str, Candidate] = {}
        for c in cands:
            if c.tier == REACHABLE:
                seen.setdefault(repr(c.goal), c)
        pool = sorted(seen.values(), key=key, reverse=True)[:EXPLAIN_POOL]
        refusal = max(lacking, key=lambda c: c.logprob, default=None)
        weigh = pool + ([refusal] if refusal is not None and pool else [])
        if len(weigh) < 2 or not getattr(self.tok, "chat_template", None):
            return 0
        raw = {}
        for c in weigh:
            msgs = explain_messages(c.goal, world)
            head = self.tok.encode_chat(msgs)
            full = self.tok.encode_chat(
                msgs + [{"role": "assistant", "content": task}], add_generation_prompt=False
            )
            n = common_prefix(head, full)
            cache = self.new_cache(len(full) + 1)
            rows = self.model.forward(
                torch.tensor(full[:-1], dtype=torch.long), cache, logits_rows=slice(n - 1, None)
            ).logits  # [len(full) - n, V]: predict the task's tokens and the turn's end
            lp = torch.log_softmax(rows.float(), -1)
            raw[id(c)] = float(lp[torch.arange(len(full) - n), torch.tensor(full[n:])].sum())
        best = max(raw[id(c)] for c in pool)
        low = min(raw[id(c)] for c in pool)
        for c in cands:
            if c.tier == REACHABLE:
                same = seen[repr(c.goal)]
                c.explained = raw[id(same)] - best if id(same) in raw else low - best
        if refusal is not None:
            refusal.explained = raw[id(refusal)] - best
        return len(weigh)

    def _opened(
        self,
        cache,
        P: int,
        head: list[int],
        g: int,
        start: int,
        first: torch.Tensor,
        forms: tuple[str, ...],
        grammar,
    ) -> list[Candidate]:
        """One goal per form: its opening text written after the goal's bracket, then completed
        greedily. ``first``: the grammar-masked log-probabilities [V] of the goal's first token.
        A form the grammar does not allow here is left out."""
        out = []
        for form in forms:
            ids = self._spell(head[:g], self._to_bracket(head, g, start) + form.encode(), grammar)
            if not ids or not torch.isfinite(first[ids[0]]):
                continue
            score = float(first[ids[0]])
            if len(ids) > 1:
                cache.crop(P + g)
                c = grammar.constraint()
                for t in head[:g] + ids[:1]:
                    c.advance(t)
                rows = self.model.forward(torch.tensor(ids[:-1], dtype=torch.long), cache).logits
                lp = _masked_logprobs(c, rows, ids[1:-1])  # [k - 1, V]
                each = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]  # [k - 1]
                if not bool(torch.isfinite(each).all()):
                    continue
                score += float(each.sum())
            cand = self._complete(
                cache, P, head[:g] + ids[:-1], ids[-1], score, grammar, len(ids), g
            )
            if cand is not None:
                out.append(cand)
        return out

    def _to_bracket(self, head: list[int], g: int, start: int) -> bytes:
        """What is left to write after ``head[:g]`` up to and including the goal's bracket (the
        bracket's token may also write the goal's first bytes: then nothing)."""
        tb = self.gtok.token_bytes
        text = b"".join(tb[t] for t in head[start:] if t < len(tb))
        written = len(b"".join(tb[t] for t in head[start:g] if t < len(tb)))
        return text[written : text.find(GOAL_OPEN) + len(GOAL_OPEN)]

    def _lacking(
        self, cache, P: int, head: list[int], g: int, start: int, unnamed, grammar
    ) -> tuple[str, ...]:
        """The forms of goals ``[{"missing": RUN}]`` where RUN is a run of the task's words that
        names nothing of this world (``unnamed``: (its first word, its text)): after the opening
        ``{"missing":"``, the ``MISSING_STARTS`` words where a run's first token is likeliest,
        and every run from each of them (one word, two, ...), for ``_opened`` to score. The
        name is then the task's own words, never a thing the world has, in any language."""
        if not unnamed:
            return ()
        ids = self._spell(head[:g], self._to_bracket(head, g, start) + MISSING_OPEN, grammar)
        if not ids:
            return ()
        cache.crop(P + g)
        c = grammar.constraint()
        for t in head[:g] + ids:
            c.advance(t)
        rows = self.model.forward(
            torch.tensor(ids, dtype=torch.long), cache, logits_rows="last"
        ).logits  # [1, V]: the name's first token
        lp = _masked_logprobs(c, rows[-1:], [])[0]  # [V]
        by_start: dict[int, float] = {}
        for at, run in unnamed:
            if at not in by_start:
                t = self.tok.encode(run, add_special=False)
                by_start[at] = float(lp[t[0]]) if t else float("-inf")
        starts = sorted(by_start, key=by_start.get, reverse=True)[:MISSING_STARTS]
        return tuple(
            MISSING_OPEN.decode() + json.dumps(run, ensure_ascii=False)[1:] + "}]"
            for at, run in unnamed
            if at in starts and by_start[at] > float("-inf")
        )

    def _spell(self, prefix: list[int], want: bytes, grammar) -> list[int]:
        """Tokens the grammar allows after ``prefix`` that write ``want`` (the last may write
        more, where the grammar joins what follows to it: a string's closing quote and its
        comma); [] when it allows none. The tokenizer's own spelling wherever it is legal."""
        tb = self.gtok.token_bytes
        c = grammar.constraint()
        for t in prefix:
            c.advance(t)
        out: list[int] = []
        while want:
            allowed = c.allowed_rows([], 1, self.gtok.n_vocab)[0]  # [V]
            guess = self.tok.encode(want.decode("utf-8", "replace"), add_special=False)
            t = guess[0] if guess and allowed[guess[0]] and want.startswith(tb[guess[0]]) else None
            if t is None:
                legal = allowed.nonzero()[0]
                if len(legal) > 4096:  # an open choice the text did not fit: not this form
                    return []
                fits = [
                    int(x)
                    for x in legal
                    if tb[x] and (want.startswith(tb[x]) or tb[x].startswith(want))
                ]
                if not fits:
                    return []
                t = max(fits, key=lambda x: min(len(tb[x]), len(want)))
            out.append(t)
            c.advance(t)
            want = want[len(tb[t]) :] if want.startswith(tb[t]) else b""
        return out

    def _complete(
        self,
        cache,
        P: int,
        prefix: list[int],
        alt: int,
        score: float,
        grammar,
        scored: int,
        branch: int,
    ) -> Candidate | None:
        """The goal from ``prefix`` + ``alt``, completed greedily under the grammar until the steps
        open; None when it ends first or runs past MAX_GOAL_TOKENS."""
        cache.crop(P + len(prefix))
        c = grammar.constraint()
        for t in prefix:
            c.advance(t)
        ids, text, eos = list(prefix), bytearray(), set(self.gtok.eos_ids)
        tb = self.gtok.token_bytes

        def push(t: int) -> bool:
            """Commit t; True once the steps open (the goal is whole)."""
            c.advance(t)
            ids.append(t)
            text.extend(tb[t] if t < len(tb) else b"")
            return STEPS_OPEN in text

        if push(alt):
            return Candidate(ids, score, scored, branch)
        feed = [alt]
        while len(ids) - len(prefix) < MAX_GOAL_TOKENS:
            # the grammar's forced tokens follow at no cost (log-probability 0 under the mask)
            for t in c.forced():
                feed.append(t)
                scored += 1
                if push(t):
                    return Candidate(ids, score, scored, branch)
            logits = self.model.forward(
                torch.tensor(feed, dtype=torch.long), cache, logits_rows="last"
            ).logits
            lp = _masked_logprobs(c, logits[-1:], [])[0]  # [V]
            t = int(torch.argmax(lp))
            if t in eos or not torch.isfinite(lp[t]):
                return None
            score += float(lp[t])
            scored += 1
            if push(t):
                return Candidate(ids, score, scored, branch)
            feed = [t]
        return None

    def choose(self, cands: list[Candidate], judge, score=None, ground=None, lacking=()) -> Choice:
        """judge(candidate) -> (tier, goal); the greedy candidate is cands[0]. ``score``
        (candidate) -> how it ranks among the reachable ones (default: its log-likelihood).

        ``ground`` (candidate) -> (net, said): how much of what the task names its goal is about
        (checks.grounding), or None where the task names nothing to hold goals to. With it, a
        goal is first what the task is about, then likely: a reachable goal replaces another
        only when it is about at least as much of the task; one about nothing the task names
        never replaces a goal; and an infeasible goal about more of the task than any reachable
        one is the task's own goal, so its refusal is chosen (the greedy goal's too).

        ``lacking``: goals that say a thing the task names in its own words is missing, each
        about that thing (``ground``). The likeliest of them is the task's refusal where it
        ranks above every reachable goal (about as much of the task, and likelier after it: its
        ``score``) and ``explain`` read the task back from it better than from any of them.
        With none in reach, the refusals above decide (a goal out of reach is about
        more of the task than words of it that name nothing here)."""
        score = score or (lambda c: c.logprob)
        for cand in cands:
            cand.tier, cand.goal = judge(cand)
            # kept for the plan's stats: why the choice went as it did
            cand.score = score(cand)
            cand.grounded = tuple(ground(cand)) if ground is not None else None
        greedy = cands[0]
        # one entry per distinct goal: the greedy one's own, else the likelier spelling
        seen: dict[str, Candidate] = {}
        for cand in cands:
            key, had = repr(cand.goal), seen.get(repr(cand.goal))
            if had is None or (had.branch is not None and cand.logprob > had.logprob):
                seen[key] = cand
        absent = [c for c in lacking if c.tier == INFEASIBLE]
        if absent:
            order = (lambda c: (ground(c)[0], score(c))) if ground is not None else score
            # the model's own choice of the thing's name (a longer run of the task's words is
            # always less likely without the task, so it would always rank higher)
            best = max(absent, key=lambda c: c.logprob)
            rival = max((c for c in seen.values() if c.tier == REACHABLE), key=order, default=None)
            # and the task's words must follow from it more than from every reachable goal read
            # back beside it: a run the task only mentions ("look for spider mites") reads back
            # worse than the goal the task asks for
            if rival is not None and order(best) > order(rival) and best.explained > 0:
                return Choice(best, cands, True, note="the task names a thing this world lacks")
        if ground is None:
            if greedy.tier == INFEASIBLE:
                return Choice(greedy, cands, False, note="refused from the goal alone: kept")
            return self._likeliest(greedy, list(seen.values()), score, cands)

        def key(c: Candidate) -> tuple[int, float]:
            return ground(c)[0], score(c)

        reached = [c for c in seen.values() if c.tier == REACHABLE and ground(c)[1] > 0]
        floor = max((ground(c)[0] for c in reached), default=None)
        refusals = [
            c
            for c in seen.values()
            if c.tier == INFEASIBLE
            and ground(c)[1] > 0
            and (floor is None or ground(c)[0] > floor)
            and c not in absent  # weighed above, against reachable goals only
        ]
        if greedy.tier == INFEASIBLE and not reached and greedy not in refusals:
            refusals.append(greedy)  # nothing that can be done is about the task: it stands
        refusal = max(refusals, key=key, default=None)
        if refusal is not None:
            if refusal is greedy:
                return Choice(greedy, cands, False, note="refused from the goal alone: kept")
            return Choice(refusal, cands, True, note="the task's own goal is infeasible")
        return self._likeliest(greedy, reached, key, cands)

    @staticmethod
    def _likeliest(greedy: Candidate, options: list[Candidate], key, cands) -> Choice:
        """The greedy goal, or the best reachable other option by ``key`` where the greedy goal
        is not reachable or ranks below it."""
        others = [c for c in options if c.tier == REACHABLE and c.goal != greedy.goal]
        best = max(others, key=key, default=None)
        if best is not None and (greedy.tier != REACHABLE or key(best) > key(greedy)):
            return Choice(
                best,
                cands,
                True,
                note={
                    REACHABLE: "likelier reachable goal",
                    UNREACHED: "the greedy goal is not reached; a reachable one is",
                    INFEASIBLE: "the greedy goal is infeasible; a reachable one is as grounded",
                }[greedy.tier],
            )
        return Choice(greedy, cands, False, note="greedy kept")


def goal_openings(skills, named: tuple[str, ...] = ()) -> tuple[str, ...]:
    """How a goal of each form the skills allow opens, for ``candidates``' ``forms``: a call of
    each skill that puts nothing anywhere (an end state says that itself), an order, a set, and
    an end state of each object in ``named`` (those the task names, in the order it names
    them: the model then says where it goes or what state it ends in) and its being held."""
    calls = [s.name for s in skills.skills if not any(c.kind in END_KINDS for c in s.effects)]
    holds = any(c.kind == "holding" for s in skills.skills for c in s.effects)
    named = named[:MAX_NAMED_FORMS]
    return (
        tuple(f'{{"do":"{n}"' for n in calls)
        + ('{"before":[', '{"every":')
        + tuple(f'{{"object":"{n}"' for n in named)
        + (tuple(f'{{"holding":"{n}"' for n in named) if holds else ())
    )


def named_goals(
    skills, objects: tuple[str, ...], places: tuple[str, ...], types: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """Whole one-line goals over the things a task names (``objects`` and ``places`` by name or
    alias, ``types`` of objects it names by type, each first named first), for ``candidates``'
    ``forms``: each object at each place, held, or in each state a skill makes; a call of each
    skill that takes just one thing; each type's objects at each place; everything at one place
    moved to another; the robot at each place; all the objects at one place. The model's
    likelihood and the task's grounding rank them; a goal the grammar refuses is left out."""
    objects, places = objects[:MAX_NAMED_FORMS], places[:MAX_NAMED_FORMS]
    kinds = {c.kind for s in skills.skills for c in s.effects}
    states = sorted({c.value for s in skills.skills for c in s.effects if c.kind == "is"})
    items: list[str] = []
    for o in objects:
        if "at" in kinds:
            items += [f'{{"object":"{o}","at":"{p}"}}' for p in places]
        if "holding" in kinds:
            items.append(f'{{"holding":"{o}"}}')
        items += [f'{{"object":"{o}","is":"{v}"}}' for v in states]
    for s in skills.skills:
        if len(s.args) == 1 and s.args[0].type in ("object", "place"):
            names = objects if s.args[0].type == "object" else places
            items += [f'{{"do":"{s.name}","args":{{"{s.args[0].name}":"{n}"}}}}' for n in names]
    if "at" in kinds:
        items += [f'{{"every":{{"type":"{t}"}},"at":"{p}"}}' for t in types[:2] for p in places]
        items += [
            f'{{"every":{{"at":"{a}"}},"at":"{b}"}}' for a in places for b in places if a != b
        ]
    if "robot_at" in kinds:
        items += [f'{{"robot_at":"{p}"}}' for p in places]
    goals = [item + "]" for item in items]
    if "at" in kinds and len(objects) > 1:
        goals += [",".join(f'{{"object":"{o}","at":"{p}"}}' for o in objects) + "]" for p in places]
    return tuple(goals)


# the most ordered goals weighed (``ordered_goals``), and the one-line goals per named thing
# each is made from
MAX_ORDERS, ORDER_OPTIONS = 6, 2


def ordered_goals(said, options: list[Candidate], score, world, skills) -> tuple[str, ...]:
    """Goals that do the task's things in the order it names them, in any language: for each
    thing it names (and each amount it says that a one-number call takes, ``wait``'s seconds),
    the best one-line goals about it among ``options`` (by ``score``), put in order of where the
    task names them: ``[{"before": [a, b, ...]}, last]`` (the last repeated where it is an end
    state, as a goal that ends in it says). Only what the task's words order; the model's
    likelihood ranks them against every other goal."""
    start = initial_state(world)
    where = {**said.typed, **said.named}
    slots: dict[int, list[tuple[float, dict]]] = {}
    for c in options:
        g = c.goal
        if not (isinstance(g, list) and len(g) == 1 and isinstance(g[0], dict)):
            continue
        if "before" in g[0] or "every" in g[0] or g[0].get("times", 1) != 1:
            continue
        parsed, problems = parse_goal({"goal": g}, world, skills)
        if parsed is None or problems or (not parsed.acts and reaches(parsed, start)):
            continue  # true before any step (the sheet "on the light box" it lies on): no step
        names: set[str] = set()
        names_in(g, world, names)
        at = [where[n] for n in names if n in where]
        if at:  # where the task last names what it is about: "bring it to the table" ends there
            slots.setdefault(max(at), []).append((score(c), g[0]))
    for a in said.amounts:
        # a call that takes just this number, in its unit (any, where no lexicon knows the
        # unit's word): "wait 5 s", "5 Sekunden warten"
        v = int(a.value) if float(a.value).is_integer() else a.value
        for sk in skills.skills:
            arg = sk.args[0] if len(sk.args) == 1 else None
            if (
                arg is None
                or arg.type not in ("number", "integer")
                or a.unit not in (None, arg.unit)
                or (arg.min is not None and v < arg.min)
                or (arg.max is not None and v > arg.max)
            ):
                continue
            slots.setdefault(a.at, []).append((0.0, {"do": sk.name, "args": {arg.name: v}}))
    if len(slots) < 2:
        return ()
    best = [
        [d for _, d in sorted(slots[k], key=lambda x: -x[0])[:ORDER_OPTIONS]] for k in sorted(slots)
    ]
    out: list[str] = []
    for pick in itertools.product(*best):
        items = [d for i, d in enumerate(pick) if d not in pick[:i]]
        if len(items) < 2:
            continue
        last = items[-1]
        text = json.dumps(
            [{"before": items}] + ([] if "do" in last else [last]), separators=(",", ":")
        )
        out.append(text[1:])  # after the goal's own bracket
        if len(out) == MAX_ORDERS:
            break
    return tuple(dict.fromkeys(out))


def end_states(goal, skills) -> list | None:
    """``goal`` with each call whose whole effect is an end state written as that end state
    (``{"do": "pick", "args": {"object": "phone"}}`` as ``{"holding": "phone"}``), or None
    where no item changes. Only a call that writes no argument its effects leave out (a drive's
    speed is asked of the drive, not of where it ends) and is made once."""
    if not isinstance(goal, list):
        return None
    out, changed = [], False
    for item in goal:
        skill = skills.get(item.get("do")) if isinstance(item, dict) else None
        args = item.get("args") if isinstance(item, dict) else None
        effects = [c for c in skill.effects if c.kind != "hand"] if skill is not None else []
        said = {r[1:] for c in effects for r, _ in c.refs() if r.startswith("$")}
        if (
            not effects
            or not isinstance(args, dict)
            or item.get("times", 1) != 1
            or set(item) - {"do", "args", "times"}
            or any(c.kind not in END_KINDS for c in effects)
            or set(args) != said
        ):
            out.append(item)
            continue

        def value(v):
            return args.get(v[1:]) if isinstance(v, str) and v.startswith("$") else v

        out += [{k: value(v) for k, v in c.to_dict().items()} for c in effects]
        changed = True
    return out if changed else None


def hinted(goal, hints: dict) -> int:
    """How many of a lexicon's hints (mentions.TaskWords.hints: forms, skills, states the task's
    phrases ask for) the goal's items take up."""
    if not isinstance(goal, list) or not hints:
        return 0
    forms, skills, states = set(), set(), set()

    def walk(items) -> None:
        for d in items:
            if not isinstance(d, dict):
                continue
            if "do" in d:
                skills.add(d["do"])
                if d.get("times", 1) != 1:
                    forms.add("times")
            if isinstance(d.get("before"), list):
                forms.add("before")
                walk(d["before"])
            if "every" in d:
                forms.add("every")
            if isinstance(d.get("is"), str):
                states.add(d["is"])

    walk(goal)
    return (
        len(forms & hints.get("forms", set()))
        + len(skills & hints.get("skills", set()))
        + len(states & hints.get("states", set()))
    )


def rank(cand: Candidate, hints: dict) -> float:
    """A reachable candidate's rank: how much likelier the task makes its goal (its score less
    its ``prior``), and ``HINT_NATS`` for each lexicon hint it takes up."""
    return cand.logprob - cand.prior + HINT_NATS * hinted(cand.goal, hints)
