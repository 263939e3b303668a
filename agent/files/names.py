"""How a world's names and aliases are compared with each other and with a task: their words.

One splitter for every language: lower case (Unicode case folding, NFKC), runs of letters and
runs of digits are words ("5cm" is "5", "cm"; "tray's" is "tray", "s"), a decimal point or
comma between digits joins ("0.5", "2,5"), and every character of a script written
without spaces (Chinese, Japanese kana and kanji) is a word of its own, so a thing's alias is
found in such a task as a run of characters. No word of any language is known here; which words
to drop before comparing (articles) is a lexicon's (agent/language/lexicons/).

The loader refuses two things whose names or aliases have the same words; the task's reading
looks for a thing's words among the task's.
"""

from __future__ import annotations

import unicodedata

# Unicode blocks written without spaces between words: CJK ideographs (and their extensions and
# compatibility forms), hiragana, katakana, and Thai
_UNSPACED = (
    (0x3040, 0x30FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x2FA1F),
    (0x0E00, 0x0E7F),
    (0x31F0, 0x31FF),
    (0xFF66, 0xFF9F),
)
_JOIN_DIGITS = ".,"


def unspaced(ch: str) -> bool:
    """Whether ``ch`` belongs to a script written without spaces between its words."""
    o = ord(ch)
    return any(lo <= o <= hi for lo, hi in _UNSPACED)


def words(text: str) -> list[str]:
    """The words of ``text`` as every comparison of names and tasks takes them."""
    s = unicodedata.normalize("NFKC", text).casefold()
    out: list[str] = []
    cur: list[str] = []

    def flush() -> None:
        if cur:
            out.append("".join(cur))
            cur.clear()

    for i, ch in enumerate(s):
        if unspaced(ch):
            flush()
            out.append(ch)
        elif ch.isalnum():
            if cur and cur[-1].isdigit() != ch.isdigit() and cur[-1] != ".":
                flush()  # "5cm" -> "5", "cm"
            cur.append(ch)
        elif cur and i + 1 < len(s) and not unspaced(s[i + 1]) and s[i + 1].isalnum():
            prev, nxt = cur[-1], s[i + 1]
            if ch in _JOIN_DIGITS and prev.isdigit() and nxt.isdigit():
                cur.append(".")  # "2,5" and "2.5" -> "2.5"
                continue
            flush()
        else:
            flush()
    flush()
    return out


def name_words(name: str) -> list[str]:
    """The words of an identifier ("shelf_a" -> ["shelf", "a"], "redMug" stays one word)."""
    return words(name.replace("_", " "))
