import math

import pytest

from cqg_ray.llm.parse import ParseError, answer_offsets, loops, p_yes_from_tokens, parse_answers, parse_questions

# ----------------------------------------------------------------------------- answers that parse

GOOD_ANSWERS = [
    ("1. yes\n2. no\n3. yes\n", [True, False, True]),  # the grammar's format
    ("1. yes\n2. no\n3. yes", [True, False, True]),  # no final newline
    ("1. yes\n2. no\n3. yes\n\n\n", [True, False, True]),  # trailing blank lines
    ("1) Yes.\n2) No.\n3) Yes.", [True, False, True]),
    ("1. **No**\n2. **Yes**\n3. **No**", [False, True, False]),
    ("**1.** Yes\n**2.** No\n**3.** Yes", [True, False, True]),
    ("**1. Yes**\n**2. No**\n**3. Yes**", [True, False, True]),
    ("1: yes\n2: no\n3: yes", [True, False, True]),
    ("1 - yes\n2 - no\n3 - yes", [True, False, True]),
    ("1.Yes\n2.No\n3.Yes", [True, False, True]),
    ("1. YES\n2. NO\n3. YES", [True, False, True]),
    ("1. *yes*\n2. _no_\n3. `yes`", [True, False, True]),
    ("1. [Yes]\n2. (No)\n3. \"yes\"", [True, False, True]),
    ("- 1. yes\n- 2. no\n- 3. yes", [True, False, True]),
    ("  1. yes\n  2. no\n  3. yes", [True, False, True]),
    ("Q1: yes\nQ2: no\nQ3: yes", [True, False, True]),
    ("Answer 1: Yes\nAnswer 2: No\nAnswer 3: Yes", [True, False, True]),
    ("1. Answer: yes\n2. Answer: no\n3. Answer: yes", [True, False, True]),
    ("Here are my answers:\n1. yes\n2. no\n3. yes\nLet me know if you need more.", [True, False, True]),
    ("Sure! Based on the text:\n\n1. Yes\n2. No\n3. Yes\n\nExplanation: the text talks about apples.", [True, False, True]),
    ("1. Yes, the text mentions it.\n2. No, it does not.\n3. Yes - clearly.", [True, False, True]),
    ("1. Yes (the second sentence)\n2. No\n3. Yes", [True, False, True]),
    ("1. No.\n2. Yes!\n3. no,", [False, True, False]),
    ("1. Is it about AI? Yes\n2. Is it about sports? No\n3. Is it about food? - Yes", [True, False, True]),
    ("1. Is it about AI? **Yes**\n2. Is it about sports? -> No\n3. Is it about food?: yes", [True, False, True]),
    ("Questions:\n1. Is it about AI?\n2. Is it about sports?\n3. Is it about food?\n\nAnswers:\n1. yes\n2. no\n3. yes", [True, False, True]),
    ("1. yes 2. no 3. yes", [True, False, True]),  # one line
    ("1. yes, 2. no, 3. yes", [True, False, True]),
    ("1. yes; 2. no; 3. yes", [True, False, True]),
    ("3. yes\n1. no\n2. yes", [False, True, True]),  # out of order: numbers decide
    ("1. yes\n1. yes\n2. no\n3. no", [True, False, False]),  # identical repeat
    ("Yes\nNo\nYes", [True, False, True]),  # unnumbered, exact count
    ("yes.\nno.\nyes.", [True, False, True]),
    ("1. yes\n2. no\n3. yes\n(Note: 4 questions were not asked)", [True, False, True]),
    ("1]  yes\n2]  no\n3]  yes", [True, False, True]),
    ("> 1. yes\n> 2. no\n> 3. yes", [True, False, True]),
    ("### Answers\n1. yes\n2. no\n3. yes", [True, False, True]),
    ("1. yes\r\n2. no\r\n3. yes\r\n", [True, False, True]),  # Windows line ends
]


@pytest.mark.parametrize("text,expected", GOOD_ANSWERS)
def test_parse_answers_tolerates_variants(text, expected):
    assert parse_answers(text, 3) == expected


def test_parse_answers_twenty():
    text = "".join(f"{i}. {'yes' if i % 3 == 0 else 'no'}\n" for i in range(1, 21))
    assert parse_answers(text, 20) == [i % 3 == 0 for i in range(1, 21)]


def test_parse_answers_two_digit_numbers_on_one_line():
    text = " ".join(f"{i}. no" for i in range(1, 13))
    assert parse_answers(text, 12) == [False] * 12


# ----------------------------------------------------------------------------- answers that must raise

BAD_ANSWERS = [
    ("", "no answers found"),
    ("I cannot answer these questions.", "no answers found"),
    ("1. yes\n2. no", "missing \\[3\\]"),  # too few
    ("1. yes\n3. no", "2 answers, expected 3: missing \\[2\\]"),
    ("1. yes\n2. no\n3. yes\n4. no", "outside 1..3"),  # too many
    ("0. yes\n1. no\n2. yes", "outside 1..3"),
    ("1. yes/no\n2. yes/no\n3. yes/no", "no yes/no answer"),  # template echo
    ("1. Yes or no\n2. no\n3. yes", "no yes/no answer"),
    ("1. yes and no\n2. no\n3. yes", "no yes/no answer"),
    ("1. maybe\n2. no\n3. yes", "no yes/no answer"),
    ("1. Unclear\n2. no\n3. yes", "no yes/no answer"),
    ("1. The text does not say\n2. no\n3. yes", "no yes/no answer"),
    ("1. True\n2. False\n3. True", "no yes/no answer"),  # not yes/no: never guessed
    ("1. Yeah\n2. Nope\n3. Yes", "no yes/no answer"),
    ("1. yes\n1. no\n2. no\n3. yes", "two different answers for question 1"),
    ("Yes\nNo", "2 answers, expected 3"),  # unnumbered, wrong count
    ("Yes\nNo\nYes\nNo", "4 answers, expected 3"),
    ("1.\n2.\n3.", "no yes/no answer"),
]


@pytest.mark.parametrize("text,message", BAD_ANSWERS)
def test_parse_answers_never_guesses(text, message):
    with pytest.raises(ParseError, match=message) as info:
        parse_answers(text, 3)
    assert info.value.text == text


def test_parse_answers_argument_errors():
    with pytest.raises(ValueError):
        parse_answers("1. yes", 0)
    with pytest.raises(TypeError):
        parse_answers(None, 1)


# ----------------------------------------------------------------------------- questions

def test_parse_questions_numbered_list():
    text = (
        "Here are 10 questions:\n"
        "1. Does the article mention echolocation?\n"
        "2) Is the animal a mammal that lives in the ocean?\n"
        "3. **Does the text describe hunting behaviour?**\n"
        "\n"
        "These should separate the groups."
    )
    qs = parse_questions(text)
    assert qs == [
        "Does the article mention echolocation?",
        "Is the animal a mammal that lives in the ocean?",
        "Does the text describe hunting behaviour?",
    ]
    assert qs.dropped == {"empty": 0, "not_yes_no": 0, "duplicate": 0}


def test_parse_questions_drops_and_counts():
    text = (
        "1. Is it about cats?\n"
        "2. What is the main topic?\n"  # not yes/no
        "3. How many animals are named?\n"  # not yes/no
        "4. is it about CATS\n"  # duplicate (case, punctuation)
        "5.\n"  # empty
        "6. First simple yes/no question\n"  # template echo: not a question
        "7. Does it mention a date? (yes for positives, no for negatives)\n"
        "8. ** **\n"  # empty
        "9. Can it fly\n"  # no '?': kept, '?' added
        "10. Does it mention a date?\n"  # duplicate
    )
    qs = parse_questions(text)
    assert list(qs) == ["Is it about cats?", "Does it mention a date?", "Can it fly?"]
    assert qs.dropped == {"empty": 2, "not_yes_no": 3, "duplicate": 2}


def test_parse_questions_other_list_styles():
    text = "Question 1: Does it rain?\nQ2. Has it snowed?\n- Are there clouds?\n* Was it windy?\n3 - Will it be sunny?"
    assert parse_questions(text) == ["Does it rain?", "Has it snowed?", "Are there clouds?", "Was it windy?", "Will it be sunny?"]


def test_parse_questions_is_a_list_and_handles_prose_only():
    qs = parse_questions("I am sorry, I cannot help with that.")
    assert qs == []
    assert isinstance(qs, list)
    assert qs.dropped == {"empty": 0, "not_yes_no": 0, "duplicate": 0}


def test_parse_questions_lowercase_first_letter_is_capitalised():
    assert parse_questions("1. does it rain?") == ["Does it rain?"]


# ----------------------------------------------------------------------------- P(yes) from logprobs

def test_answer_offsets():
    text = "1. yes\n2. no\n"
    assert answer_offsets(text) == {1: 3, 2: 10}


def test_p_yes_from_tokens():
    tokens = [
        ("1", -0.01, {}),
        (".", -0.01, {}),
        (" yes", math.log(0.8), {" no": math.log(0.2)}),
        ("\n", 0.0, {}),
        ("2", 0.0, {}),
        (".", 0.0, {}),
        (" no", math.log(0.6), {" yes": math.log(0.3), " maybe": math.log(0.1)}),
        ("\n", 0.0, {}),
    ]
    p = p_yes_from_tokens(tokens, 3)
    assert p[0] == pytest.approx(0.8)
    assert p[1] == pytest.approx(0.3 / 0.9)
    assert p[2] is None  # no third line


def test_p_yes_counts_case_and_space_variants_together():
    tokens = [("1. ", 0.0, {}), ("Yes", math.log(0.5), {"yes": math.log(0.2), " no": math.log(0.2), "No": math.log(0.1)})]
    assert p_yes_from_tokens(tokens, 1) == [pytest.approx(0.7)]


@pytest.mark.timeout(10)
def test_long_runs_of_spaces_parse_in_linear_time():
    """A degenerate reply (a small model's run of spaces) once took seconds to tens of seconds in the regexes (the
    timeout is the check: quadratic, these took over 40 s)."""
    for text in (" " * 50000 + "x", "\t " * 25000, "**" + " " * 50000 + "x", "1" + " " * 50000 + "x", "> " * 25000 + "x"):
        assert parse_questions(text) == []
        with pytest.raises(ParseError):
            parse_answers(text, 2)
    assert parse_answers("1. yes ," + " " * 50000 + "2. no", 2) == [True, False]


def test_questions_start_at_their_first_word_and_numbers_tell_them_apart():
    reply = ("1.5 Is it about cats?\n2. \u200b\u202eIs it about dogs?\n3. \U0001F642 Is it a bird?\n4. \u2014 Does it bark?\n"
             "5. Is it about World War 1?\n6. Is it about World War 2?\n7. is it about world war 1 ?")
    qs = parse_questions(reply)
    assert qs == ["Is it about cats?", "Is it about dogs?", "Is it a bird?", "Does it bark?", "Is it about World War 1?", "Is it about World War 2?"]
    assert qs.dropped == {"empty": 0, "not_yes_no": 0, "duplicate": 1}


DEMO_LOOP = ("1. Is the text about a movie or film?\n2. Is the text about a comedy?\n3. Is the text about a director?\n"
             "4. Is the text about a scene or sequence?\n5. Is the text about a movie or film?\n6. Is the text about a comedy?\n"
             "7. Is the text about a director?\n8. Is the")  # a demo's reply (cluster 14, 2026-12-07) that looped to max_tokens


def test_loops_after_two_items_in_a_row_repeat_earlier_ones():
    cuts = [i + 1 for i, ch in enumerate(DEMO_LOOP) if ch == "\n"]
    assert [loops(DEMO_LOOP[:c]) for c in cuts] == [False, False, False, False, False, True, True]
    assert not loops(DEMO_LOOP[: cuts[5] - 1])  # the sixth line not yet complete
    assert loops("Here are the questions:\n1. Is it red?\n2. Is it blue?\n\n3. Is it RED\n4. is it blue!\n")  # markup and case as the parse sees them
    assert not loops("1. Is it red?\n2. Is it red?\n3. Is it green?\n4. Is it blue?\n")  # one repeat, then a new question
    assert loops("1. Is it red?\n2. Is it blue?\n3. Is it red?\nA line of prose.\n4. Is it blue?\n")  # prose is not an item
    assert not loops("1. Is it red?\n2. Is it red?\n3. What colour is it?\n")  # an item that is no yes/no question ends a run
    assert not loops("") and not loops("1. Is it red?\n")
