"""What a task's words name in this world, in any language: the world's things by their names,
aliases and types, and the amounts it says (a number, with its unit where a lexicon knows it).

Nothing here knows a language. A thing is named where the words of its name, of one of its
aliases, or (for an object) of its type run in the task; words match when equal, or when both
are long and one begins the other (an inflected form: "Becher", "Bechers"). A script written
without spaces matches character by character. A lexicon adds number words, units and the
words to drop from aliases (articles); without one, digits are the only numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.files.loader import World
from agent.files.names import name_words, unspaced, words
from agent.language.lexicon import EMPTY, Lexicon, Phrase, cues

# a word this long may carry an ending of up to _ENDING letters and still be the same word, and
# one of _SHORT letters one letter ("tree", "trees"; "Tasse", "Tassen")
_STEM, _ENDING, _SHORT = 5, 3, 4
# the longest run of a task's words ``TaskWords.unnamed`` offers as a thing's name
UNNAMED_WORDS = 4


@dataclass(frozen=True)
class Amount:
    value: float
    unit: str | None  # m | s | deg | count, or None where no lexicon knows the word after it
    at: int  # the index of its first word in the task


@dataclass(frozen=True)
class TaskWords:
    """A task's words against one world (read once per request)."""

    toks: tuple[str, ...]
    named: dict[str, int] = field(default_factory=dict)  # thing -> first word naming it
    typed: dict[str, int] = field(default_factory=dict)  # object -> first word of its type
    amounts: tuple[Amount, ...] = ()
    hints: dict[str, frozenset[str]] = field(default_factory=dict)  # forms|skills|states ->

    loose: frozenset[str] = frozenset()  # things a word of whose name the task says
    covered: frozenset[int] = frozenset()  # the words that say a thing, a type or a name's word

    def mentions(self, name: str) -> bool:
        """Named by its name, an alias or its type, or by one word of its name ("the door" for
        chiller_door)."""
        return name in self.named or name in self.typed or name in self.loose

    def unnamed(self, longest: int = UNNAMED_WORDS) -> list[tuple[int, str]]:
        """Every run of one to ``longest`` of the task's words of which none says a thing of
        this world (by a name, an alias, a type or a word of a name) and holds no number, as
        (its first word, its text): what the task may name that the world lacks, in
        its own words. A script written without spaces is joined without them."""
        toks, out = self.toks, []
        for i in range(len(toks)):
            for n in range(1, longest + 1):
                run = toks[i : i + n]
                if len(run) < n or any(i + k in self.covered for k in range(n)):
                    break
                if any(w.isdigit() for w in run):
                    break  # a number says how many or how much, not what
                text = run[0]
                for a, b in zip(run, run[1:]):
                    text += b if unspaced(a[-1]) and unspaced(b[0]) else " " + b
                out.append((i, text))
        return out

    def says(self, text: str) -> bool:
        """Whether the words of ``text`` (a value the model wrote) run in the task."""
        return run_in(list(self.toks), tuple(words(text))) is not None


def same_word(a: str, b: str) -> bool:
    if a == b:
        return True
    if not a or not b or unspaced(a[0]) or unspaced(b[0]):
        return False
    short, long_ = sorted((a, b), key=len)
    more = len(long_) - len(short)
    return long_.startswith(short) and (
        len(short) >= _STEM and more <= _ENDING or len(short) >= _SHORT and more <= 1
    )


def run_in(toks: list[str], phrase: Phrase) -> int | None:
    """Where the words of ``phrase`` first run in ``toks`` (each the same word), or None."""
    n = len(phrase)
    if not n:
        return None
    for i in range(len(toks) - n + 1):
        if all(same_word(toks[i + k], phrase[k]) for k in range(n)):
            return i
    return None


def phrases(thing, lex: Lexicon = EMPTY) -> list[Phrase]:
    """The words a thing is called by: its name's and each alias's, less those a lexicon
    ignores (articles)."""
    out = [tuple(name_words(thing.name))] + [tuple(words(a)) for a in thing.aliases]
    out = [tuple(w for w in p if w not in lex.ignore) for p in out]
    return [p for p in dict.fromkeys(out) if p]


def _number(tok: str) -> float | None:
    try:
        v = float(tok)
    except ValueError:
        return None
    return v if v == v and abs(v) != float("inf") else None


def _said_number(toks: list[str], i: int, lex: Lexicon) -> tuple[float | None, int]:
    """The number that starts at ``toks[i]`` (digits or a lexicon's phrase) -> (value, words)."""
    v = _number(toks[i])
    if v is not None:
        return v, 1
    hit = _longest(toks, i, lex.numbers)
    return (float(hit[1]), len(hit[0])) if hit is not None else (None, 0)


def _longest(toks: list[str], i: int, table: dict[Phrase, object]):
    """The longest phrase of ``table`` starting at ``toks[i]`` -> (phrase, value), else None."""
    best = None
    for p, v in table.items():
        if tuple(toks[i : i + len(p)]) == p and (best is None or len(p) > len(best[0])):
            best = (p, v)
    return best


def amounts(toks: list[str], lex: Lexicon, skip: set[int]) -> list[Amount]:
    """Every number the words say (digits, or a lexicon's number phrase), with the unit a lexicon
    knows right after it; indices in ``skip`` (inside a thing's name) say no amount."""
    out, i = [], 0
    while i < len(toks):
        if i in skip:
            i += 1
            continue
        v, n = _said_number(toks, i, lex)
        if v is None:
            i += 1
            continue
        # "a hundred and eighty": a number, a joining word, a smaller number
        while True:
            j = i + n + (1 if i + n < len(toks) and toks[i + n] in lex.joiners else 0)
            more, m = _said_number(toks, j, lex) if j < len(toks) and j not in skip else (None, 0)
            if more is None or more >= v or (j == i + n and _number(toks[j]) is not None):
                break
            v, n = v + more, j - i + m
        unit = _longest(toks, i + n, lex.units)
        if unit is not None:
            (u, factor), n = unit[1], n + len(unit[0])
            out.append(Amount(v * factor, u, i))
        else:
            out.append(Amount(v, None, i))
        i += n
    return out


def read_words(task: str, world: World, lex: Lexicon = EMPTY) -> TaskWords:
    """The task's words against ``world`` (see the module doc)."""
    toks = words(task)
    spans = []  # (start, end, thing) of every name said
    for thing in list(world.objects) + list(world.places):
        for p in phrases(thing, lex):
            at = run_in(toks, p)
            if at is not None:
                spans.append((at, at + len(p), thing.name))
    # a name said inside a longer one names nothing of its own ("mould" in "the mould cupboard")
    spans = [
        x
        for x in spans
        if not any(y[0] <= x[0] and x[1] <= y[1] and y[1] - y[0] > x[1] - x[0] for y in spans)
    ]
    named: dict[str, int] = {}
    inside: set[int] = set()
    for at, end, name in sorted(spans):
        named.setdefault(name, at)
        inside |= set(range(at, end))
    typed: dict[str, int] = {}
    covered = set(inside)
    for o in world.objects:
        p = tuple(w for w in name_words(o.type) if w not in lex.ignore)
        at = run_in(toks, p) if p else None
        if at is not None:
            covered |= set(range(at, at + len(p)))
            if o.name not in named:
                typed[o.name] = at
    loose: set[str] = set()
    for t in list(world.objects) + list(world.places):
        for w in name_words(t.name):
            if len(w) < 3 or w in lex.ignore:
                continue
            said = [i for i, x in enumerate(toks) if same_word(x, w)]
            if said:
                loose.add(t.name)
                covered |= set(said)
    hints = {k: frozenset(v) for k, v in cues(lex, toks).items()}
    return TaskWords(
        tuple(toks),
        named,
        typed,
        tuple(amounts(toks, lex, inside)),
        hints,
        frozenset(loose),
        frozenset(covered),
    )
