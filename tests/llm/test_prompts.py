import pytest

from cqg_ray.llm.prompts import (
    QAEMB_EXAMPLE_QUESTIONS,
    answer_messages,
    answer_prompt,
    chunk_questions,
    clip_text,
    cqg_messages,
    cqg_prompt,
    qaemb_messages,
    qaemb_prompt,
)

GOLDEN_CQG = """Generate 10 simple yet insightful yes/no questions that determine the properties of an article, where for all questions, the answer \
will be "yes" for ALL the positive articles and "no" for ALL the negative articles. Keep questions concise and avoid using complex sentence \
structures with "and" or "or" unless necessary.

Positive Articles:
Positive 1. Whales use echolocation.
Positive 2. Dolphins click to find fish.

Negative Articles:
Negative 1. Sharks have cartilage.
Negative 2. Eagles have sharp eyes.
Negative 3. Deer eat leaves.

Instruction: Based on the excerpts provided, generate 10 simple yet insightful yes/no questions that can accurately differentiate the positive \
articles from the negative articles. Each question should be concise and framed in such a way that it will elicit a "yes" response for ALL positive \
articles and a "no" response for ALL negative articles. Avoid using complex sentence structures with "and" or "or" unless absolutely necessary. \
Format the questions in a numbered list as shown below:
1. First simple yes/no question
2. Second simple yes/no question"""

GOLDEN_QAEMB = """Generate 10 diverse insightful yes/no questions that determine the properties of an article.

Reference Articles:
1. The match ended in a draw.
2. Bake the bread for 40 minutes.

Example Questions:
1. Does the input mention laughter?
2. Does the input contain a number?

Instruction: Based on the excerpts provided, generate 10 yes/no questions that can determine the properties of the articles. Format the questions in \
a numbered list as shown below:
1. First yes/no question
2. Second yes/no question"""

GOLDEN_ANSWER = """Evaluate the following text chunk based on the yes/no questions provided.

Text Chunk:
Apple is a technology company.

Questions:
1. Is the article about AI?
2. Is the article about sports?
3. Is the article about food?

Instruction for the model: Please read the provided text chunk and answer each of the questions with either "yes" or "no". Format the responses as follows:
1. yes/no
2. yes/no"""


def test_cqg_prompt_is_appendix_a1():
    got = cqg_prompt(
        ["Whales use echolocation.", "Dolphins click to find fish."],
        ["Sharks have cartilage.", "Eagles have sharp eyes.", "Deer eat leaves."],
    )
    assert got == GOLDEN_CQG


def test_cqg_messages_is_one_user_message():
    msgs = cqg_messages(["a"], ["b"])
    assert len(msgs) == 1
    assert msgs[0]["role"] == "user"
    assert msgs[0]["content"] == cqg_prompt(["a"], ["b"])


def test_cqg_question_count_is_substituted():
    got = cqg_prompt(["a"], ["b"], n_questions=5)
    assert got.startswith("Generate 5 simple yet insightful")
    assert "generate 5 simple yet insightful yes/no questions that can accurately" in got
    assert "10" not in got


def test_qaemb_prompt_is_appendix_a2():
    got = qaemb_prompt(
        ["The match ended in a draw.", "Bake the bread for 40 minutes."],
        ["Does the input mention laughter?", "Does the input contain a number?"],
    )
    assert got == GOLDEN_QAEMB


def test_qaemb_default_examples():
    assert len(QAEMB_EXAMPLE_QUESTIONS) == 9
    assert all(q.endswith("?") for q in QAEMB_EXAMPLE_QUESTIONS)
    msgs = qaemb_messages(["x"])
    assert "Example Questions:\n1. Is the input related to food preparation?\n2. Does the input mention laughter?\n" in msgs[0]["content"]
    assert "9. Is the input related to physical injury or trauma?\n\nInstruction:" in msgs[0]["content"]


def test_answer_prompt_is_appendix_a3():
    got = answer_prompt(
        "Apple is a technology company.",
        ["Is the article about AI?", "Is the article about sports?", "Is the article about food?"],
    )
    assert got == GOLDEN_ANSWER


def test_answer_prompts_for_one_text_share_the_text_as_prefix():
    text = "A long text chunk about the history of bread baking in Europe."
    a = answer_messages(text, ["Is it about bread?"])[0]["content"]
    b = answer_messages(text, ["Is it about Asia?", "Does it mention yeast?"])[0]["content"]
    prefix = "Evaluate the following text chunk based on the yes/no questions provided.\n\nText Chunk:\n" + text + "\n\nQuestions:\n1. Is it about "
    assert a.startswith(prefix)
    assert b.startswith(prefix)


def test_prompt_input_errors():
    with pytest.raises(ValueError, match="positives must not be empty"):
        cqg_prompt([], ["b"])
    with pytest.raises(TypeError, match="list of strings"):
        cqg_prompt("abc", ["b"])
    with pytest.raises(TypeError, match=r"negatives\[1\] is int"):
        cqg_prompt(["a"], ["b", 3])
    with pytest.raises(ValueError, match="questions must not be empty"):
        answer_prompt("t", [])
    with pytest.raises(ValueError, match="at most 100"):
        answer_prompt("t", ["Is it?"] * 101)
    with pytest.raises(ValueError, match="n_questions"):
        qaemb_prompt(["a"], n_questions=0)


def test_chunk_questions():
    qs = [f"Q{i}?" for i in range(45)]
    chunks = chunk_questions(qs, 20)
    assert [len(c) for c in chunks] == [20, 20, 5]
    assert chunks[2] == ["Q40?", "Q41?", "Q42?", "Q43?", "Q44?"]
    assert chunk_questions([], 20) == []


def test_clip_text():
    assert clip_text("short", 10) == "short"
    assert clip_text("one two three four five", 16) == "one two three"
    assert clip_text("one two three four five", 12) == "one two thre"
    assert clip_text("abcdefghijklmnop", 5) == "abcde"
    with pytest.raises(ValueError):
        clip_text("x", 0)


def test_judge_prompt_is_an_instruction_the_text_and_the_question():
    from cqg_ray.llm.prompts import judge_messages, judge_prompt

    instruction = ("Read the text and answer the question about it with yes or no. Answer no when the text does not say so "
                   "or the question makes no sense.")
    assert judge_prompt("A dog runs.", "Does the text describe an animal?") == (
        f"{instruction}\n\nText: A dog runs.\n\nQuestion: Does the text describe an animal?")
    assert judge_messages("t", "q?") == [{"role": "user", "content": f"{instruction}\n\nText: t\n\nQuestion: q?"}]
    with pytest.raises(ValueError, match="non-empty"):
        judge_prompt("t", "  ")


def test_the_judge_asks_after_four_worked_examples_as_chat_turns():
    from cqg_ray.llm.prompts import JUDGE_SHOTS, judge_messages, judge_prompt, judge_shot_messages

    m = judge_shot_messages("t", "q?")
    assert len(m) == 2 * len(JUDGE_SHOTS) + 1 == 9 and m[-1:] == judge_messages("t", "q?")
    assert [x["role"] for x in m] == ["user", "assistant"] * 4 + ["user"]
    assert [x["content"] for x in m[1:8:2]] == ["yes", "no", "yes", "no"]
    assert m[0]["content"] == judge_prompt(*JUDGE_SHOTS[0][:2])
