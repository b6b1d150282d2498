"""Parsers for LLM replies: generated question lists (A.1/A.2) and yes/no answer lists (A.3).

Tolerant of the usual free-text variants, strict about meaning: ``parse_answers`` never guesses. A reply
with the wrong number of answers, a line it cannot read ("1. maybe"), conflicting duplicates or a template
echo ("1. yes/no") raises ``ParseError``, and the runner asks again (up to ``LLMConfig.max_attempts``).

    parse_questions("1. Is it about cats?\\n2. What is it?")   -> ["Is it about cats?"], .dropped == {"not_yes_no": 1, ...}
    parse_answers("1) Yes.\\n2. **No**", 2)                     -> [True, False]
    p_yes_from_tokens(tokens, 2)                                -> [0.97, 0.12]   (P(yes) per answer line, from logprobs)
"""

from __future__ import annotations

import bisect
import math
import re

__all__ = ["ParseError", "QuestionList", "parse_questions", "loops", "parse_answers", "answer_offsets", "p_yes_from_tokens", "p_yes_from_top",
           "YES_NO_AUXILIARIES"]


class ParseError(ValueError):
    """An LLM reply that cannot be read without guessing. ``text`` is the raw reply."""

    def __init__(self, message: str, text: str = ""):
        super().__init__(message)
        self.text = text


# A yes/no question starts with an auxiliary or modal verb ("Is", "Does", "Can", ...).
YES_NO_AUXILIARIES = frozenset(
    "is are am was were do does did has have had can could will would should shall may might must "
    "isn't aren't wasn't weren't doesn't don't didn't hasn't haven't hadn't can't couldn't won't wouldn't shouldn't".split()
)

# "1." "1)" "1:" "1 -" "Q1." "Question 1:" "**1.**" "- 1." ... followed by the item's content.
_NUMBERED = re.compile(
    r"""^[\s>#*_`\-\u2022]*+                # markdown: quotes, headings, bold, bullets (possessive: linear on long runs)
        (?:q(?:uestion)?|a(?:nswer)?)?\s*    # Q1 / Question 1 / A1 / Answer 1
        (\d{1,3})                            # the number
        \s*(?:[.):\]]|-(?!\d)|(?=\s))        # 1.  1)  1:  1]  1 -  or just a space
        [\s*_`]*                             # closing bold
        (.*)$""",
    re.IGNORECASE | re.VERBOSE,
)
_BULLET = re.compile(r"^\s*[-*\u2022]\s+(.*)$")
_MARKUP = " \t*_`\"'[](){}<>\u201c\u201d\u2018\u2019"
_WORD = re.compile(r"[A-Za-z']+")
_KEY_WORD = re.compile(r"[A-Za-z0-9']+")  # "topic 1" and "topic 2" are two questions
_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")  # zero-width and bidi controls
_ANSWER_WORD = re.compile(r"(yes|no)\b", re.IGNORECASE)
_AMBIGUOUS = re.compile(r"(yes|no)\s*(?:/|\bor\b|\band\b|&)\s*(yes|no)\b", re.IGNORECASE)
_ANSWER_PREFIX = re.compile(r"^(?:answer|a|response|r)\s*[:=\-]\s*", re.IGNORECASE)
# "1. yes 2. no" on one line: split before every "N." that is followed by an answer.
# (A split starts at a comma or at a run's first space, never inside the run: linear on long runs of spaces.)
_INLINE_SPLIT = re.compile(r"(?:[,;]|(?<!\s))\s++(?=(?:q|a)?\d{1,3}\s*+[.):]\s*+[*_`\"'\[(]*+\s*+(?:yes|no)\b)", re.IGNORECASE)


class QuestionList(list):
    """A ``list[str]`` of parsed questions that also carries ``dropped``: counts of what was left out and why."""

    def __init__(self, questions=(), dropped: dict[str, int] | None = None):
        super().__init__(questions)
        self.dropped: dict[str, int] = dict(dropped or {"empty": 0, "not_yes_no": 0, "duplicate": 0})


def _strip_markup(s: str) -> str:
    return s.strip().strip(_MARKUP).strip()


def _question_key(q: str) -> str:
    return " ".join(_KEY_WORD.findall(q.lower()))


def _items(text: str):
    """(question, why dropped) for each list item of a reply, in order: ("Is it X?", None), ("", "empty"),
    ("", "not_yes_no") or ("Is it X?", "duplicate"); prose lines around the list yield nothing."""
    seen: set[str] = set()
    for line in text.splitlines():
        m = _NUMBERED.match(line)
        if m and m.group(2) is not None and not line.strip().startswith(("#",)):
            content = m.group(2)
        else:
            b = _BULLET.match(line)
            if not b:
                continue  # prose around the list
            content = b.group(1)
        content = _strip_markup(content)
        content = re.sub(r"^(?:question|q)\s*:\s*", "", content, flags=re.IGNORECASE)
        content = _strip_markup(content)
        if "?" in content:
            content = content[: content.index("?") + 1]
        content = " ".join(_INVISIBLE.sub("", content).split())
        first = re.search("[A-Za-z]", content)  # the question starts at its first word ("1.5 Is", an emoji, a dash)
        content = content[first.start():] if first else content
        words = _WORD.findall(content)
        if not words:
            yield "", "empty"
            continue
        if words[0].lower() not in YES_NO_AUXILIARIES or len(words) < 2:
            yield "", "not_yes_no"
            continue
        content = content.rstrip(" .:;,!")
        if not content.endswith("?"):
            content += "?"
        content = content[0].upper() + content[1:]
        key = _question_key(content)
        yield content, "duplicate" if key in seen else None
        seen.add(key)


def parse_questions(text: str) -> QuestionList:
    """Questions from a numbered (or bulleted) list; prose lines around the list are ignored.

    Dropped, and counted in ``result.dropped``: empty items ("empty"), items that are not yes/no questions,
    such as "What is ...?" or the template's "First simple yes/no question" ("not_yes_no"), and repeats of
    an earlier question, ignoring case and punctuation ("duplicate"). Zero-width and bidi control characters are
    removed, and a question starts at its first letter (no leading emoji, dash or stray digit). Anything after the first "?" of an
    item is cut ("Is it X? (yes for positives)" -> "Is it X?"); a yes/no question without "?" gets one.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected the reply text (str), got {type(text).__name__}")
    out = QuestionList()
    for question, dropped in _items(text):
        if dropped is None:
            out.append(question)
        else:
            out.dropped[dropped] += 1
    return out


LOOP_REPEATS = 2  # items in a row that repeat earlier ones: the reply has begun to loop


def loops(text: str) -> bool:
    """Whether a question list has begun to loop: its last ``LOOP_REPEATS`` items, among its complete lines (up to
    the last newline), each repeat an earlier question (what ``parse_questions`` drops as "duplicate"). The engines
    (embedded, OpenAI-compatible servers, vLLM) stop decoding a ``Request.stop_on_loop`` reply there, where greedy decoding would repeat to ``max_tokens``."""
    items = [dropped for _, dropped in _items(text[: text.rfind("\n") + 1])]
    return len(items) >= LOOP_REPEATS and all(d == "duplicate" for d in items[-LOOP_REPEATS:])


def _answer_of(content: str) -> bool | None | str:
    """True/False for a readable answer, None for a question echo without an answer, "?" when unreadable."""
    content = _strip_markup(content)
    content = _strip_markup(_ANSWER_PREFIX.sub("", content))
    if "?" in content:  # an echoed question, maybe followed by its answer: "Is it X? - Yes"
        content = content[content.rindex("?") + 1 :].strip(_MARKUP + "-\u2013\u2014:=>")
        content = _strip_markup(_ANSWER_PREFIX.sub("", content))
        if not content:
            return None
    if _AMBIGUOUS.match(content):
        return "?"
    m = _ANSWER_WORD.match(content)
    if not m:
        return "?"
    return m.group(1).lower() == "yes"


def parse_answers(text: str, n: int) -> list[bool]:
    """Exactly ``n`` yes/no answers (True = yes), in question order, or ``ParseError``.

    Accepts "1. yes", "1) Yes.", "1: no", "1 - No", "**1.** Yes", "1. **No**", "Q1: yes", "Answer 1: no",
    "1. Yes, because ...", "1. Is it X? Yes", answers on one line ("1. yes 2. no"), prose before and after,
    a missing final newline; and, when no line is numbered, exactly ``n`` lines that each start with yes/no.
    Raises on: a wrong number of answers, a missing or out-of-range number, a numbered line without a
    readable answer ("1. maybe", "1. yes/no"), and two different answers for one number.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected the reply text (str), got {type(text).__name__}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    numbered: dict[int, bool] = {}
    bare: list[bool] = []
    problems: list[str] = []
    for line in _INLINE_SPLIT.sub("\n", text).splitlines():
        if not line.strip():
            continue
        m = _NUMBERED.match(line)
        if m:
            num = int(m.group(1))
            ans = _answer_of(m.group(2))
            if ans is None:
                continue  # "3. Is the text about X?" echoed without an answer
            if ans == "?":
                problems.append(f"line {line.strip()[:60]!r} has no yes/no answer")
                continue
            if num < 1 or num > n:
                problems.append(f"answer number {num} is outside 1..{n}")
                continue
            if num in numbered and numbered[num] != ans:
                problems.append(f"two different answers for question {num}")
                continue
            numbered[num] = bool(ans)
        else:
            ans = _answer_of(line)
            if isinstance(ans, bool) and _strip_markup(line)[:3].lower() in ("yes", "no", "no.", "no,", "no!"):
                bare.append(ans)
    if problems:
        raise ParseError("; ".join(problems), text)
    if numbered:
        missing = [i for i in range(1, n + 1) if i not in numbered]
        if missing:
            raise ParseError(f"{len(numbered)} answers, expected {n}: missing {missing[:10]}", text)
        return [numbered[i] for i in range(1, n + 1)]
    if len(bare) == n:
        return bare
    raise ParseError(f"{len(bare)} answers, expected {n}" if bare else "no answers found", text)


_OFFSET = re.compile(
    r"^[\s>#*_`\-\u2022]*(?:q|a|answer)?\s*(\d{1,3})\s*(?:[.):\]]|-)?[\s*_`\"'\[(]*(?:answer\s*:\s*)?(yes|no)\b",
    re.IGNORECASE | re.MULTILINE,
)


def answer_offsets(text: str) -> dict[int, int]:
    """Character offset of the yes/no word of each numbered answer line (first occurrence per number)."""
    out: dict[int, int] = {}
    for m in _OFFSET.finditer(text):
        out.setdefault(int(m.group(1)), m.start(2))
    return out


def _side(token: str) -> str | None:
    t = token.strip(" \t\n.):*_\"'`[(-").lower()
    if t in ("yes", "ye", "y"):
        return "yes"
    if t in ("no", "n"):
        return "no"
    return None


def p_yes_from_tokens(tokens: list[tuple[str, float, dict[str, float]]], n: int) -> list[float | None]:
    """P(yes) for answers 1..n from generated tokens and their top alternatives (natural-log probabilities).

    ``tokens`` is ``[(token_text, logprob, {alternative_text: logprob, ...}), ...]`` in generation order.
    For each answer line the token that holds its yes/no word is found; P(yes) = p(yes-like) / (p(yes-like)
    + p(no-like)) over the chosen token and its alternatives at that position, where "Yes", " yes", "y"
    count as yes and "No", " no", "n" as no. None where the line or any yes/no probability mass is missing.
    """
    text = "".join(t for t, _, _ in tokens)
    starts, pos = [], 0
    for t, _, _ in tokens:
        starts.append(pos)
        pos += len(t)
    offsets = answer_offsets(text)
    out: list[float | None] = []
    for i in range(1, n + 1):
        off = offsets.get(i)
        if off is None:
            out.append(None)
            continue
        chosen, lp, alts = tokens[bisect.bisect_right(starts, off) - 1]
        cand = {**alts, chosen: lp}
        py = sum(math.exp(v) for tok, v in cand.items() if _side(tok) == "yes")
        pn = sum(math.exp(v) for tok, v in cand.items() if _side(tok) == "no")
        out.append(py / (py + pn) if py + pn > 0 else None)
    return out


def p_yes_from_top(tokens: list[tuple[str, float, dict[str, float]]]) -> float | None:
    """P(yes) of a single-pass answer from its first generated position: p(yes-like) / (p(yes-like) + p(no-like))
    over the chosen token and its top alternatives ("Yes", " yes", "y" / "No", " no", "n"). None when the position
    is missing or holds no yes/no token at all; a side absent from the top alternatives counts as 0."""
    if not tokens:
        return None
    chosen, lp, alts = tokens[0]
    cand = {**alts, chosen: lp}
    py = sum(math.exp(v) for tok, v in cand.items() if _side(tok) == "yes")
    pn = sum(math.exp(v) for tok, v in cand.items() if _side(tok) == "no")
    return py / (py + pn) if py + pn > 0 else None
