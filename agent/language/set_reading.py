"""The set of things a task asks about, when its words say one (a goal's `every`): "tidy all the
tools onto the pegboard", "everything on the wheel onto the wedging bench", "clear the folding
bench - it all goes on the clean shelves", "whatever you can manage from the inward bay", "both
trays".

The members are never named one by one: they are picked from this world by what the words say
of them, in the three ways a selector can (goals.py):
- ``type``: a type of this world's objects said in the plural ("the tools", "both trays") or
  after a word of a set ("every linen pack");
- ``at``: where they rest at the start, a place that holds things and is said as where they
  come from ("from the inward bay"), as what is cleared ("clear the service bench") or right
  after a word of a set ("everything on the wheel");
- ``carriable``: "anything you can carry", "whatever you can manage".
A set is read only when its words say ``type`` or ``at`` and the task names no object of its
own (a set of named things, "both the red cup and the blue cup", is those things); the places
it mentions besides the source are where the members go.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from agent.language.amounts import _amount
from agent.files.loader import World
from agent.files.names import alias_words
from agent.language.wording import DETERMINERS, SET_WORDS, name_words, singular, word_before

# "both trays", "the lot": words of a set besides SET_WORDS
SET_CUES = SET_WORDS | {"both"}
THE_LOT = re.compile(r"\bthe\s+lot\b")
CARRIABLE = re.compile(r"\b(?:can|could|able\s+to)\s+(?:\w+ly\s+)?(?:manage|carry|lift|handle|pick\s+up|take|move)\b"
                       r"|\bcarriable\b")
# "you can": a verb after its subject, never a thing
SUBJECTS = frozenset({"you", "we", "i", "they", "he", "she", "it"})
# "clear the service bench", "empty the crate": the place the verb takes is where the set rests
CLEAR_VERBS = frozenset({"clear", "clearing", "empty", "emptying", "unload", "unloading", "strip"})
# "everything on the wheel", "all the stuff in the bay": a set word, then where it rests
RESTS = frozenset({"on", "in", "at", "from", "off", "upon", "inside"})


@dataclass(frozen=True)
class SetSaid:
    selector: tuple          # ((key, value), ...) of goals.SELECTORS
    to: tuple                # the places the members go to; () when the words say none
    takes: tuple = ()        # objects the reading referred to by the set's type word ("the clippers")

    def every(self) -> dict:
        return dict(self.selector)


def _cue(toks: list[str], text: str) -> bool:
    return bool(set(toks) & SET_CUES or THE_LOT.search(text))


def _plural_after_cue(toks: list[str], name: str) -> bool:
    """The name's last word said in the plural just after a word of a set ("both brick moulds")."""
    head = (name_words(name) or [""])[-1]
    return any(head in singular(t) and t != head and set(toks[max(0, i - 3):i]) & SET_CUES for i, t in enumerate(toks))


def _alias_kind(toks: list[str], world: World) -> set[str]:
    """Types said by a word that ends the aliases of every thing of that type, in the plural
    ("both tea tins": the sencha tin and the oolong tin are the caddies)."""
    out = set()
    kinds = {o.type for o in world.objects if o.type}
    for t in kinds:
        members = [o for o in world.objects if o.type == t]
        ends = set.intersection(*({alias_words(a)[-1] for a in o.aliases if alias_words(a)} for o in members))
        if len(members) > 1 and any(e in singular(w) and w != e for e in ends for w in toks):
            out.add(t)
    return out


def _counted(toks: list[str], world: World, types: list[str]) -> bool:
    """A type said in the plural right after the number of things of it here ("the two
    spanners", "all 3 vials"): all of them."""
    for t in types:
        head, n = (name_words(t) or [""])[-1], sum(o.type == t for o in world.objects)
        if n > 1 and any(head in singular(w) and w != head and _amount(toks, i - 1) == (float(n), i - 1)
                         for i, w in enumerate(toks) if i):
            return True
    return False


def _type_said(type_: str, toks: list[str]) -> bool:
    head = (name_words(type_) or [""])[-1]
    for i, t in enumerate(toks):
        if head not in singular(t) or (i and toks[i - 1] in SUBJECTS):     # "anything you can carry"
            continue
        if t != head or set(toks[max(0, i - 3):i]) & SET_CUES:
            return True
    return False


def _after(toks: list[str], i: int, leads: frozenset) -> bool:
    """The words before index ``i`` (past its articles) end with one of ``leads``."""
    return word_before(toks, i, DETERMINERS - SET_CUES) in leads


def set_said(text: str, toks: list[str], world: World, referred: tuple, places: tuple, at: dict,
             sources: frozenset) -> SetSaid | None:
    """-> the set the task asks about, or None when its words say none. ``places``: the places it
    mentions in task order, ``at``: where each is said in ``toks``."""
    low = text.lower()
    types = sorted({o.type for o in world.objects if o.type and _type_said(o.type, toks)} | _alias_kind(toks, world))
    if not (_cue(toks, low) or _counted(toks, world, types)):
        return None
    sel: dict = {}
    # "both sets of clippers", "all the candles": a type that several things here have, said with a
    # word of a set, is all of them, not the one thing whose name ends in it (its whole name unsaid)
    kin = {t: [o.name for o in world.objects if o.type == t] for t in types}
    takes = tuple(n for n in referred if any(n in ns and len(ns) > 1 for ns in kin.values())
                  and (not set(name_words(n)) <= {w for t in toks for w in singular(t)} or _plural_after_cue(toks, n)))
    if len(takes) < len(referred):
        return None
    if len(types) == 1:
        sel["type"] = types[0]
    homes = {o.at for o in world.objects if o.at}
    kind_words = {w for t in types for w in name_words(t)}
    # "all the tools on the bench go to the boot room"; in "put all the tools on the pegboard" the
    # place after the set is where they go: a place after a set word rests them only when another
    # place follows it
    later = {p: any(at.get(q, -1) > at[p] for q in places if q != p) for p in places if p in at}
    rests = [p for p in places if p in homes and p in at and (
        p in sources or _after(toks, at[p], CLEAR_VERBS)
        or (later[p] and _after(toks, at[p], RESTS) and set(toks[max(0, at[p] - 6):at[p]]) & SET_CUES)
        # "the candles on the curing rack ... all of them": the type, then where they rest
        or (later[p] and _after(toks, at[p], RESTS) and _rested(toks, at[p], kind_words)))]
    # "I need the pouring bench clear. Everything on it goes ...": the place said before
    on_it = [i for i in range(1, len(toks) - 1) if toks[i] in RESTS and toks[i + 1] in ("it", "them")
             and set(toks[max(0, i - 3):i]) & SET_CUES]
    if not rests and on_it:
        rests = [p for p in places if p in homes and at.get(p, len(toks)) < on_it[0]][-1:]
    if len(rests) == 1:
        sel["at"] = rests[0]
    if not sel:
        return None
    if CARRIABLE.search(low):
        sel["carriable"] = True
    return SetSaid(tuple(sorted(sel.items())), tuple(p for p in places if p not in rests), takes)


def _rested(toks: list[str], i: int, kind_words: set[str]) -> bool:
    """The word before the preposition before index ``i`` (past articles) is a word of the set's
    type ("the candles on the curing rack")."""
    j = i
    while j > 0 and toks[j - 1] in DETERMINERS:
        j -= 1
    return j > 1 and toks[j - 1] in RESTS and bool(singular(toks[j - 2]) & kind_words)
