"""What a task's words say about this world: one reading, used alike by the task-focused goal
schema (specialize.py) and the gate's grounding findings (grounding.py), so a plan decoded
under another schema is held to what the grammar would have asked.

It is a reading of words, not of meaning, and it errs on the side of saying nothing: each
field is empty when the words do not decide it, and an empty field restricts nothing.

- objects the task *mentions* (any word of a name, 3+ letters, or the type) and those it
  *refers to* (its whole name, or a head word or type that only this object has: "the
  paperback" is the mystery paperback when the world holds one paperback). English puts the
  head of a compound last, so "the patient" does not refer to the patient hoist;
- places it mentions the same way, and which of them are *sources* ("from the supply room",
  "out of the drop box", "off the wall shelf") rather than where things should end up;
- the conditions its verbs ask for ("open", "shut", "have a look", "keep it in your hand"),
  and whether it asks for a thing to be moved, the robot to go somewhere, or a look around.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .files import World

# The vocabulary's own verbs and their everyday synonyms. word -> (kind, state)
STATE_VERBS = {"open": ("is", "open"), "opened": ("is", "open"), "unlock": ("is", "open"),
               "close": ("is", "closed"), "closed": ("is", "closed"), "shut": ("is", "closed"),
               "inspect": ("is", "inspected"), "inspected": ("is", "inspected"), "examine": ("is", "inspected"),
               "look": ("is", "inspected"), "check": ("is", "inspected"), "scan": ("is", "inspected"),
               "sweep": ("is", "inspected"), "survey": ("is", "inspected"), "photograph": ("is", "inspected"),
               "pull": ("is", "open"),
               "hold": ("holding", None), "holding": ("holding", None)}
HOLD_PHRASE = re.compile(r"\bin\s+(?:your|the|its|my|a)?\s*(?:hand|hands|gripper|grip)\b"
                         r"|\b(?:hang|hold)\s+on\s+to\b|\bon\s+board\b")
# Where a clause about something else begins ("... so I can photograph them", "before I
# start on the frame", "until the ward's ready"): what follows is not asked for.
ASIDE = re.compile(r"\b(?:so|before|because|while|when|until|once|after|since)\s+"
                   r"(?:that|i|we|you|they|he|she|it|the|someone)\b")
# Words that ask for a thing to be moved.
CARRY_VERBS = frozenset({"put", "bring", "take", "carry", "fetch", "move", "place", "lift", "deliver",
                         "stow", "store", "set", "drop", "load", "hang", "pop", "leave", "file", "shelve"})
# Words that send the robot itself somewhere (matched as written: "the tin goes on the shelf"
# is not "go").
MOVE_VERBS = frozenset({"go", "head", "drive", "navigate", "return", "come", "travel", "dock", "charge",
                        "park", "visit", "roll"})
# "from the supply room", "out of the drop box", "off the wall shelf"; "drop it off at the
# desk" is not a source.
SOURCE_WORDS = (("from",), ("out", "of"), ("off",))
# "make your way to the lobby": somewhere to go, whatever the verb.
TOWARD_WORDS = (("to",), ("toward",), ("towards",))
# A head word alone refers to a thing only as a noun: after one of these ("set it aside" is
# not the audiobook set).
DETERMINERS = frozenset({"the", "this", "that", "these", "those", "a", "an", "my", "your", "our", "its",
                         "his", "her", "their", "each", "both"})


# Words that never name a thing a task could ask for (for `missing`).
FUNCTION_WORDS = frozenset("""the and but for with into onto from off out over under down back then than
this that these those there here some any each both all your our their its his her you him them
please could would should can will shall may might must need needs want wants like let make sure
get got have has had are was were been being not now just also too very quickly soon today
what which when where who why how while before after until once again away next up""".split())


def tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def singular(w: str) -> set[str]:
    """The word and its singular forms (plural ``s``/``es``/``ies``)."""
    out = {w}
    if w.endswith("ies") and len(w) > 4:
        out.add(w[:-3] + "y")
    elif w.endswith("es") and len(w) > 3:
        out.update((w[:-2], w[:-1]))
    elif w.endswith("s") and len(w) > 2:
        out.add(w[:-1])
    return out


def words(text: str) -> set[str]:
    """Lower-case alphanumeric words, each also in its singular form."""
    return {s for w in tokens(text) for s in singular(w)}


def name_words(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def _content(name: str) -> list[str]:
    """The words of a name that can stand for it (3+ letters, not a number)."""
    return [t for t in name_words(name) if len(t) >= 3 and not t.isdigit()]


def mentions(task_words: set[str], name: str, type_: str | None) -> bool:
    """The task refers to this object by some word of its name (3+ letters) or by its type."""
    return any(c in task_words for c in _content(name) + (name_words(type_) if type_ else []))


def names(task_words: set[str], name: str) -> bool:
    """The task names this thing in full: every word of its name appears."""
    return bool(_content(name)) and all(t in task_words for t in name_words(name))


def _unique_cues(cues: dict[str, set[str]]) -> dict[str, str]:
    """cue word -> the one name it belongs to (words shared by two names decide nothing)."""
    owners: dict[str, set[str]] = {}
    for name, cs in cues.items():
        for c in cs:
            owners.setdefault(c, set()).add(name)
    return {c: next(iter(n)) for c, n in owners.items() if len(n) == 1}


@dataclass(frozen=True)
class TaskReading:
    words: frozenset            # ``words`` of the task
    mentioned: tuple            # object names mentioned, world order
    referred: tuple             # object names referred to, task order
    places: tuple               # place names mentioned, task order
    sources: frozenset          # the mentioned places said as where things come from
    wanted: frozenset           # {(kind, state)} the verbs ask for
    carry: bool                 # asks for a thing to be moved
    move: bool                  # a verb sends the robot somewhere ("head", "drive", ...)
    toward: bool                # a place follows "to" ("make your way to the lobby")
    home: dict                  # object -> its place at the start (for destinations)
    # object -> the places said right after it, before the next referred object ("the jug in
    # the cage and the carton down the chute"): where that object goes
    paired: dict = field(default_factory=dict)
    # the places the robot should end at when a verb of going follows every referred object
    # ("..., then head back to the charger"); None when none does, () for anywhere
    go_to: tuple | None = None
    # What a `missing` condition may name: the task's words (and pairs of adjacent ones) that
    # are no name, type or verb of this world, in task order. The thing the world lacks is
    # among them when the task names it ("the newspaper", "a baguette").
    unknown: tuple = ()

    @property
    def only_missing(self) -> bool:
        """No object of this world is mentioned and the task is neither about the robot going
        somewhere nor about looking at a place: whatever it asks for is not here."""
        inspect = ("is", "inspected") in self.wanted
        return not self.mentioned and (self.carry or not (self.move or self.toward or inspect))

    @property
    def about_places(self) -> tuple:
        """The places a task about places alone (go there, look at it) is about; () otherwise.
        A word that only brushes an object ("before the next patient arrives") does not make
        it a task about that object; a thing to move ("bring the guitar round") does."""
        inspect = ("is", "inspected") in self.wanted
        if self.referred or self.only_missing or (self.mentioned and (self.carry or not (inspect or self.move))):
            return ()
        return self.destinations()

    def _own(self, obj: str | None) -> tuple:
        home = self.home.get(obj, "")
        return tuple(p for p in self.paired.get(obj, ()) if p not in self.sources and p != home)

    def destinations(self, obj: str | None = None) -> tuple:
        """Places the task wants things at: those said right after ``obj``, else all it
        mentions, less sources and where ``obj`` already is. () when that leaves none (then
        the words decide nothing)."""
        home = self.home.get(obj, "")
        return self._own(obj) or tuple(p for p in self.places if p not in self.sources and p != home)

    def verbs_for(self, obj: str) -> frozenset:
        """What the verbs ask of this object: not to be held when the task says where it goes
        ("keep the milk in the fridge"); to be there, when the task says where it goes and
        asks no state of it ("the jug goes in the cage")."""
        want = self.wanted - {("holding", None)} if self._own(obj) else self.wanted
        return want or (frozenset({("at", None)}) if self.destinations(obj) else frozenset())

    def also_at(self, obj: str) -> tuple:
        """Where a referred object that the verbs want in some state goes as well ("check the
        lens, then leave it on the desk"): the places said right after it, when the task asks
        for a thing to be moved; () otherwise."""
        return self._own(obj) if self.carry else ()


def _where(toks: list[str], name: str, cues: set[str]) -> int:
    """Index of the name in the task: its words in a row, else the first of ``cues`` (the
    words that made it count), else the end."""
    nw = name_words(name)
    for i in range(len(toks) - len(nw) + 1):
        if all(w in singular(t) for w, t in zip(nw, toks[i:i + len(nw)])):
            return i
    return _first(toks, sorted(cues))


def _first(toks: list[str], cue_words: list[str]) -> int:
    hits = [i for i, t in enumerate(toks) if singular(t) & set(cue_words)]
    return min(hits, default=len(toks))


def _as_noun(toks: list[str], cue: str, others: set[str] = frozenset()) -> bool:
    """Some occurrence of ``cue`` follows a determiner, with at most one word between, and
    that word is no word of another name ("the red mug" with a red cup and a blue mug
    refers to neither)."""
    return any(cue in singular(t) and DETERMINERS & set(toks[max(0, i - 2):i])
               and not {w for x in toks[max(0, i - 2):i] for w in singular(x)} & others
               for i, t in enumerate(toks))


def _after(toks: list[str], name: str, lead: tuple) -> bool:
    """Some occurrence of the name comes right after one of the ``lead`` word sequences (a
    determiner and one more word may sit between: "off the wall shelf")."""
    cue = set(name_words(name))
    for i, t in enumerate(toks):
        if singular(t) & cue and not (i and singular(toks[i - 1]) & cue):
            j = i
            while j > 0 and i - j < 2 and toks[j - 1] in DETERMINERS:
                j -= 1
            before = tuple(toks[max(0, j - 2):j])
            if any(before[len(before) - len(w):] == w for w in lead if len(before) >= len(w)):
                return True
    return False


def _head(name: str) -> set[str]:
    """The last word of a name that can stand for it ("paperback" of mystery_paperback)."""
    c = _content(name)
    return {c[-1]} if c else set()


def _unknown(toks: list[str], world: World) -> tuple:
    """TaskReading.unknown: words (and adjacent pairs) no name, type or verb of this world."""
    known = ({t for o in world.objects for t in name_words(o.name) + name_words(o.type or "")}
             | {t for p in world.places for t in name_words(p.name)}
             | set(STATE_VERBS) | CARRY_VERBS | MOVE_VERBS | FUNCTION_WORDS)
    odd = [t if len(t) >= 3 and not t.isdigit() and not singular(t) & known else None for t in toks]
    pairs = [x for i, t in enumerate(odd) if t
             for x in ([f"{t}_{odd[i + 1]}"] if i + 1 < len(odd) and odd[i + 1] else []) + [t]]
    return tuple(dict.fromkeys(pairs))


def _layout(toks: list[str], at: dict, objs: list[str], spots: list[str], taken: set[str]):
    """-> (paired, go_to) from where each referred object and place is said (``at``)."""
    last = max((at[n] for n in objs), default=len(toks))
    # a new action: "..., then go back", "and head to"; not "the bundle needs to go on the cart"
    goes = [i for i, t in enumerate(toks) if i > last and t in MOVE_VERBS - taken
            and {"then", "and"} & set(toks[max(0, i - 2):i])]
    ends = [at[n] for n in objs[1:]] + [goes[0] if goes else len(toks)]
    paired = {n: tuple(p for p in spots if at[n] < at[p] < e) for n, e in zip(objs, ends)}
    return paired, (tuple(p for p in spots if at[p] > goes[0]) if goes else None)


def read_task(task: str, world: World) -> TaskReading:
    """The reading; what the task asks for comes from its main clauses (before an aside),
    what it mentions from all of it."""
    aside = ASIDE.search(task.lower())
    whole = words(task)
    task = task[:aside.start()] if aside else task
    toks, tw = tokens(task), words(task)
    place_words = {t for p in world.places for t in name_words(p.name)}
    heads = _unique_cues({o.name: _head(o.name) | set(name_words(o.type or "")) for o in world.objects})
    pcues = _unique_cues({p.name: _head(p.name) for p in world.places})

    def others(name: str) -> set[str]:
        return {t for o in world.objects if o.name != name for t in _content(o.name)}

    ref = {o.name for o in world.objects if names(tw, o.name)}
    ref |= {heads[c] for c in tw & set(heads) if c not in place_words and _as_noun(toks, c, others(heads[c]))}
    obj_words = {t for n in ref for t in name_words(n)}
    places = {p.name for p in world.places if names(tw, p.name)}
    places |= {pcues[c] for c in tw & set(pcues) if c not in obj_words and _as_noun(toks, c)}
    taken = {t for n in ref | places for t in name_words(n)}
    verbs = {STATE_VERBS[w] for w in tw - taken if w in STATE_VERBS}
    if HOLD_PHRASE.search(task.lower()):
        verbs.add(("holding", None))
    at = {n: _where(toks, n, {c for c, o in heads.items() if o == n}) for n in ref}
    at |= {n: _where(toks, n, {c for c, o in pcues.items() if o == n}) for n in places}
    objs, spots = sorted(ref, key=lambda n: (at[n], n)), sorted(places, key=lambda n: (at[n], n))
    paired, go_to = _layout(toks, at, objs, spots, taken)
    return TaskReading(
        words=frozenset(tw), mentioned=tuple(o.name for o in world.objects if mentions(whole, o.name, o.type)),
        referred=tuple(objs), places=tuple(spots), paired=paired, go_to=go_to,
        sources=frozenset(p for p in places if _after(toks, p, SOURCE_WORDS)), wanted=frozenset(verbs),
        carry=bool((tw - taken) & CARRY_VERBS),
        move=bool((set(toks) - taken) & MOVE_VERBS), toward=any(_after(toks, p, TOWARD_WORDS) for p in places),
        home={o.name: o.at for o in world.objects if o.at}, unknown=_unknown(toks, world))
