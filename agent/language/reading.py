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
  and whether it asks for a thing to be moved, the robot to go somewhere, or a look around;
- what it puts on what, when that is another object ("stack the red block on the blue block").

The vocabulary and the rules that find a name in the task's words are in wording.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.language.amounts import angles, durations, lengths, times_said
from agent.files.loader import World
from agent.files.names import alias_words
from agent.language.order_reading import ordered_events
from agent.language.set_reading import SetSaid, set_said
from agent.language.wording import (ASIDE, DESCRIBED, WANTED_THERE, CARRY_VERBS, CLOSE_PHRASE, DETERMINERS, HOLD_PHRASE, MOVE_VERBS,
                      OPEN_PHRASE, PREPOSITIONS, SET_WORDS, SOURCE_WORDS, STATE_VERBS, TAKING, TOWARD_WORDS, LOCATIVE,
                      after_state_verb, as_noun, content_words, agent_nouns, head_words,
                      known_words, lacking_words, mentions, name_words, names, noun_end, numbered, phrases, robot_goes,
                      said, said_after, said_all, said_spans, singular, stacked, thing_words, tokens, unique_cues,
                      unknown_words, verb_place,
                      where_said, words)


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
    # A word of a set ("everything", "all"): the task may be about things it does not name.
    sets: bool = False
    # object -> the objects the task says it goes on ("the red block on the blue block"), and
    # the objects said only as what another goes on (the blue block there): objects as places
    supports: dict = field(default_factory=dict)
    under: frozenset = frozenset()
    # The things the task asks for in an order its end states do not say ("check the print, then
    # lay it on the rack", "scan the vault, wait 30 seconds, and scan it again"): a goal's
    # `before`. () when it orders nothing, or not in words the reading can follow.
    events: tuple = ()
    # How many times the task asks for its thing ("read the thermometer three times"), and the
    # length it says ("give the ink tin a shove 5 cm to the right", in metres; None if none): a
    # call the task fixes (task_leads._call_lead)
    times: int = 1
    length: float | None = None
    # The set of things the task asks about, by what its words say of them ("everything on the
    # wheel", "all the tools"): a goal's `every` (set_reading.py); None when they say none
    every: SetSaid | None = None
    # the main clauses' words in order (an option said nearest a call's length: task_leads)
    toks: tuple = ()
    # objects that open and shut (a drawer, a lid): "pop the till" may open it rather than take it
    openable: frozenset = frozenset()

    @property
    def only_missing(self) -> bool:
        """The task asks to carry a thing this world lacks, or mentions no object of this world
        and is neither about the robot going somewhere nor about looking at a place: whatever it
        asks for is not here."""
        inspect = ("is", "inspected") in self.wanted
        if self.lacking:                   # "hang all the aprons on the rail" in a world without one
            return True
        if (self.sets or self.every is not None) and self.places:   # "everything on the counter": this world's things
            return False
        if self.events:                    # an order read whole names only this world's things
            return False
        if not self.carry and (angles(list(self.toks)) or durations(list(self.toks))):
            return False                   # "turn 45 degrees", "hold still for 20 seconds": a call on nothing
        return not self.mentioned and (self.carry or not (self.move or self.toward or inspect))

    @property
    def about_places(self) -> tuple:
        """The places a task about places alone (go there, look at it) is about; () otherwise.
        A word that only brushes an object ("before the next patient arrives") does not make
        it a task about that object; a thing to move ("bring the guitar round") does."""
        inspect = ("is", "inspected") in self.wanted
        if self.referred or self.only_missing or self.sets or self.every is not None or (self.mentioned and (self.carry or not (inspect or self.move))):
            return ()
        return self.destinations()

    @property
    def place_kinds(self) -> frozenset:
        """What a task about places alone may ask of them: a look (`place_is`), going there
        (`robot_at`, "head to", "make your way to"), or either when its verbs do not say."""
        inspect, go = ("is", "inspected") in self.wanted, self.move or self.toward
        return frozenset(k for k, ok in (("place_is", inspect or not go), ("robot_at", go or not inspect)) if ok)

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
        asks no state of it ("the jug goes in the cage"); held, when a verb carries it and the
        task says nowhere it goes ("grab the clipboard from reception")."""
        want = self.wanted - {("holding", None)} if self._own(obj) else self.wanted
        if not want and self.supports.get(obj) and not self._own(obj):
            return frozenset({("on", None)})      # "stack the red block on the blue block"
        if (not want and self.carry and self.words & TAKING and not self.destinations(obj) and obj not in self.openable
                and self.length is None and self.times == 1 and not self.events):
            return frozenset({("holding", None)})   # "grab the clipboard from reception": taken, put nowhere
        return want or (frozenset({("at", None)}) if self.destinations(obj) else frozenset())

    def also_at(self, obj: str) -> tuple:
        """Where a referred object that the verbs want in some state goes as well ("check the
        lens, then leave it on the desk"): the places said right after it, when the task asks
        for a thing to be moved; () otherwise."""
        return self._own(obj) if self.carry else ()


def _locative(toks: list[str], i: int) -> bool:
    """The words before index ``i`` (past its articles) say where something else is."""
    while i > 0 and toks[i - 1] in DETERMINERS:
        i -= 1
    return i > 0 and (toks[i - 1] in LOCATIVE or toks[max(0, i - 2):i] == ["next", "to"])


def _layout(toks: list[str], at: dict, objs: list[str], spots: list[str], taken: set[str]):
    """-> (paired, go_to) from where each referred object and place is said (``at``)."""
    last = max((at[n] for n in objs), default=len(toks))
    # a new action: "..., then go back", "and head to", "then get back to"; not "the bundle
    # needs to go on the cart"
    goes = [i for i, t in enumerate(toks) if i > last and {"then", "and"} & set(toks[max(0, i - 2):i])
            and (t in MOVE_VERBS - taken or (t == "get" and toks[i + 1:i + 2] in (["back"], ["over"], ["to"])))]
    ends = [at[n] for n in objs[1:]] + [goes[0] if goes else len(toks)]
    # "on the cable tray over row C": the second place says where the first is
    paired = {n: tuple(p for k, p in enumerate(ps) if not (k and _locative(toks, at[p])))
              for n, e in zip(objs, ends) for ps in [[p for p in spots if at[n] < at[p] < e]]}
    return paired, (tuple(p for p in spots if at[p] >= goes[0]) if goes else None)


# the robot stays where it took a thing ("stay there with it", "remain by them")
STAY = re.compile(r"\b(?:stay|remain)\s+(?:there|put|with\s+(?:it|them)|by\s+(?:it|them)|beside\s+(?:it|them))\b")
# "when you're done, dock at the charger", "once that's done": the next step, not an aside
# "when they're down", "once it's open": the last thing is in its state, and the next step follows
DONE = re.compile(r"(?:,\s*)?\b(?:when|once|after)\s+(?:(?:you(?:'re|\s+are|'ve|\s+have)?|that(?:'s|\s+is)?|it(?:'s|\s+is))"
                  r"\s+(?:done|finished|through)|(?:that|it)(?:'s|\s+is)\s+(?:down|in|there|set|placed|away|open|closed|shut)"
                  r"|they(?:'re|\s+are)\s+(?:done|finished|through|down|in|there|set|placed|away|open|closed|shut))\b\s*,?",
                  re.I)
# "carry on to the pear trees", "stop by the tool shed", "pop over to": the robot goes there; "hold still for 20
# seconds": it waits
GOING = re.compile(r"\b(?:(?:carry|move|press)\s+on\s+(?=to\b|towards?\b)|(?:stop|swing|pop|drop|call)\s+(?:by|in\s+at)\b"
                   r"|(?:pop|nip|hop)\s+(?:over|across|round|down|up)\s+(?=to\b))", re.I)
STILL = re.compile(r"\b(?:hold|keep|stay|stand|sit)\s+(?:still|tight)\b", re.I)
# "pass me the Dremel": a thing brought ("one pass never catches it" passes nothing)
HAND_ME = re.compile(r"\b(?:pass|hand)\s+(?=(?:me|us)\b)", re.I)
# "and while you're at it, ...", "while you're there": the request goes on with a next thing
ALSO = re.compile(r",?\s*(?:and\s+)?while\s+you(?:'re|\s+are)\s+(?:at\s+it|there|about\s+it)\b\s*,?", re.I)
# phrasings read as the plainer words they mean, in this order
_REWORDED = ((HAND_ME, "bring "), (GOING, "go to "), (STILL, "wait"), (DONE, ", then "), (ALSO, ", and "))
# after an aside's comma, the request goes on when the next words order a next thing ("leave it
# twenty seconds so the air can settle, and then shut it again")
_GOES_ON = re.compile(r"\s*(?:and\s+)?(?:then|after\s+that|afterwards|finally)\b")


def _main_clauses(task: str) -> str:
    """The task without its asides: an aside that opens the task ("Before the get-in, can you
    check ...") ends at the first comma, and what follows is the request; one inside it ends the
    request, unless after its next comma the words go on to a next thing ("..., and then ...")."""
    low = task.lower()
    aside = ASIDE.search(low)
    if aside is None:
        return task
    comma = re.search(r"[,;:]", low[aside.end():])
    if not low[:aside.start()].strip():
        return task if comma is None else _main_clauses(task[aside.end() + comma.end():])
    if comma is not None and _GOES_ON.match(low[aside.end() + comma.end():]):
        return task[:aside.start()] + ", " + _main_clauses(task[aside.end() + comma.end():])
    return task[:aside.start()]


def read_task(task: str, world: World) -> TaskReading:
    """The reading; what the task asks for comes from its main clauses (before an aside),
    what it mentions from all of it."""
    whole = words(task)
    for pattern, said_as in _REWORDED:
        task = pattern.sub(said_as, task)
    task = _main_clauses(task)
    toks, tw = tokens(task), words(task)
    known = known_words(world)
    things = world.objects + world.places
    place_words = {t for p in world.places for t in name_words(p.name)}
    # an alias said whole is the place's: its words name no object there ("the fridge shelf", "the first aid room")
    covered = said_spans(toks, [alias_words(a) for p in world.places for a in p.aliases])
    # each place's words, its aliases' too
    place_names = {p.name: thing_words(p) for p in world.places}
    said_alias = {toks[i] for i in covered}
    # the words of names and aliases ("the tea tins": "tea" is no noun before an alias's "tin")
    vocab = {t for th in things for t in content_words(th.name)} | {
        t for th in things for a in th.aliases for t in alias_words(a) if len(t) >= 3}
    heads = unique_cues({o.name: head_words(o.name) | set(name_words(o.type or "")) for o in world.objects})
    pcues = unique_cues({p.name: head_words(p.name) for p in world.places})
    # words only one thing's name has, types included: a non-head one may still stand for it
    only = unique_cues({th.name: set(content_words(th.name)) | set(name_words(getattr(th, "type", "") or ""))
                         for th in things})
    mods = {c: n for c, n in only.items() if c not in head_words(n)}
    is_place = {p.name for p in world.places}
    hit: dict[str, int] = {}          # name -> where a rule other than the full name found it

    def found(name: str, i: int | None) -> bool:
        if i is not None:
            hit[name] = min(i, hit.get(name, i))
        return i is not None

    def at_hit(name: str) -> tuple:
        return (hit[name],) if name in hit else ()

    def others(name: str) -> set[str]:
        return {t for o in world.objects if o.name != name for t in content_words(o.name)}

    def called(th, skip: frozenset = frozenset()) -> bool:
        return any(found(th.name, next((i for i in said_all(toks, alias_words(a)) if i not in skip), None))
                   for a in th.aliases)

    # where each object's name or alias of two or more words is said: an alias said inside another
    # object's whole name is not this one's ("the wick drawer" is no wick)
    named_at = {o.name: said_spans(toks, phrases(o)) for o in world.objects}
    ref = {o.name for o in world.objects
           if called(o, frozenset(covered).union(*(v for n, v in named_at.items() if n != o.name))) or names(tw, o.name)}
    ref |= {heads[c] for c in tw & set(heads) if c not in place_words | said_alias and as_noun(toks, c, others(heads[c]))}
    ref |= {n for c, n in mods.items() if n not in is_place and c in tw and c not in said_alias
            and found(n, noun_end(toks, c, n, vocab, DETERMINERS))}
    # a word one object shares only with places, as what "open"/"shut" takes
    ref |= {n for c, n in unique_cues({o.name: set(content_words(o.name)) for o in world.objects}).items()
            if c in tw and c not in only and found(n, after_state_verb(toks, c))}
    obj_words = {t for n in ref for t in name_words(n)}
    # an alias is looked for first, so where it is said is known ("the van bay" beside "the yard door")
    places = {p.name for p in world.places if called(p) or names(tw, p.name)}
    # a head word inside a place said whole is that place's ("the van bay" is no inward bay)
    whole_words = {w for p in places for w in place_names[p]}
    places |= {pcues[c] for c in tw & set(pcues) if c not in obj_words | whole_words and as_noun(toks, c)}
    places |= {n for c, n in mods.items() if n in is_place and c in tw
               and found(n, noun_end(toks, c, n, vocab, DETERMINERS | PREPOSITIONS))}
    for n, i in numbered(toks, [t.name for t in things]).items():
        (ref if n not in is_place else places).add(n)
        found(n, i)
    as_verb = {c: n for c, n in only.items() if n in is_place and found(n, verb_place(toks, c))}
    # "go and charge" with a place called the charger ("robot_plug_in", also called "charger")
    doers = unique_cues({p.name: agent_nouns(set(content_words(p.name)) | {w for a in p.aliases for w in alias_words(a)})
                         for p in world.places})
    as_verb |= {c: n for c, n in doers.items() if c not in as_verb and found(n, verb_place(toks, c))}
    places |= set(as_verb.values())
    taken = {w for n in ref | places for t in name_words(n) for w in singular(t)}    # "the clean shelves" shelve nothing
    taken |= {t for th in things if th.name in ref | places for a in th.aliases for t in alias_words(a)}
    # "left open", "been left open", "still shut": the state it is in, not the one asked for
    asked = words(DESCRIBED.sub(" ", task.lower()))
    verbs = {STATE_VERBS[w] for w in asked - taken if w in STATE_VERBS}
    if HOLD_PHRASE.search(task.lower()):
        verbs.add(("holding", None))
    if OPEN_PHRASE.search(task.lower()):
        verbs.add(("is", "open"))
    if CLOSE_PHRASE.search(task.lower()):
        verbs.add(("is", "closed"))
    at = {n: min(where_said(toks, n, {c for c, o in heads.items() if o == n}), hit.get(n, len(toks))) for n in ref}
    at |= {n: min(where_said(toks, n, {c for c, o in pcues.items() if o == n}), hit.get(n, len(toks))) for n in places}
    # what goes on what: an object said first as what another goes on is ordered by where it is
    # said as the thing that moves ("put the blue block on the green block and the red on the blue")
    supports, moves = stacked(toks, {n: set(said_all(toks, name_words(n))) | set(at_hit(n))
                                     | {i for a in world.object(n).aliases for i in said_all(toks, alias_words(a))}
                                     for n in ref})
    under = {n for ns in supports.values() for n in ns}
    order = {n: moves.get(n, at[n]) if n in under else at[n] for n in ref}
    objs, spots = sorted(ref, key=lambda n: (order[n], n)), sorted(places, key=lambda n: (at[n], n))
    sources = frozenset(p for p in places if said_after(toks, p, SOURCE_WORDS, at_hit(p)))
    every = set_said(task, toks, world, tuple(objs), tuple(spots), at, sources)
    if every is not None:          # "both sets of clippers": the set, not the one named by its type
        objs = [n for n in objs if n not in every.takes]
    # "go and dock": the verb is the robot's going as well as the place
    paired, go_to = _layout(toks, {**at, **order}, objs, spots, taken - (set(as_verb) & MOVE_VERBS))
    # the words said outside a place's whole name ("bring it to the print washer": no print tongs)
    in_places = said_spans(toks, [ph for p in places for ph in phrases(world.place(p))])
    loose = (whole - {w for i in in_places for w in singular(toks[i])}) | {
        w for i, t in enumerate(toks) if i not in in_places for w in singular(t)}
    events = ordered_events(task, toks, at, objs, [p for p in spots if p not in sources], place_names,
                            {o.name: thing_words(o) for o in world.objects})
    if events:
        # an order read whole holds every thing the task asks about; one it left out was said as
        # what a pour pours ("pour the tea from the clay pot ...") or inside a place's name
        objs = [n for n in objs if n in {e.subject for e in events}]
    stay = STAY.search(" ".join(toks))
    if stay is not None and go_to is None and objs:
        # "take the kit to box 3 and stay there with it": the robot ends where it last took a thing
        before = len(tokens(" ".join(toks)[:stay.start()]))
        there = [p for p in spots if at[p] < before and p not in sources]
        go_to = tuple(there[-1:]) or None
    return TaskReading(
        words=frozenset(tw), mentioned=tuple(o.name for o in world.objects if mentions(loose, o.name, o.type)
                                             or o.name in ref or any(said(toks, alias_words(a)) is not None
                                                                     for a in o.aliases)),
        referred=tuple(objs), places=tuple(spots), paired=paired, go_to=go_to,
        sources=sources, wanted=frozenset(verbs),
        carry=bool((tw - taken) & CARRY_VERBS or set(as_verb) - MOVE_VERBS),
        move=robot_goes(toks, taken) or bool(WANTED_THERE.search(task.lower())),
        toward=any(said_after(toks, p, TOWARD_WORDS, at_hit(p)) for p in places),
        home={o.name: o.at for o in world.objects if o.at}, unknown=unknown_words(toks, known),
        lacking=lacking_words(toks, known), sets=bool(tw & SET_WORDS),
        supports=supports, under=frozenset(n for n in under if n not in moves),
        events=events,
        times=times_said(toks), length=(lengths(toks) or [None])[0],
        every=every, toks=tuple(toks),
        openable=frozenset(o.name for o in world.objects if o.state is not None))
