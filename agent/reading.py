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
from itertools import pairwise
from dataclasses import dataclass, field

from .files import World, alias_words

# The vocabulary's own verbs and their everyday synonyms. word -> (kind, state)
STATE_VERBS = {"open": ("is", "open"), "opened": ("is", "open"), "unlock": ("is", "open"),
               "close": ("is", "closed"), "closed": ("is", "closed"), "shut": ("is", "closed"),
               "inspect": ("is", "inspected"), "inspected": ("is", "inspected"), "examine": ("is", "inspected"),
               "look": ("is", "inspected"), "check": ("is", "inspected"), "scan": ("is", "inspected"),
               "sweep": ("is", "inspected"), "survey": ("is", "inspected"), "photograph": ("is", "inspected"),
               "pull": ("is", "open"), "raise": ("is", "open"),
               "hold": ("holding", None), "holding": ("holding", None)}
# "push it in", "slide the drawer shut": closing said with a verb of motion
CLOSE_PHRASE = re.compile(r"\b(?:push|shove|slide|tuck)(?:es|ed|s)?\s+(?:\w+\s+){0,3}?(?:in|shut|closed)\b")
# "lift the lid on the ultrasonic", "flip up the cover": a lid raised is open
OPEN_PHRASE = re.compile(r"\b(?:lift|flip|prop)\w*\s+(?:up\s+)?(?:\w+\s+){0,2}?(?:lid|cover|hatch|flap)s?\b")
HOLD_PHRASE = re.compile(r"\bin\s+(?:your|the|its|my|a)?\s*(?:hand|hands|gripper|grip)\b"
                         r"|\b(?:hang|hold)\s+on\s+to\b|\bon\s+board\b")
# Where a clause about something else begins ("... so I can photograph them", "before I
# start on the frame", "until the ward's ready"): what follows is not asked for.
ASIDE = re.compile(r"\b(?:so|before|because|while|when|until|once|after|since)\s+"
                   r"(?:that|i|we|you|they|he|she|it|the|someone)\b"
                   # the speaker's own next step: ", I want to check the fluid level"
                   r"|[,;]\s*(?:i|we)(?:\s+(?:want|need|have)|'m\s+going|\s+am\s+going|'re\s+going)\s+to\s+(?!you\b)")
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


# A place's word said as a verb on a thing ("quarantine it") sends the thing there.
PRONOUNS = frozenset({"it", "them", "this", "that", "these", "those"})
# Where a place's own word may follow and still be a place ("with customs", "to consult 1").
PREPOSITIONS = frozenset({"to", "at", "in", "into", "on", "onto", "by", "with", "near", "from", "for", "toward",
                          "towards", "round", "through"})


# Words that never name a thing a task could ask for (for `missing`).
FUNCTION_WORDS = frozenset("""the and but for with into onto from off out over under down back then than
this that these those there here some any each both all your our their its his her you him them
please could would should can will shall may might must need needs want wants like let make sure
get got have has had are was were been being not now just also too very quickly soon today
what which when where who why how while before after until once again away next up""".split())


def tokens(text: str) -> list[str]:
    """Lower-case words; a hyphen inside a word joins it ("X-ray" is "xray", as names write it)."""
    return re.findall(r"[a-z0-9]+", re.sub(r"(?<=[a-z])-(?=[a-z])", "", text.lower()))


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
    # What a verb of carrying takes that is no word of this world ("put a sunflower in with the
    # roses"): the thing the task asks for is not here, whatever else it mentions.
    lacking: tuple = ()

    @property
    def only_missing(self) -> bool:
        """The task asks to carry a thing this world lacks, or mentions no object of this world
        and is neither about the robot going somewhere nor about looking at a place: whatever it
        asks for is not here."""
        inspect = ("is", "inspected") in self.wanted
        return bool(self.lacking) or (not self.mentioned and (self.carry or not (self.move or self.toward or inspect)))

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
        mentions, less sources, where ``obj`` already is and where the robot goes at the end.
        () when that leaves none (then the words decide nothing)."""
        home, end = self.home.get(obj, ""), self.go_to or ()
        return self._own(obj) or tuple(p for p in self.places if p not in self.sources and p != home and p not in end)

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


def _after(toks: list[str], name: str, lead: tuple, also: tuple = ()) -> bool:
    """Some occurrence of the name (or one said at an index in ``also``: an alias) comes right
    after one of the ``lead`` word sequences (a determiner and one more word may sit between:
    "off the wall shelf")."""
    cue = set(name_words(name))
    starts = [i for i, t in enumerate(toks) if singular(t) & cue and not (i and singular(toks[i - 1]) & cue)]
    for i in starts + list(also):
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


def _known(world: World) -> set[str]:
    """Words that are a name, type or alias of this world, or a word of the vocabulary."""
    return ({t for o in world.objects for t in name_words(o.name) + name_words(o.type or "")}
            | {t for thing in world.objects + world.places for a in thing.aliases for t in alias_words(a)}
            | {t for p in world.places for t in name_words(p.name)}
            | set(STATE_VERBS) | CARRY_VERBS | MOVE_VERBS | FUNCTION_WORDS)


def _unknown(toks: list[str], known: set[str]) -> tuple:
    """TaskReading.unknown: words (and adjacent pairs) no name, type or verb of this world."""
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
    return paired, (tuple(p for p in spots if at[p] >= goes[0]) if goes else None)


def _said(toks: list[str], phrase: list[str]) -> int | None:
    """Index where the words of ``phrase`` (an alias) are said in a row, else None."""
    for i in range(len(toks) - len(phrase) + 1):
        if phrase and all(w in singular(t) for w, t in zip(phrase, toks[i:i + len(phrase)])):
            return i
    return None


def _noun_end(toks: list[str], cue: str, name: str, vocab: set[str], leads: frozenset) -> int | None:
    """Index where a word of ``name`` that is not its head is said as a whole noun: after one of
    ``leads`` (one word may sit between) and not followed by another word of a name or a
    number that is not the name's ("the guitar with customs", "to consult 1"; not "the
    guitar case", "consult 2")."""
    own = set(name_words(name))
    for i, t in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        between = {w for x in toks[max(0, i - 1):i] if x not in leads for w in singular(x)}
        if (cue in singular(t) and leads & set(toks[max(0, i - 2):i]) and not between & vocab
                and not (nxt and (singular(nxt) & vocab - own or (nxt.isdigit() and nxt not in own)))):
            return i
    return None


def _numbered(toks: list[str], names_: list[str]) -> dict[str, int]:
    """name -> where a word of it is said right before its number, when that pair is no other
    name's ("consult 2" is consult_room_2 beside consult_room_1)."""
    cues = _unique_cues({n: {f"{w} {d}" for w in _content(n) for d in name_words(n) if d.isdigit()}
                         for n in names_})
    return {cues[f"{w} {d}"]: i for i, (t, d) in enumerate(pairwise(toks))
            for w in singular(t) if f"{w} {d}" in cues}


def _verb_place(toks: list[str], cue: str) -> int | None:
    """Index where a place's word is said as a verb: on a thing ("quarantine it") or as the
    robot's own going ("go and dock", "then charge")."""
    for i, t in enumerate(toks):
        if t != cue:
            continue
        if i + 1 < len(toks) and toks[i + 1] in PRONOUNS:
            return i
        if cue in MOVE_VERBS and {"and", "then", "to", "please"} & set(toks[max(0, i - 1):i]):
            return i
    return None


def _lacking(toks: list[str], known: set[str]) -> tuple:
    """What a verb of carrying takes when none of its words is a word of this world: the words
    after the verb (and an article), up to the next short or function word."""
    stop = FUNCTION_WORDS | PREPOSITIONS | PRONOUNS | {"me", "us", "of", "everything", "something", "anything",
                                                       "one", "ones", "stuff", "things", "thing", "lot"}
    for i, t in enumerate(toks):
        if t not in CARRY_VERBS:
            continue
        j = i + 1 + (i + 1 < len(toks) and toks[i + 1] in {"me", "us"})
        j += j < len(toks) and toks[j] in DETERMINERS | {"some", "another"}
        phrase = []
        while j < len(toks) and toks[j] not in stop and len(toks[j]) >= 3 and not toks[j].isdigit():
            phrase.append(toks[j])
            j += 1
            if j + 1 < len(toks) and toks[j] == "of":      # "a bottle of champagne", "a photo of the vase"
                j += 1 + (toks[j + 1] in DETERMINERS)
        if phrase and not any(singular(w) & known for w in phrase):
            return tuple(phrase)
    return ()


def _main_clauses(task: str) -> str:
    """The task up to its first aside; an aside that opens the task ("Before the get-in, can
    you check ...") ends at the first comma, and what follows is the request."""
    low = task.lower()
    aside = ASIDE.search(low)
    if aside and not low[:aside.start()].strip():
        comma = re.search(r"[,;:]", low[aside.end():])
        if comma is None:
            return task
        start = aside.end() + comma.end()
        rest = ASIDE.search(low, start)
        return task[start:rest.start()] if rest else task[start:]
    return task[:aside.start()] if aside else task


def read_task(task: str, world: World) -> TaskReading:
    """The reading; what the task asks for comes from its main clauses (before an aside),
    what it mentions from all of it."""
    whole = words(task)
    task = _main_clauses(task)
    toks, tw = tokens(task), words(task)
    known = _known(world)
    things = world.objects + world.places
    place_words = {t for p in world.places for t in name_words(p.name)}
    vocab = {t for th in things for t in _content(th.name)}
    heads = _unique_cues({o.name: _head(o.name) | set(name_words(o.type or "")) for o in world.objects})
    pcues = _unique_cues({p.name: _head(p.name) for p in world.places})
    # words only one thing's name has, types included: a non-head one may still stand for it
    only = _unique_cues({th.name: set(_content(th.name)) | set(name_words(getattr(th, "type", "") or ""))
                         for th in things})
    mods = {c: n for c, n in only.items() if c not in _head(n)}
    is_place = {p.name for p in world.places}
    hit: dict[str, int] = {}          # name -> where a rule other than the full name found it

    def found(name: str, i: int | None) -> bool:
        if i is not None:
            hit[name] = min(i, hit.get(name, i))
        return i is not None

    def at_hit(name: str) -> tuple:
        return (hit[name],) if name in hit else ()

    def others(name: str) -> set[str]:
        return {t for o in world.objects if o.name != name for t in _content(o.name)}

    def called(th) -> bool:
        return any(found(th.name, _said(toks, alias_words(a))) for a in th.aliases)

    ref = {o.name for o in world.objects if names(tw, o.name) or called(o)}
    ref |= {heads[c] for c in tw & set(heads) if c not in place_words and _as_noun(toks, c, others(heads[c]))}
    ref |= {n for c, n in mods.items() if n not in is_place and c in tw
            and found(n, _noun_end(toks, c, n, vocab, DETERMINERS))}
    obj_words = {t for n in ref for t in name_words(n)}
    places = {p.name for p in world.places if names(tw, p.name) or called(p)}
    places |= {pcues[c] for c in tw & set(pcues) if c not in obj_words and _as_noun(toks, c)}
    places |= {n for c, n in mods.items() if n in is_place and c in tw
               and found(n, _noun_end(toks, c, n, vocab, DETERMINERS | PREPOSITIONS))}
    for n, i in _numbered(toks, [t.name for t in things]).items():
        (ref if n not in is_place else places).add(n)
        found(n, i)
    as_verb = {c: n for c, n in only.items() if n in is_place and found(n, _verb_place(toks, c))}
    places |= set(as_verb.values())
    taken = {t for n in ref | places for t in name_words(n)}
    taken |= {t for th in things if th.name in ref | places for a in th.aliases for t in alias_words(a)}
    verbs = {STATE_VERBS[w] for w in tw - taken if w in STATE_VERBS}
    if HOLD_PHRASE.search(task.lower()):
        verbs.add(("holding", None))
    if OPEN_PHRASE.search(task.lower()):
        verbs.add(("is", "open"))
    if CLOSE_PHRASE.search(task.lower()):
        verbs.add(("is", "closed"))
    at = {n: min(_where(toks, n, {c for c, o in heads.items() if o == n}), hit.get(n, len(toks))) for n in ref}
    at |= {n: min(_where(toks, n, {c for c, o in pcues.items() if o == n}), hit.get(n, len(toks))) for n in places}
    objs, spots = sorted(ref, key=lambda n: (at[n], n)), sorted(places, key=lambda n: (at[n], n))
    # "go and dock": the verb is the robot's going as well as the place
    paired, go_to = _layout(toks, at, objs, spots, taken - (set(as_verb) & MOVE_VERBS))
    return TaskReading(
        words=frozenset(tw), mentioned=tuple(o.name for o in world.objects if mentions(whole, o.name, o.type)
                                             or o.name in ref or any(_said(tokens(task), alias_words(a)) is not None
                                                                     for a in o.aliases)),
        referred=tuple(objs), places=tuple(spots), paired=paired, go_to=go_to,
        sources=frozenset(p for p in places if _after(toks, p, SOURCE_WORDS, at_hit(p))), wanted=frozenset(verbs),
        carry=bool((tw - taken) & CARRY_VERBS or set(as_verb) - MOVE_VERBS),
        move=bool((set(toks) - taken) & MOVE_VERBS), toward=any(_after(toks, p, TOWARD_WORDS, at_hit(p)) for p in places),
        home={o.name: o.at for o in world.objects if o.at}, unknown=_unknown(toks, known),
        lacking=_lacking(toks, known))
