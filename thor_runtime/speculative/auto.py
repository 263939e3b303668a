"""``--spec auto``: per request, the proposer and the number of drafts per cycle that maximise
the expected tokens per unit of time, from the verify cost curve (cost.py) and the acceptance
each proposer has shown on each prompt class (constrained plans, free text) in this process.

A proposer's drafts are accepted at position j with probability a_j, given the earlier ones
were (its running acceptance per position). Verifying K drafts behind f grammar-forced tokens
then commits, in expectation,

    E[K] = 1 + f + o * sum_{k=1..K} prod_{j<=k} a_j

tokens, o being how often the proposer has a draft at all (lookup finds no match on many
cycles), and costs, in 1-row steps, with c the cost curve,

    T[K] = o * c(1 + f + K) + (1 - o) * c(1 + f) + d + w + r      (K >= 1)
    T[0] = c(1 + f) + w + r

d is the proposer's drafting time per cycle it is asked, w its upkeep per cycle (the drafter's
window), r what every cycle of the class spends besides these and its verify (the grammar's
masks, choosing and committing the tokens), all measured as they run. Leaving r out made every
cycle look cheaper than it is and longer blocks less worth their rows: on the planner model
(Zen 5) auto verified ~10 drafts a cycle where 15 commit more per second. Each cycle verifies the K
with the largest E[K] / T[K] (``CostBudget``, which takes the draft budget's place under auto);
K = 0 pauses the proposer, with probes on the draft budget's schedule (``budget.probe_due``) so that
a paused proposer can show it is right again. Acceptance is kept apart after a cycle that accepted
nothing (cold) and one that accepted drafts (hot): lookup that is copying a span keeps being right.
A request's rate weighs the two by the share of hot cycles their K lead to (``Arm.hot_share``).

Each request runs the candidate of its class with the largest expected rate; plain decoding is
a candidate (rate 1 / c(1 + f)), and every other one is probed 4, 12, 28 and 60 requests after
it was last the best, then every 32 (``request_probe_due``), so no proposer is dropped for good
on a few bad requests. A probe request drafts on every cycle: it is there to measure.
A fallback candidate (lookup beside a drafter on plans) runs only where the others fall behind
plain decoding, and is not probed.
A plan's verify often computes only the logits its rows may commit (cost.py's ``by_id``
curve): each class weighs the two curves by the share of its verify rows that did.

Drafts never decide which token is committed: all of this changes speed, never output.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from thor_runtime.speculative.budget import Cycle, probe_due
from thor_runtime.speculative.cost import CostCurve

CLASSES = ("constrained", "free")
# Prior per-position acceptance of a drafter-based proposer. On plans: the shipped drafters'
# first positions accept 0.7-0.9 on held-out requests, and with lookup they commit 5.8-6.7
# tokens per 15-draft cycle (docs/calibration.md); auto only takes a drafter trained for this
# target, and the prior fades as the request's own cycles come in. On free text the
# planner drafter is off its distribution and accepts almost nothing (docs/performance.md).
DRAFTER_PRIOR = {"constrained": 0.9, "free": 0.3}
DRAFTER_COST_PRIOR = 0.25  # its forward per cycle, in 1-row steps, until measured
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each position's prior
DECAY = 1 - 1 / 64  # older observations fade: about the last 64 count per position
EWMA = 0.1  # weight of the newest cycle in the running costs and rates
# ... and in the share that describes the text (how often the proposer has a draft): it differs
# between requests far more than costs do, and at 0.1 it held the last ~10 cycles of one
# request, which is what the next request was judged on
SHARE_EWMA = 1 / 64
LOW_K = 2  # drafts per probing cycle
PROBE_EVERY, PROBE_GAP = 4, 32  # cycles (within a request) or requests (between them)


@dataclass
class _Track:
    """Acceptance per draft position (decayed counts) and how often a draft came, in one context."""

    sums: list[float]
    counts: list[float]
    offer: float = 1.0

    def rates(self, prior: float) -> list[float]:
        """a_j: each position's data, shrunk toward the position before it (the first toward
        the prior), so positions never verified yet inherit what the earlier ones show."""
        out, above = [], prior
        for s, n in zip(self.sums, self.counts):
            above = (s + PRIOR_WEIGHT * above) / (n + PRIOR_WEIGHT)
            out.append(above)
        return out


class Arm:
    """One candidate of one class: a proposer (None: plain decoding), its K, what it has shown."""

    def __init__(
        self,
        name: str,
        proposer,
        kmax: int,
        prior: float = 0.0,
        draft_cost: float = 0.0,
        fallback: bool = False,
    ):
        self.name, self.proposer, self.kmax, self.prior = (
            name,
            proposer,
            kmax if proposer else 0,
            prior,
        )
        # a fallback runs only where every other proposer of its class falls behind plain
        # decoding, and is never probed otherwise (with_cost_policy says why)
        self.fallback = fallback
        self.tracks = tuple(
            _Track([0.0] * self.kmax, [0.0] * self.kmax) for _ in range(2)
        )  # cold, hot
        self.draft = draft_cost  # steps per cycle it is asked to draft
        self.keep = 0.0  # steps per cycle (commit: the drafter's window)
        self.since_best = 0  # requests of its class since it was last the best
        self.owed = False  # a probe came due and has not run yet (one probe per request)

    def accepted(self, hot: int, kmax: int) -> list[float]:
        """[kmax]: entry K - 1 is the drafts a K-draft cycle is expected to have accepted,
        sum_{k<=K} prod_{j<=k} a_j, for K = 1 .. kmax (given a draft comes at all)."""
        out, run = [], 1.0
        for a in self.tracks[hot].rates(self.prior)[:kmax]:
            run *= a
            out.append(run + (out[-1] if out else 0.0))
        return out

    def best_k(
        self, curve: CostCurve, kmax: int, hot: int, forced: float, rest: float = 0.0
    ) -> tuple[int, float, float]:
        """-> (K, E[K], T[K]) with the largest E / T, K <= kmax (the module doc's formulas)."""
        base = curve(1 + forced)
        best = (0, 1 + forced, base + self.keep + rest)
        if self.proposer is None:
            return best
        t = self.tracks[hot]
        for K, total in enumerate(self.accepted(hot, kmax), start=1):
            e = 1 + forced + t.offer * total
            cost = (
                t.offer * curve(1 + forced + K)
                + (1 - t.offer) * base
                + self.draft
                + self.keep
                + rest
            )
            if e * best[2] > best[1] * cost:
                best = (K, e, cost)
        return best

    def rate(self, curve: CostCurve, forced: float, rest: float = 0.0) -> float:
        """Expected tokens per step over a request: cold and hot cycles, each at its best K, in
        the shares those K lead to (``hot_share``)."""
        k0, e0, t0 = self.best_k(curve, self.kmax, 0, forced, rest)
        k1, e1, t1 = self.best_k(curve, self.kmax, 1, forced, rest)
        h = self.hot_share(k0, k1) if self.proposer is not None else 0.0
        return ((1 - h) * e0 + h * e1) / ((1 - h) * t0 + h * t1)

    def hot_share(self, k0: int, k1: int) -> float:
        """The share of hot cycles when cold ones verify k0 drafts and hot ones k1: a cycle turns
        hot when a draft comes and its first is accepted, so a proposer paused when cold (k0 = 0)
        turns hot only on the pause's probe cycles (budget.probe_due: one in PROBE_GAP at
        length). Measured as it ran instead, the share counted the cycles of probe requests too,
        which draft on every cycle: on chat a probe of the combination showed it hot a quarter
        of the time and level with lookup, the next request ran it as the best, paused and cold
        nearly throughout, at 0.77x lookup (docs/speculative-decoding.md)."""

        def turns_hot(track: _Track) -> float:
            return track.offer * track.rates(self.prior)[0] if self.kmax else 0.0

        cold, hot = self.tracks
        up = turns_hot(cold) * (1.0 if k0 else 1 / PROBE_GAP)
        stay = turns_hot(hot) if k1 else 0.0
        return up / (up + 1 - stay) if up > 0 else 0.0

    def observe(self, hot: int, drafted: int, accepted: int) -> None:
        """A verified cycle: positions 1..accepted were accepted, the next one (if drafted) not."""
        t = self.tracks[hot]
        for j in range(min(drafted, accepted + 1, self.kmax)):
            t.sums[j] = DECAY * t.sums[j] + (j < accepted)
            t.counts[j] = DECAY * t.counts[j] + 1


@dataclass
class _Class:
    name: str
    arms: list[Arm]
    forced: float = 0.0  # grammar-forced tokens per cycle, running mean
    by_id: float = 0.0  # share of its verify rows that read only some logits, running mean
    shared_rate: float = (
        0.0  # tokens per 1-row step of a whole shared round, running mean (0: none yet)
    )
    rest: float = 0.0  # steps a cycle spends besides its verify, drafting and upkeep, running mean

    def curve(self, curve: CostCurve) -> CostCurve:
        """What this class's verifies cost: ``curve``'s two kinds, weighed by how it verifies."""
        return curve.mixed(self.by_id)


class AutoPolicy:
    """The candidates of each class and what they have shown, shared by the requests of a
    process (one Speculation). ``pick`` chooses for one request."""

    def __init__(self, constrained: list[Arm], free: list[Arm]):
        self.classes = {
            "constrained": _Class("constrained", constrained),
            "free": _Class("free", free),
        }
        self.step_s = 0.0  # seconds of a 1-row step now (running: the machine's load moves it)

    @property
    def rows(self) -> int:
        """The widest verify a candidate may ask for: the cost curve's reach."""
        return 1 + max(a.kmax for c in self.classes.values() for a in c.arms)

    def choice(self, constrained: bool, curve: CostCurve) -> Arm:
        """The best candidate of the class now (no probing, no state change); on a tie plain
        decoding, which has no probes to pay for."""
        c = self.classes[CLASSES[0] if constrained else CLASSES[1]]
        curve = c.curve(curve)

        def score(a: Arm) -> tuple[float, bool]:
            return a.rate(curve, c.forced, c.rest), a.proposer is None

        best = max((a for a in c.arms if not a.fallback), key=score)
        # plain decoding leads: a fallback may still beat it
        return max(c.arms, key=score) if best.proposer is None else best

    def pick(self, constrained: bool, curve: CostCurve, spec):
        """The Speculation one request runs: ``spec`` with the chosen proposer, its K and a
        CostBudget; the best candidate, or one due for a probe."""
        c = self.classes[CLASSES[0] if constrained else CLASSES[1]]
        best = self.choice(constrained, curve)
        for a in c.arms:
            a.since_best = 0 if a is best else a.since_best + 1
            a.owed = (
                a is not best
                and a.proposer is not None
                and not a.fallback
                and (a.owed or request_probe_due(a.since_best))
            )
        arm = next((a for a in c.arms if a.owed), best)
        arm.owed = False
        return replace(
            spec,
            proposer=arm.proposer,
            k=arm.kmax,
            budget=CostBudget(self, c, arm, curve, arm is not best),
            free_text=None,
            auto=None,
        )

    def observe_step(self, verify_s: float, steps: float) -> None:
        """A verify took ``verify_s`` seconds where the curve says ``steps`` 1-row steps."""
        if verify_s > 0:
            s = verify_s / steps
            self.step_s = s if self.step_s <= 0 else (1 - EWMA) * self.step_s + EWMA * s


def request_probe_due(since: int) -> bool:
    """Whether a candidate that has not been the best for ``since`` requests is probed now:
    after 4, then 8, 16 and 32 more, then every 32. Each probe that fails to make it the best
    doubles the wait, so a poor candidate costs few requests early on (chat: two probes in nine
    requests took the median to 0.92x lookup), and none is dropped for good."""
    due, gap = PROBE_EVERY, PROBE_EVERY
    while due < since:
        gap = min(2 * gap, PROBE_GAP)
        due += gap
    return due == since


@dataclass
class _Request:
    """One request's state in the loop: the context (hot after an accepting cycle), paused
    cycles in a row (probes that failed included), this cycle's K and whether it is a probe,
    and the K chosen per drafting cycle (the stats)."""

    hot: int = 0
    paused: int = 0
    cap: int = 0
    probing: bool = False
    ks: Counter = field(default_factory=Counter)


class CostBudget:
    """The draft budget of one auto request: K per cycle from the cost curve (module doc)."""

    def __init__(
        self, policy: AutoPolicy, cls: _Class, arm: Arm, curve: CostCurve, probe: bool = False
    ):
        self.policy, self.cls, self.arm, self.curve, self.probe = policy, cls, arm, curve, probe
        if policy.step_s <= 0 and curve.step_s > 0:
            policy.step_s = curve.step_s

    def start(self) -> _Request:
        return _Request()

    def cap(self, k: int, state: _Request, forced: int = 0) -> int:
        """Proposer drafts to verify next (behind ``forced`` grammar-forced tokens). Records it
        in ``state`` for ``update``."""
        K = 0
        if self.arm.proposer is not None and k > 0:
            K = self.arm.best_k(
                self.cls.curve(self.curve), min(k, self.arm.kmax), state.hot, forced, self.cls.rest
            )[0]
            if self.probe:
                # A probe request is there to measure its proposer: it drafts every cycle. Paused
                # on its prior it saw a handful of cycles, and one lucky one made the next
                # request run it as the best (chat: 0.6x lookup for that request).
                K = max(K, min(k, LOW_K))
            elif K == 0 and probe_due(state.paused, PROBE_EVERY, PROBE_GAP):
                K = min(k, LOW_K)
                state.probing = True
        state.cap = K
        return K

    def cap_shared(self, k: int, state: _Request, forced: int, members: int) -> int:
        """Drafts to verify in a round shared with ``members - 1`` other sequences (inflight.py).
        There every row is time all members wait for, so a draft is worth its row when the
        tokens it is expected to add beat what the round would commit in that time: with R the
        round's rows without drafts (each member's anchor and forced tokens) and c the curve,
        K drafts cost c(R + K) - c(R) steps, and the K kept maximises
        sum_{j<=K} o * prod_{i<=j} a_i  -  rate * (o * (c(R + K) - c(R)) + d).
        The rate is measured (tokens all members committed per step of a round's whole cycle:
        the members' own work between forwards counts, and more tokens per round spread it);
        R / c(R) until a shared round has run. Few drafts where rows are dear (a CPU's
        compute-bound verify), many where a forward costs the same whatever its rows (a GPU).
        Records it in ``state``."""
        arm, best = self.arm, 0
        if arm.proposer is not None and k > 0:
            curve = self.cls.curve(self.curve)
            rows = (
                1 + forced + (members - 1) * (1 + self.cls.forced)
            )  # the others': their running mean
            rate, base = self.cls.shared_rate or rows / curve(rows), curve(rows)
            offer, top = arm.tracks[state.hot].offer, 0.0
            for K, total in enumerate(arm.accepted(state.hot, min(k, arm.kmax)), start=1):
                net = offer * total - rate * (offer * (curve(rows + K) - base) + arm.draft)
                if net > top:
                    best, top = K, net
        state.cap = best
        return best

    def update(
        self, state: _Request, drafted: int, accepted: int, cycle: Cycle | None = None
    ) -> _Request:
        """After a cycle: the proposer drafted ``drafted`` tokens (grammar-forced ones not
        counted), ``accepted`` of them kept; ``cycle`` has what it cost."""
        cycle = cycle or Cycle()
        arm, pol = self.arm, self.policy
        if cycle.members > 1:  # its verify waited for the round: not a verify of its rows alone
            if pol.step_s > 0 and cycle.cycle_s > 0:
                r = cycle.committed * cycle.members / (cycle.cycle_s / pol.step_s)
                self.cls.shared_rate = (
                    r if not self.cls.shared_rate else (1 - EWMA) * self.cls.shared_rate + EWMA * r
                )
        else:
            pol.observe_step(cycle.verify_s, self.curve.mixed(float(cycle.by_id))(cycle.rows))
            if pol.step_s > 0 and cycle.cycle_s > 0:
                r = (
                    max(cycle.cycle_s - cycle.verify_s - cycle.draft_s - cycle.keep_s, 0.0)
                    / pol.step_s
                )
                self.cls.rest = (1 - EWMA) * self.cls.rest + EWMA * r
        self.cls.forced = (1 - EWMA) * self.cls.forced + EWMA * cycle.forced
        self.cls.by_id = (1 - EWMA) * self.cls.by_id + EWMA * cycle.by_id
        if arm.proposer is not None:
            step = pol.step_s or 1.0
            if state.cap:
                t = arm.tracks[state.hot]
                t.offer = (1 - SHARE_EWMA) * t.offer + SHARE_EWMA * (drafted > 0)
                arm.draft = (1 - EWMA) * arm.draft + EWMA * cycle.draft_s / step
                if drafted:
                    arm.observe(state.hot, drafted, accepted)
            arm.keep = (1 - EWMA) * arm.keep + EWMA * cycle.keep_s / step
        if state.cap:
            state.ks[state.cap] += 1
        # a failed probe keeps the pause going, so the next probe waits twice as long
        state.paused = state.paused + 1 if not state.cap or (state.probing and not accepted) else 0
        state.hot, state.probing = int(accepted > 0), False
        return state

    def report(self, state: _Request) -> dict:
        """auto's choice for the stats: the class, the proposer, the K it verified most often."""
        k = state.ks.most_common(1)[0][0] if state.ks else 0
        return {
            "class": self.cls.name,
            "proposer": self.arm.name,
            "k": k,
            "k_max": self.arm.kmax,
            "probe": self.probe,
            "cost_curve": self.curve.source,
        }


def with_cost_policy(spec, opts):
    """``spec``, auto's proposers as build_speculation chose them (the drafter-based one where a
    drafter fits, else lookup; lookup for free text), with the policy choosing
    among them and plain decoding per request. The named draft budget gives way to CostBudget."""
    from thor_runtime.speculative.ngram import NgramConfig, NgramProposer

    main, free = spec.proposer, spec.free_text
    rho = opts.lookup_rate
    if main is not None and main.tap_layers:
        # Plans: lookup alone is only the drafter's fallback. The drafter's arm is the
        # combination (combined.py), which verifies lookup's chain on the cycles lookup expects
        # more from, so the two differ by the drafter's forward (~0.1 of a cycle): closer than
        # a few requests tell apart. As rivals, auto kept choosing lookup where they tied and
        # then paid probes of the combination (0.96x the best on evaluation set 1; 0.98-1.00x with
        # lookup as the fallback, docs/speculative-decoding.md). Lookup still takes over where
        # the drafter's confident misses would hold it back. Free text: the planner drafter is
        # off its distribution there, so lookup is a full candidate.
        lookup = NgramProposer(NgramConfig(opts.ngram_min, opts.ngram_max, opts.ngram_k))
        constrained = [
            Arm(main.name, main, spec.k, DRAFTER_PRIOR["constrained"], DRAFTER_COST_PRIOR),
            Arm(lookup.name, lookup, opts.ngram_k, rho, fallback=True),
        ]
        loose = [
            Arm(free.proposer.name, free.proposer, free.k, rho),
            Arm(main.name, main, spec.k, DRAFTER_PRIOR["free"], DRAFTER_COST_PRIOR),
        ]
    else:
        constrained = [Arm(main.name, main, spec.k, rho)] if main is not None else []
        loose = [Arm(free.proposer.name, free.proposer, free.k, rho)] if free is not None else []
    policy = AutoPolicy(constrained + [Arm("none", None, 0)], loose + [Arm("none", None, 0)])
    return replace(
        spec,
        budget=None,
        free_text=replace(free, budget=None) if free is not None else None,
        auto=policy,
    )
