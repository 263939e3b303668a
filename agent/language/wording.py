"""The words of a task and of a world's names: the vocabulary a task's reading (reading.py)
knows, and the rules that find where a task names a thing: by its whole name, an alias, a head
word said as a noun, a word only its name has said as a whole noun, a word before its number,
or a place's word said as a verb; and what a verb of carrying takes when the world has no such
thing. Each finder returns where it found the name (an index into the task's words) or nothing.
"""
from __future__ import annotations

import re
from itertools import pairwise

from agent.files.loader import OBJECT_STATES, World
from agent.files.names import alias_words

# The vocabulary's own verbs and their everyday synonyms. word -> (kind, state)
STATE_VERBS = {"open": ("is", "open"), "opened": ("is", "open"), "unlock": ("is", "open"),
               "close": ("is", "closed"), "closed": ("is", "closed"), "shut": ("is", "closed"),
               "inspect": ("is", "inspected"), "inspected": ("is", "inspected"), "examine": ("is", "inspected"),
               "look": ("is", "inspected"), "check": ("is", "inspected"), "scan": ("is", "inspected"),
               "sweep": ("is", "inspected"), "survey": ("is", "inspected"), "photograph": ("is", "inspected"),
               "read": ("is", "inspected"), "onceover": ("is", "inspected"),
               "pull": ("is", "open"), "raise": ("is", "open"),
               "hold": ("holding", None), "holding": ("holding", None)}
# Words before a state that describe how a thing is, not what the task wants of it ("the drawer's
# been left open; close it", "the hatch is still shut")
# (within one clause: "left out; shut it" still asks to shut it)
DESCRIBED = re.compile(r"\b(?:left|been|still|stuck|hanging|standing|wide)\s+(?:[\w']+\s+){0,3}?"
                       r"(?:open|opened|closed|shut)\b")
# "push it in", "slide the drawer shut": closing said with a verb of motion
CLOSE_PHRASE = re.compile(r"\b(?:push|shove|slide|tuck)(?:es|ed|s)?\s+(?:\w+\s+){0,3}?(?:in|shut|closed)\b")
# "lift the lid on the ultrasonic", "flip up the cover": a lid raised is open
OPEN_PHRASE = re.compile(r"\b(?:lift|flip|prop)\w*\s+(?:up\s+)?(?:\w+\s+){0,2}?(?:lid|cover|hatch|flap)s?\b")
HOLD_PHRASE = re.compile(r"\bin\s+(?:your|the|its|my|a)?\s*(?:hand|hands|gripper|grip)\b"
                         r"|\b(?:hang|hold)\s+on(?:\s+|)to\b|\bon\s+board\b|\bon(?:to)?\s+your\s+deck\b"
                         # "keep it on you", "have the crate on you"
                         r"|\b(?:keep|carry|have)\s+(?:[\w']+\s+){0,3}?on\s+you\b")
# Where a clause about something else begins ("... so I can photograph them", "before I
# start on the frame", "until the ward's ready"): what follows is not asked for.
# "before you move the box" is the robot's own next step (an order: ORDER_WORDS), not an aside.
# "once you've shut the cabinet, ...", "after you've dropped the corks off, ...": an earlier step of
# the task (an order: ORDER_WORDS), not an aside.
ASIDE = re.compile(r"\b(?:(?:so|because|while|when|until|since)\s+(?:that|i|we|you|they|he|she|it|the|someone"
                   r"|your|my|our|their|its)"
                   r"|before\s+(?:that|i|we|they|he|she|it|the|someone))\b"
                   # the speaker's own next step: ", I want to check the fluid level"
                   r"|[,;]\s*(?:i|we)(?:\s+(?:want|need|have)|'m\s+going|\s+am\s+going|'re\s+going)\s+to\s+(?!you\b)"
                   # "; I'll grab the shade guide myself", "; I'm starting on the ammonite after lunch"
                   r"|[,;]\s*(?:i|we)(?:'ll|\s+will|\s+can)\s+"
                   r"|[,;]\s*(?:i|we)(?:'m|\s+am|'re|\s+are)\s+\w+ing\b"
                   r"|[,;]\s*(?:i|we)\s+(?:need|want)\s+(?:it|them|this|that|these|those)\b"
                   # ", the lane's resetting", ", it's still drying": a reason, said of something else
                   r"|[,;]\s*(?:the(?:\s+\w+){1,3}?|it|they)(?:'s|\s+is|'re|\s+are)\s+(?:still\s+|being\s+)?\w+(?:ing|ed)\b")
# Words that ask for a thing to be moved.
CARRY_VERBS = frozenset({"put", "bring", "take", "carry", "fetch", "move", "place", "lift", "deliver", "lower",
                         "stick", "chuck", "send", "stow", "store", "set", "drop", "load", "hang", "pop", "leave", "file", "shelve",
                         "grab", "collect", "retrieve", "transfer", "shift", "ferry", "haul"})
# Of those, the ones that end with the thing in hand when they say nowhere it goes ("grab the
# clipboard"; "move the apple" still goes somewhere)
TAKING = frozenset({"grab", "take", "fetch", "collect", "retrieve", "load", "lift", "pick", "carry", "bring"})
# "they'd like you there", "we need you in the yard": the robot is wanted at a place
WANTED_THERE = re.compile(r"\b(?:like|want|need)s?\s+you\s+(?:there|at|in|on|by|over)\b")
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
# "everything on the counter", "all the tools", "anything you can carry": the task is about a set
# of things (a goal's `every`), which its words need not name one by one
SET_WORDS = frozenset({"everything", "all", "every", "each", "anything", "whatever"})
PRONOUNS = frozenset({"it", "them", "this", "that", "these", "those"})
# "check the print, then lay it on the rack", "scan it again", "twice, a minute apart", "before you
# move the box": the task orders things it asks for (a goal's `before`: reading.ordered_events).
# A closed class, like SET_WORDS; an order word that joins no second thing of the task's
# ("before the next patient arrives", "open again") orders nothing.
ORDER_WORDS = frozenset({"then", "before", "after", "afterwards", "again", "apart", "between", "first", "finally",
                         "once"})
# Where one thing the task asks for ends and the next begins (besides , ; :).
CLAUSE_WORDS = frozenset({"then", "afterwards", "finally"})
# Verbs of a clause that asks for nothing but time to pass ("hold on for 45 seconds", "give it five
# seconds", "a ten second pause"); a clause that says a time and no other verb asks for the same.
WAIT_WORDS = frozenset({"wait", "pause", "hold", "give", "leave", "let", "hang"})
# "twice, a minute apart": the same thing again, with the wait between
TWICE = (("twice",), ("two", "times"))
# Verbs that put a thing somewhere, besides CARRY_VERBS ("lay it on the rack")
PUT_VERBS = frozenset({"lay", "rest", "stand", "sit"})
# "the tray over row C", "the shelf by the door": a place said to locate another one
LOCATIVE = frozenset({"over", "above", "beside", "behind", "near", "by", "opposite", "below", "beneath"})
# "the red block on (top of) the blue block": the thing said next is what the first goes on
ONTO = (("on",), ("onto",), ("on", "top", "of"), ("atop",), ("upon",))
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
    """Lower-case words; a hyphen inside a word joins it ("X-ray" is "xray", as names write it);
    "180°" is "180 degrees"."""
    return re.findall(r"[a-z0-9]+", re.sub(r"(?<=[a-z])-(?=[a-z])", "", text.lower().replace("°", " degrees ")))


def verb_forms(t: str) -> set[str]:
    """The word and the verbs it may be a form of: "dropped" drop, "placed" place, "shutting" shut,
    "goes" go."""
    out = {t}
    for end in ("ed", "ing"):
        if t.endswith(end) and len(t) > len(end) + 2:
            stem = t[:-len(end)]
            out |= {stem, stem + "e"}
            if len(stem) > 2 and stem[-1] == stem[-2]:        # dropped, shutting
                out.add(stem[:-1])
    if t.endswith("es") and len(t) > 3:                       # goes, pushes
        out |= {t[:-2], t[:-1]}
    elif t.endswith("s") and not t.endswith(("ss", "us", "is")) and len(t) > 3:     # opens, puts
        out.add(t[:-1])
    return out


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


def content_words(name: str) -> list[str]:
    """The words of a name that can stand for it (3+ letters, not a number)."""
    return [t for t in name_words(name) if len(t) >= 3 and not t.isdigit()]


def mentions(task_words: set[str], name: str, type_: str | None) -> bool:
    """The task refers to this object by some word of its name (3+ letters) or by its type."""
    return any(c in task_words for c in content_words(name) + (name_words(type_) if type_ else []))


def names(task_words: set[str], name: str) -> bool:
    """The task names this thing in full: every word of its name appears."""
    return bool(content_words(name)) and all(t in task_words for t in name_words(name))


def unique_cues(cues: dict[str, set[str]]) -> dict[str, str]:
    """cue word -> the one name it belongs to (words shared by two names decide nothing)."""
    owners: dict[str, set[str]] = {}
    for name, cs in cues.items():
        for c in cs:
            owners.setdefault(c, set()).add(name)
    return {c: next(iter(n)) for c, n in owners.items() if len(n) == 1}


def where_said(toks: list[str], name: str, cues: set[str]) -> int:
    """Index of the name in the task: its words in a row, else the first of ``cues`` (the
    words that made it count), else the end."""
    nw = name_words(name)
    for i in range(len(toks) - len(nw) + 1):
        if all(w in singular(t) for w, t in zip(nw, toks[i:i + len(nw)])):
            return i
    return first(toks, sorted(cues))


def first(toks: list[str], cue_words: list[str]) -> int:
    hits = [i for i, t in enumerate(toks) if singular(t) & set(cue_words)]
    return min(hits, default=len(toks))


def as_noun(toks: list[str], cue: str, others: set[str] = frozenset()) -> bool:
    """Some occurrence of ``cue`` follows a determiner, with at most one word between, and
    neither that word nor the next is a word of another name ("the red mug" with a red cup and
    a blue mug refers to neither; "the wick drawer" is no wick spool)."""
    return any(cue in singular(t) and (DETERMINERS & set(toks[max(0, i - 2):i]) or opens(toks, i))
               and not {w for x in toks[max(0, i - 2):i + 2] if x != t for w in singular(x)} & others
               for i, t in enumerate(toks))


def opens(toks: list[str], i: int) -> bool:
    """The task starts with the word at ``i`` as a noun ("Sword over to stage right"), not as a
    verb taking what follows ("Set it aside", "Open the lid")."""
    verbs = FUNCTION_WORDS | set(STATE_VERBS) | CARRY_VERBS | MOVE_VERBS
    joins = (FUNCTION_WORDS | PREPOSITIONS) - DETERMINERS - PRONOUNS - {"up", "out"}
    # the next word joins it to the rest ("Shaker and ...", "Coupe on the mat", "Customs
    # would like ..."), not to a name of its own ("Pump one's a cylinder short")
    return i == 0 and len(toks) > 1 and toks[0] not in verbs and toks[1] in joins


def after_state_verb(toks: list[str], cue: str) -> int | None:
    """Index where ``cue`` is what a verb of state takes ("open the ultrasonic", "shut the
    glasswasher"): only a thing opens or shuts, so a word an object shares with places
    stands for the object there."""
    for i, t in enumerate(toks):
        j = i
        while j > 0 and toks[j - 1] in DETERMINERS:
            j -= 1
        if cue in singular(t) and j < i and j > 0 and STATE_VERBS.get(toks[j - 1], ("", ""))[1] in OBJECT_STATES:
            return i
    return None


def word_before(toks: list[str], i: int, skip=DETERMINERS, most: int | None = None) -> str:
    """The word before index ``i``, past the words of ``skip`` (at most ``most`` of them);
    "" at the start: "into the blending flask" -> "into"."""
    j = i
    while j > 0 and toks[j - 1] in skip and (most is None or i - j < most):
        j -= 1
    return toks[j - 1] if j > 0 else ""


def said_after(toks: list[str], name: str, lead: tuple, also: tuple = ()) -> bool:
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


def head_words(name: str) -> set[str]:
    """The last word of a name that can stand for it ("paperback" of mystery_paperback)."""
    c = content_words(name)
    return {c[-1]} if c else set()


def known_words(world: World) -> set[str]:
    """Words that are a name, type or alias of this world, or a word of the vocabulary."""
    return ({t for o in world.objects for t in name_words(o.name) + name_words(o.type or "")}
            | {t for thing in world.objects + world.places for a in thing.aliases for t in alias_words(a)}
            | {t for p in world.places for t in name_words(p.name)}
            | set(STATE_VERBS) | CARRY_VERBS | MOVE_VERBS | FUNCTION_WORDS)


def unknown_words(toks: list[str], known: set[str]) -> tuple:
    """TaskReading.unknown: words (and runs of two or three) no name, type or verb of this world."""
    odd = [t if len(t) >= 3 and not t.isdigit() and not singular(t) & known else None for t in toks]
    pairs = [x for i, t in enumerate(odd) if t
             for x in ([f"{t}_{odd[i + 1]}_{odd[i + 2]}"] if i + 2 < len(odd) and odd[i + 1] and odd[i + 2] else [])
             + ([f"{t}_{odd[i + 1]}"] if i + 1 < len(odd) and odd[i + 1] else []) + [t]]
    return tuple(dict.fromkeys(pairs))


def said(toks: list[str], phrase: list[str]) -> int | None:
    """Index where the words of ``phrase`` (an alias) are said in a row, else None."""
    for i in range(len(toks) - len(phrase) + 1):
        if phrase and all(w in singular(t) for w, t in zip(phrase, toks[i:i + len(phrase)])):
            return i
    return None


def noun_end(toks: list[str], cue: str, name: str, vocab: set[str], leads: frozenset) -> int | None:
    """Index where a word of ``name`` that is not its head is said as a whole noun: after one of
    ``leads`` (one word may sit between) and not followed by another word of a name or a
    number that is not the name's, or by an article ("the guitar with customs", "to consult 1";
    not "the guitar case", "consult 2", "a look round the heap")."""
    own = set(name_words(name))
    for i, t in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        between = {w for x in toks[max(0, i - 1):i] if x not in leads for w in singular(x)}
        if (cue in singular(t) and (leads & set(toks[max(0, i - 2):i]) or opens(toks, i)) and not between & vocab
                and not (nxt and (singular(nxt) & vocab - own or (nxt.isdigit() and nxt not in own)
                                  or nxt in DETERMINERS))):       # "a look round the heap": no noun
            return i
    return None


def numbered(toks: list[str], names_: list[str]) -> dict[str, int]:
    """name -> where a word of it is said right before its number, when that pair is no other
    name's ("consult 2" is consult_room_2 beside consult_room_1)."""
    cues = unique_cues({n: {f"{w} {d}" for w in content_words(n) for d in name_words(n) if d.isdigit()}
                         for n in names_})
    return {cues[f"{w} {d}"]: i for i, (t, d) in enumerate(pairwise(toks))
            for w in singular(t) if f"{w} {d}" in cues}


def verb_place(toks: list[str], cue: str) -> int | None:
    """Index where a place's word is said as a verb: on a thing ("quarantine it") or as the
    robot's own going ("go and dock", "then charge")."""
    for i, t in enumerate(toks):
        if t != cue:
            continue
        if i + 1 < len(toks) and toks[i + 1] in PRONOUNS:
            return i
        if cue in MOVE_VERBS and {"and", "then", "to", "please"} & set(toks[max(0, i - 1):i]):
            return i
    for i, t in enumerate(toks):
        # "go and get yourself charged", "get charged up": the going said by the verb's participle
        if cue in MOVE_VERBS and t in (cue + "d", cue + "ed") and "get" in toks[max(0, i - 2):i]:
            return i
    return None


MODALS = frozenset({"to", "can", "could", "should", "must", "will", "may", "might", "shall"})


def robot_goes(toks: list[str], taken: set[str]) -> bool:
    """A verb of going said to the robot: "head to the dock", "I need you to go"; not of a thing
    ("the trays want to go out to the van bay", "everything on it can go on the shelf")."""
    for i, t in enumerate(toks):
        if t not in MOVE_VERBS or t in taken:
            continue
        before = toks[max(0, i - 3):i]
        if not before or before[-1] not in MODALS or "you" in before:
            return True
    return False


def agent_nouns(words_: set[str]) -> set[str]:
    """The verbs of going whose doer these words name ("charger": charge; "docker": dock): a
    place called the charger is where "go and charge" sends the robot."""
    return {v for v in MOVE_VERBS for w in words_ if w in (v + "r", v + "er")}


def lacking_words(toks: list[str], known: set[str]) -> tuple:
    """What a verb of carrying takes when none of its words is a word of this world: the words
    after the verb (and a word of a set, an article: "hang all the aprons"), up to the next
    one-letter or function word ("the pH meter" keeps its "ph")."""
    stop = FUNCTION_WORDS | PREPOSITIONS | PRONOUNS | {"me", "us", "of", "everything", "something", "anything", "whatever",
                                                       "about", "around",
                                                       "one", "ones", "stuff", "things", "thing", "lot"}
    for i, t in enumerate(toks):
        if t not in CARRY_VERBS:
            continue
        j = i + 1 + (i + 1 < len(toks) and toks[i + 1] in {"me", "us"})
        j += j < len(toks) and toks[j] in {"all", "every", "each", "any"}
        j += j < len(toks) and toks[j] in DETERMINERS | {"some", "another"}
        phrase = []
        while j < len(toks) and toks[j] not in stop and len(toks[j]) >= 2 and not toks[j].isdigit():
            phrase.append(toks[j])
            j += 1
            if j + 1 < len(toks) and toks[j] == "of":      # "a bottle of champagne", "a photo of the vase"
                j += 1 + (toks[j + 1] in DETERMINERS)
        if phrase and not any(singular(w) & known for w in phrase):
            return tuple(phrase)
    return ()


def phrases(thing) -> list[list[str]]:
    """A thing's name and each of its aliases, as the words a task says them in."""
    return [name_words(thing.name)] + [alias_words(a) for a in thing.aliases]


def thing_words(thing) -> set[str]:
    """Every word of a thing's name and of its aliases."""
    return {w for ph in phrases(thing) for w in ph}


def said_spans(toks: list[str], said_as: list[list[str]]) -> set[int]:
    """The indices of ``toks`` inside a phrase of two or more words said in a row ("the print
    washer": the words of a place said whole)."""
    return {i + k for ph in said_as if len(ph) > 1 for i in said_all(toks, ph) for k in range(len(ph))}


def said_all(toks: list[str], phrase: list[str]) -> list[int]:
    """Every index where the words of ``phrase`` are said in a row."""
    return [i for i in range(len(toks) - len(phrase) + 1)
            if phrase and all(w in singular(t) for w, t in zip(phrase, toks[i:i + len(phrase)]))]


def stacked(toks: list[str], spots: dict[str, set[int]]) -> tuple[dict, dict]:
    """What the task puts on what: an object said right after "on", "onto" or "on top of" (past
    its articles) is what the object said just before it goes on ("stack the red block on the
    blue block"). ``spots``: object -> where it is said. -> ({object: the objects it goes on, in
    task order}, {object: where it is first said as the thing that moves, for those said so})."""
    said = sorted((i, n) for n, idx in spots.items() for i in idx)
    onto, under = {}, set()
    for k, (i, n) in enumerate(said):
        j = i
        while j > 0 and toks[j - 1] in DETERMINERS:
            j -= 1
        lead = tuple(toks[max(0, j - 3):j])
        if k and said[k - 1][1] != n and any(lead[len(lead) - len(w):] == w for w in ONTO if len(lead) >= len(w)):
            onto.setdefault(said[k - 1][1], []).append(n)
            under.add((i, n))
    moves = {}
    for i, n in said:
        if (i, n) not in under:
            moves.setdefault(n, i)
    return {n: tuple(dict.fromkeys(v)) for n, v in onto.items()}, moves
