"""Long texts cut into segments the model speaks well: at sentence ends, then clause marks, then spaces.

Owns the sentence and clause boundaries of the languages Qwen3-TTS speaks (Latin, Cyrillic and Hangul
text with . ! ? … and , ; : — followed by a space; Chinese and Japanese with 。！？ and ，；：、 without
one; blank lines), the weight of a text against the budget (a Han, kana or Hangul character is a whole
syllable, spoken about as long as three letters) and packing neighbouring sentences into segments up
to the budget. Pure text: knows nothing about models or audio.
"""

from __future__ import annotations

import re

# Qwen3-TTS's speaking rate drifts on long inputs; segments of a few sentences keep it steady, and
# packing whole sentences up to this weight keeps the number of joins (pauses) small.
SEGMENT_BUDGET = 300
_CLOSERS = "\"'”’)\\]」』）》"
_SENTENCE = re.compile(rf"(?:[.!?…]+[{_CLOSERS}]*(?=\s|$)|[。！？．]+[{_CLOSERS}]*|\n\s*\n)\s*")
_SENTENCE_DONE = re.compile(rf"(?:[.!?…]+[{_CLOSERS}]*\s+|[。！？．]+[{_CLOSERS}]*|\n\s*\n)\s*")  # more text may follow
_CLAUSE = re.compile(rf"(?:[,;:]+[{_CLOSERS}]*(?=\s)|[—–]|[，；：、]+[{_CLOSERS}]*)\s*")
_SPACE = re.compile(r"\s+")
_WIDE = re.compile(r"[\u1100-\u11ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def weight(text: str) -> int:
    """Characters, with every Han, kana or Hangul character counted three times."""
    return len(text) + 2 * len(_WIDE.findall(text))


def over_budget(text: object, budget: int = SEGMENT_BUDGET) -> bool:
    return isinstance(text, str) and weight(text.strip()) > budget


def _cut(text: str, boundary: re.Pattern[str]) -> list[str]:
    """`text` cut after every match of `boundary`; the pieces joined give `text` back."""
    ends = [m.end() for m in boundary.finditer(text) if m.end() > 0] + [len(text)]
    pieces, start = [], 0
    for end in ends:
        if end > start:
            pieces.append(text[start:end])
            start = end
    return pieces


def _hard_cut(text: str, budget: int) -> list[str]:
    """A run with no boundary at all, cut wherever the budget is reached."""
    pieces, cur, w = [], "", 0
    for ch in text:
        cw = weight(ch)
        if cur and w + cw > budget:
            pieces.append(cur)
            cur, w = "", 0
        cur, w = cur + ch, w + cw
    return pieces + [cur] if cur else pieces


def _pieces(text: str, budget: int, levels: tuple[re.Pattern[str], ...]) -> list[str]:
    """Pieces within the budget, cut at the coarsest boundary that gets there."""
    if weight(text.strip()) <= budget:
        return [text]
    if not levels:
        return _hard_cut(text, budget)
    out: list[str] = []
    for piece in _cut(text, levels[0]):
        out.extend(_pieces(piece, budget, levels[1:]))
    return out


def _pack(pieces: list[str], budget: int, alone: set[int] | frozenset[int] = frozenset()) -> list[str]:
    """Neighbouring pieces joined while the join stays within the budget; pieces whose index is in
    `alone` are never joined to another."""
    out, cur = [], ""
    for i, p in enumerate(pieces):
        if cur.strip() and (weight((cur + p).strip()) > budget or i in alone or i - 1 in alone):
            out.append(cur)
            cur = ""
        cur += p
    out.append(cur)
    return [s.strip() for s in out if s.strip()]


def split_text(text: str, budget: int = SEGMENT_BUDGET) -> list[str]:
    """`text` as segments of at most `budget` weight each, in order: whole sentences packed together, and
    a sentence over the budget cut at clause marks, then at spaces, into segments of its own. Nothing
    is dropped but the whitespace at the cuts."""
    units: list[str] = []
    alone: set[int] = set()  # the parts of a cut sentence: a segment ends where the sentence does
    for sentence in _cut(text, _SENTENCE):
        if weight(sentence.strip()) <= budget:
            units.append(sentence)
            continue
        parts = _pack(_pieces(sentence, budget, (_CLAUSE, _SPACE)), budget)
        alone.update(range(len(units), len(units) + len(parts)))
        units.extend(parts)
    return _pack(units, budget, alone)


def take_sentences(buffer: str, budget: int = SEGMENT_BUDGET) -> tuple[list[str], str]:
    """Text arriving in pieces: (the sentences `buffer` completes, what is left to wait for more). A Latin
    sentence is complete once a space follows its end (more digits or letters could follow '3.');
    a run past the budget with no end yet gives up all but its last segment."""
    ends = [m.end() for m in _SENTENCE_DONE.finditer(buffer)]
    done, rest = (buffer[:ends[-1]], buffer[ends[-1]:]) if ends else ("", buffer)
    sentences = [s.strip() for s in _cut(done, _SENTENCE_DONE) if s.strip()]
    if weight(rest.strip()) > budget:
        parts = split_text(rest, budget)
        sentences += parts[:-1]
        rest = rest[rest.rindex(parts[-1]):]
    return sentences, rest
