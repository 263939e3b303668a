"""The things a task asks for in an order its words say (a goal's `before`): "check the print, then
lay it on the rack", "scan the vault, wait 30 seconds, and scan it again", "once you've shut the
cold cabinet, put the mould on the rack", "before you move the neck, have a look at it".

A task orders things when it has a word of order (ORDER_WORDS, a closed class) and two or more
clauses that each ask for one thing: a wait (a length of time and no other verb, or "wait"), a
look (check, scan, sweep, ...), a state (open, shut), a thing put somewhere, a thing picked up, a
turn by an angle (the call with no lasting effect that takes it: rotate, pour), the robot going
somewhere. A verb is read in any of its forms ("dropped", "shutting"); a word of a name the
clause says is no verb of it ("the goods lift" lifts nothing). "it", "them" and "there" stand for
what the clause before was about, and a clause that says no thing but "again" is about it too;
"twice" before a wait ("twice, a minute apart") is the thing, the wait, the thing again; a clause
that opens the task with "before you" comes after the one that follows it. Every clause with a
verb must be read, or nothing is: a guess is no order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from agent.language.amounts import angles, durations
from agent.symbolic.goals import MAX_ORDER
from agent.language.wording import (CARRY_VERBS, CLAUSE_WORDS, CLOSE_PHRASE, DESCRIBED, MOVE_VERBS, OPEN_PHRASE, ORDER_WORDS,
                      PUT_VERBS, STATE_VERBS, TOWARD_WORDS, TWICE, WAIT_WORDS, name_words, said_after, tokens,
                      verb_forms, word_before)


@dataclass(frozen=True)
class Event:
    """One thing a task that orders things asks for, in its place in the order (ordered_events):
    ``wait`` (value: seconds), ``look`` at ``subject`` (an object or a place), ``state``
    (``subject`` an object, value its state), ``at`` (``subject`` an object, value the place the
    clause says, or None: where the task says it goes), ``hold`` (``subject`` picked up),
    ``turn`` (value: degrees; ``subject`` what it turns over, or None) or ``go`` (value: the
    robot's place). ``words``: the clause's own words (an option it fixes: "with the lidar")."""
    kind: str
    subject: str | None = None
    value: object = None
    words: frozenset = frozenset()

    def end_key(self):
        """What this thing's condition is about, when it is one (a later one of the same key
        replaces it: "open it, ..., close it again"; "pick it up, ..., stand it in the booth");
        None for a wait, a look or a turn."""
        return {"state": ("is", self.subject), "at": ("at", self.subject), "hold": ("at", self.subject),
                "go": ("robot", None)}.get(self.kind)

    def text(self) -> str:
        v = self.value
        over = f" over {self.subject}" if self.subject else ""
        return {"wait": f"wait {v:g}" if isinstance(v, (int, float)) else "wait", "look": f"look at {self.subject}",
                "state": f"{self.subject} {v}", "at": f"{self.subject} at {v or 'its place'}",
                "hold": f"hold {self.subject}", "turn": f"turn {v:g}{over}" if isinstance(v, (int, float)) else f"turn{over}",
                "go": f"go to {v}"}[self.kind]


_LOOK = frozenset(w for w, v in STATE_VERBS.items() if v == ("is", "inspected"))
_STATE = {w: v[1] for w, v in STATE_VERBS.items() if v[0] == "is" and v[1] in ("open", "closed")}
_PUT = CARRY_VERBS | PUT_VERBS
_HOLD = frozenset({"pick", "grab"})
_TURN = frozenset({"turn", "rotate", "spin", "tip", "tilt", "pour"})
_POUR = frozenset({"pour", "tip"})
# "fill the mug from the jug": a pour whose source is said after "from"
_FILL = frozenset({"fill", "refill"})
_TOWARD = frozenset(w for (w,) in TOWARD_WORDS)
# "into the blending flask", "over the pad": what a pour goes into
_INTO = frozenset({"into", "over", "onto", "in", "on"})
_VERBS = _LOOK | set(_STATE) | _PUT | MOVE_VERBS | WAIT_WORDS | _HOLD | _TURN
# "once you've shut ...", "after you've dropped ...", "after that": where an earlier or next step begins
_STEP_OPENS = frozenset({"you", "we", "i", "the", "it", "that", "they"})


# "into the blending flask", "to your charger": the word that says what a place or thing is to
_ARTICLES = frozenset({"the", "a", "an", "my", "your", "our", "its", "their"})


def _word_before(toks: list[str], i: int) -> str:
    return word_before(toks, i, _ARTICLES, most=3)


def _clauses(text: str, toks: list[str]) -> list[tuple[int, int]]:
    """Where each clause of the task lies in ``toks`` (start, end): cut at , ; : . at "then",
    "finally", "afterwards", "before you ...", "once you ...", "after that" and at an "and" before
    a verb or one of those ("... and then pop it in the tray", "and close it again"; not "the
    tin and the tub")."""
    cuts = {0, len(toks)} | {len(tokens(text[:m.start()])) for m in re.finditer(r"[,;:.!?]", text)}
    for i, t in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        if t in CLAUSE_WORDS or (t == "before" and nxt == "you") or (t in ("once", "after") and nxt in _STEP_OPENS) \
                or (t == "and" and (nxt in _VERBS or nxt in ("then", "once", "after"))
                    and not (i and toks[i - 1] in ("go", "come"))):        # "go and dock": one going
            cuts.add(i)
    edges = sorted(cuts)
    return [(a, b) for a, b in zip(edges, edges[1:]) if a < b]


def ordered_events(text: str, toks: list[str], at: dict, objs: list[str], spots: list[str],
                   place_words: dict | None = None, object_words: dict | None = None) -> tuple:
    """The things the task asks for, in order, when it orders them (TaskReading.events); ().
    ``objs``, ``spots``: the objects the task refers to and the places it names, less where
    things come from; ``at``: where each is said in ``toks``; ``place_words``: each place's words,
    its aliases' too (an object's word inside a place said in the clause is the place's: "the
    first aid room" is no first aid bag); ``object_words``: each object's words, its aliases' too
    ("then the pot goes in the slop bowl": the clay teapot, also called the clay pot)."""
    times, turns = durations(toks), angles(toks)
    # "pour the ink into the cups" is a hold, then the pour; "go to the berth and wait there 45
    # seconds" waits after the going: an order with no word of one
    forms = {f for w in toks for f in verb_forms(w)}
    poured = bool(forms & _POUR) or bool(forms & _FILL and "from" in toks)
    if not (set(toks) & ORDER_WORDS or poured or ("there" in toks and times)):
        return ()
    out: list[list] = []           # [Event, twice, said before the clause it follows]
    in_place_names: set[str] = set()  # objects said only by words of a place's name
    stuff: set[str] = set()           # objects said only as what a pour pours
    last: dict[str, str | None] = {"thing": None, "place": None}
    for a, b in _clauses(text, toks):
        ct = toks[a:b]
        said_places = [p for p in spots if a <= at[p] < b]
        pw = {w for p in said_places for w in (place_words or {}).get(p, name_words(p))}
        named_here = {n: set((object_words or {}).get(n, name_words(n))) & set(ct) for n in objs}
        inside = {n for n, ws in named_here.items() if ws and ws <= pw and any(at[p] <= at[n] < at[p] + 3
                                                                                 for p in said_places)}
        in_place_names |= {n for n in inside if a <= at[n] < b}
        # a thing said again by another of its words ("pick up the shellac, ..., stand the flask ...")
        # (where it is said in this clause: "the feta's brine is low. Pour from the brine jug into
        # the feta tub": the jug and the tub of the pour are the second sentence's)
        here = {n: at[n] if a <= at[n] < b else next(i for i in range(a, b) if toks[i] in ws)
                for n, ws in named_here.items() if ws}
        said_objs = [n for n in objs if a <= at[n] < b and n not in inside] or sorted(
            [n for n, ws in named_here.items() if ws - pw], key=lambda n: (here[n], n))
        clause = DESCRIBED.sub(" ", " ".join(ct))
        states = [_STATE[w] for w in clause.split() if w in _STATE]
        states += ["open"] * bool(OPEN_PHRASE.search(clause)) + ["closed"] * bool(CLOSE_PHRASE.search(clause))
        # a verb in any of its forms; a word of a name the clause says is no verb of it
        cw = {f for w in ct for f in verb_forms(w)} - {w for n in said_objs + said_places for w in name_words(n)}
        look, put, go = bool(cw & _LOOK), bool(cw & _PUT), bool(cw & MOVE_VERBS) or "get back" in clause
        # "run over to the supervisor's desk": a place said after "to" with no thing to carry is
        # where the robot goes, whatever the verb
        go |= bool(said_places) and not said_objs and not put and any(
            said_after(ct, p, TOWARD_WORDS) or _word_before(toks, at[p]) in _TOWARD for p in said_places)
        secs = [s for i, s in times if a <= i < b]
        degs = [d for i, d in turns if a <= i < b]
        twice = any(ct[i:i + len(w)] == list(w) for w in TWICE for i in range(len(ct)))
        it = last["thing"] if cw & {"it", "them"} or (cw & {"again", "too", "another"} and not said_objs + said_places) else None
        # "then it can go on the rack": a verb of going said of a thing puts it there
        if go and not put and "you" not in cw and (said_objs or it) and said_places:
            go, put = False, True
        there = last["place"] if "there" in cw else None
        pre = ct[:2] == ["before", "you"] and b < len(toks)
        ev = None
        # "open the drawer, hold it open five seconds": a state kept for a time is a wait in it
        kept = bool(secs and states and out and out[-1][0].kind == "state" and out[-1][0].value == states[-1]
                    and (said_objs or [it])[0] == out[-1][0].subject)
        # "park at the site office for thirty seconds": there, then the wait
        stays = go and bool(said_places) and not said_objs and not put
        if secs and (cw & {"wait", "pause"} or kept or stays
                     or not (look or states or (put and said_objs) or (go and said_places))):
            if said_places and not said_objs:          # "wait 45 seconds at the vault door": there first
                out.append([Event("go", None, said_places[-1], frozenset(ct)), False, pre])
            out.append([Event("wait", value=secs[0], words=frozenset(ct)), False, pre])
            continue
        into = [n for n in said_objs if _word_before(toks, here.get(n, at[n])) in _INTO] if cw & _POUR else []
        fro = [n for n in said_objs if _word_before(toks, here.get(n, at[n])) == "from"]
        if cw & _FILL:
            into = [n for n in said_objs if n not in fro]
        # "pour the tea from the clay pot into the pitcher": what is poured is no thing to hold
        source = (fro or [n for n in said_objs if n not in into] or [None])[0]
        if into and fro:
            stuff |= {n for n in said_objs if n not in into and n not in fro}
        held = out[-1][0].subject if out and out[-1][0].kind == "hold" else None
        if into and not source and held:
            # "pick up the kettle and pour a splash into the teapot": the pour of what is held
            ev = Event("turn", into[0], degs[0] if degs else None, frozenset(ct))
        elif into and source:
            # "pour a splash of the alcohol into the blending flask (at thirty degrees)"
            out.append([Event("hold", source, None, frozenset(ct)), False, pre])
            last["thing"] = source
            ev = Event("turn", into[0], degs[0] if degs else None, frozenset(ct))
        elif degs and not look and not states:
            # "turn round 180 degrees", "tip it about thirty degrees over the pad"
            over = (said_objs or said_places or [None])[-1]
            ev = Event("turn", over, degs[0], frozenset(ct))
        elif look:
            # "have a look inside with the camera": the last thing
            subject = (said_objs or said_places or [it or there or last["thing"]])[0]
            ev = Event("look", subject, None, frozenset(ct)) if subject else None
        elif states:
            subject = (said_objs or [it if it in objs else None])[0]
            ev = Event("state", subject, states[-1], frozenset(ct)) if subject else None
        elif put:
            subject = (said_objs or [it if it in objs else None])[0]
            ev = Event("at", subject, (said_places or [there])[-1], frozenset(ct)) if subject else None
        elif cw & _HOLD and not said_places:
            subject = (said_objs or [it if it in objs else None])[0]
            ev = Event("hold", subject, None, frozenset(ct)) if subject else None
        elif go:
            place = (said_places or [there])[-1]
            ev = Event("go", None, place, frozenset(ct)) if place else None
        elif said_objs and said_places and not secs:
            # no verb the reading knows, a thing and a place: the thing there ("once the glue
            # pot's on the finishing bench", "then the foil packets to the cleaning bench")
            ev = Event("at", said_objs[0], said_places[-1], frozenset(ct))
        elif not secs:
            continue                # a clause that asks for nothing ("Top up time")
        if ev is None:
            return ()               # a verb the reading cannot follow: no order
        if ev.kind != "turn":
            last["thing"] = ev.subject or last["thing"]
        last["place"] = (ev.value if ev.kind in ("at", "go") else ev.subject if ev.subject in spots else None) or last["place"]
        out.append([ev, twice, pre])
        if twice and secs and cw & {"apart", "between"}:     # "scan it twice 30 seconds apart"
            out += [[Event("wait", value=secs[0], words=frozenset(ct)), False, False], [ev, False, False]]
            out[-3][1] = False
    # "pour the wax into the mould. Tip it (the jug) to about 45 degrees": the angle is the pour's
    for k in range(len(out) - 1, 0, -1):
        e, f = out[k - 1][0], out[k][0]
        held = out[k - 2][0].subject if k > 1 and out[k - 2][0].kind == "hold" else None
        if e.kind == f.kind == "turn" and e.value is None and f.subject in (None, held) and f.value is not None:
            out[k - 1][0] = Event("turn", e.subject, f.value, e.words | f.words)
            del out[k]
    # "before you move the neck, have a look at it": the look first
    for k in range(len(out) - 1):
        if out[k][2]:
            out[k], out[k + 1] = out[k + 1], out[k]
            out[k][2] = out[k + 1][2] = False
    events, k = [], 0
    while k < len(out):
        ev, twice, _ = out[k]
        events.append(ev)
        if twice and k + 1 < len(out) and out[k + 1][0].kind == "wait":
            events += [out[k + 1][0], ev]            # the thing, the wait, the thing again
            k += 1
        k += 1
    if not 2 <= len(events) <= MAX_ORDER:
        return ()
    # every thing and place the task speaks of is in the order, or the reading missed a part of it
    named = {e.subject for e in events} | {e.value for e in events if e.kind in ("at", "go")}
    if not (set(objs) - in_place_names - stuff) | set(spots) <= named:
        return ()
    return tuple(events)
