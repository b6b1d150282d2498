"""The paper's prompts (CQG-MBQA, Appendix A), word for word, as chat messages.

    cqg_messages(positives, negatives)          A.1  Contrastive Question Generation (n_p positives, n_h + n_e negatives)
    qaemb_messages(articles, examples)          A.2  QAEmb question generation (the baseline)
    answer_messages(text_chunk, questions)      A.3  yes/no answering, 20 questions per prompt in the paper (packed mode; at most 100)
    single_answer_messages(text_chunk, question)     A.3 with one question (single-pass mode: P(yes) from one position)
    property_messages(positives, negatives)     not the paper's: CQG asking for properties (system rules + worked examples)
    judge_messages(text, question)              not the paper's: the faithfulness judge's plain yes/no question
    judge_shot_messages(text, question)         the same after four worked examples: what the faithfulness judge asks

The paper's prompts return ``[{"role": "user", "content": ...}]``; the chat template is the model's (llama.cpp reads
it from the GGUF, vLLM and OpenAI-compatible servers from the tokenizer), so no system prompt is added to them.
The bold headings of the paper's boxes are written as plain text ("Positive Articles:"), and the paper's
typographic quotes as straight ones ("yes"). In A.3 the text chunk comes before the questions, so every
prompt about the same text shares one long prefix (what prefix caching in llama.cpp and vLLM reuses).
"""

from __future__ import annotations

Message = dict[str, str]

MAX_QUESTIONS_PER_ANSWER_PROMPT = 100

# Example questions for the QAEmb baseline (A.2): the general-purpose "semantic" examples of the QAEmb paper
# (Benara et al., 2024, "Crafting interpretable embeddings by asking LLMs questions").
QAEMB_EXAMPLE_QUESTIONS: tuple[str, ...] = (
    "Is the input related to food preparation?",
    "Does the input mention laughter?",
    "Does the input contain a number?",
    "Is time mentioned in the input?",
    "Is a specific location referred to in the input?",
    "Does the input contain a measurement?",
    "Does the input contain negativity?",
    "Is hair or clothing mentioned in the input?",
    "Is the input related to physical injury or trauma?",
)


def _user(content: str) -> list[Message]:
    return [{"role": "user", "content": content}]


def _check_texts(name: str, texts: list[str] | tuple[str, ...]) -> None:
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, not one string")
    if not texts:
        raise ValueError(f"{name} must not be empty")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] is {type(t).__name__}, expected str")


def clip_text(text: str, max_chars: int) -> str:
    """Cut a text to at most ``max_chars`` characters, at a word boundary when one is near the end."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    space = cut.rfind(" ")
    if space >= max_chars * 0.8:
        cut = cut[:space]
    return cut.rstrip()


def _check_contrast(positives: list[str], negatives: list[str], n_questions: int) -> None:
    _check_texts("positives", positives)
    _check_texts("negatives", negatives)
    if n_questions < 1:
        raise ValueError(f"n_questions must be >= 1, got {n_questions}")


def cqg_prompt(positives: list[str], negatives: list[str], n_questions: int = 10) -> str:
    """A.1: contrastive question generation. Positives are the cluster's n_p texts, negatives its n_h + n_e."""
    _check_contrast(positives, negatives, n_questions)
    pos = "\n".join(f"Positive {i}. {t}" for i, t in enumerate(positives, 1))
    neg = "\n".join(f"Negative {i}. {t}" for i, t in enumerate(negatives, 1))
    return (
        f"Generate {n_questions} simple yet insightful yes/no questions that determine the properties of an article, "
        'where for all questions, the answer will be "yes" for ALL the positive articles and "no" for ALL the negative '
        'articles. Keep questions concise and avoid using complex sentence structures with "and" or "or" unless necessary.\n'
        "\n"
        "Positive Articles:\n"
        f"{pos}\n"
        "\n"
        "Negative Articles:\n"
        f"{neg}\n"
        "\n"
        f"Instruction: Based on the excerpts provided, generate {n_questions} simple yet insightful yes/no questions that "
        "can accurately differentiate the positive articles from the negative articles. Each question should be concise "
        'and framed in such a way that it will elicit a "yes" response for ALL positive articles and a "no" response for '
        'ALL negative articles. Avoid using complex sentence structures with "and" or "or" unless absolutely necessary. '
        "Format the questions in a numbered list as shown below:\n"
        "1. First simple yes/no question\n"
        "2. Second simple yes/no question"
    )


def qaemb_prompt(articles: list[str], example_questions: list[str] | tuple[str, ...] = QAEMB_EXAMPLE_QUESTIONS, n_questions: int = 10) -> str:
    """A.2: the QAEmb baseline's example-based question generation (random reference articles + example questions)."""
    _check_texts("articles", articles)
    _check_texts("example_questions", example_questions)
    if n_questions < 1:
        raise ValueError(f"n_questions must be >= 1, got {n_questions}")
    arts = "\n".join(f"{i}. {t}" for i, t in enumerate(articles, 1))
    exs = "\n".join(f"{i}. {q}" for i, q in enumerate(example_questions, 1))
    return (
        f"Generate {n_questions} diverse insightful yes/no questions that determine the properties of an article.\n"
        "\n"
        "Reference Articles:\n"
        f"{arts}\n"
        "\n"
        "Example Questions:\n"
        f"{exs}\n"
        "\n"
        f"Instruction: Based on the excerpts provided, generate {n_questions} yes/no questions that can determine the "
        "properties of the articles. Format the questions in a numbered list as shown below:\n"
        "1. First yes/no question\n"
        "2. Second yes/no question"
    )


def answer_prompt(text_chunk: str, questions: list[str]) -> str:
    """A.3: answer each question about one text chunk with yes or no. The text comes first (shared prefix)."""
    if not isinstance(text_chunk, str):
        raise TypeError(f"text_chunk is {type(text_chunk).__name__}, expected str")
    _check_texts("questions", questions)
    if len(questions) > MAX_QUESTIONS_PER_ANSWER_PROMPT:
        raise ValueError(f"{len(questions)} questions in one prompt; at most {MAX_QUESTIONS_PER_ANSWER_PROMPT} (the paper uses 20)")
    qs = "\n".join(f"{i}. {q}" for i, q in enumerate(questions, 1))
    return (
        "Evaluate the following text chunk based on the yes/no questions provided.\n"
        "\n"
        "Text Chunk:\n"
        f"{text_chunk}\n"
        "\n"
        "Questions:\n"
        f"{qs}\n"
        "\n"
        'Instruction for the model: Please read the provided text chunk and answer each of the questions with either "yes" '
        'or "no". Format the responses as follows:\n'
        "1. yes/no\n"
        "2. yes/no"
    )


SINGLE_ANSWER_PREFIX = "1."  # the start of the model's reply: the next token is its " yes" or " no"


def single_answer_prompt(text_chunk: str, question: str) -> str:
    """A.3 with one question, for single-pass answering: the reply starts with ``SINGLE_ANSWER_PREFIX`` ("1.") and
    P(yes) is read from the next token's logits.

    Where it differs from A.3, and why: one question instead of a list; the instruction ("answer each question with
    either yes or no") comes before the text instead of after the questions, so everything up to "Questions:" is a
    prefix shared by all questions about the text (computed once) and each question costs only its own line; the
    answer-format lines ("1. yes/no") are replaced by the reply's own start "1.", after which the model's next token
    is its answer. (Measured on the bundled models, this reads the answer better than a bare "Question: ..." with
    the reply's first token: see docs/answer-modes.md.)
    """
    if not isinstance(text_chunk, str):
        raise TypeError(f"text_chunk is {type(text_chunk).__name__}, expected str")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty string")
    return (
        'Evaluate the following text chunk based on the yes/no questions provided. Answer each question with either "yes" or "no".\n'
        "\n"
        "Text Chunk:\n"
        f"{text_chunk}\n"
        "\n"
        "Questions:\n"
        f"1. {question}"
    )


def single_answer_messages(text_chunk: str, question: str) -> list[Message]:
    """The user message of ``single_answer_prompt``; the request carries ``answer_prefix=SINGLE_ANSWER_PREFIX``."""
    return _user(single_answer_prompt(text_chunk, question))


JUDGE_INSTRUCTION = ("Read the text and answer the question about it with yes or no. Answer no when the text does not say "
                     "so or the question makes no sense.")


PROPERTY_SYSTEM = (
    "You write yes/no questions that describe what a group of texts has in common: the things, actions, roles, places, "
    "topics or problems they are about, or the kind of text they are. A good question is true of every positive text, "
    "false of every negative text, and would also be true of other texts like the positives. Rules: be specific (not "
    "\"Is the text about a topic?\"); never copy a phrase from the texts; never name a person, place, number or title "
    "that appears in only one text; at most 12 words per question; one property per question; no two questions alike; "
    "vary how the questions begin. Reply with a numbered list of questions only."
)

PROPERTY_KEYWORDS_RULE = " The words typical of texts like the positives, when given, point to what they share."

# Worked examples (chat turns) on topics of their own: (positives, negatives, questions), short texts like the corpus's
# (captions, reviews, news); each question names a property the positives share and its keywords point to.
PROPERTY_EXAMPLES: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    (("A brown dog leaps to catch a frisbee.",
      "Two puppies play tug of war on the grass.",
      "A dog runs through the snow with a stick in its mouth."),
     ("A man is slicing onions in a kitchen.",
      "The council approved the new budget on Tuesday.",
      "This blender is loud but powerful."),
     ("Is a dog or other pet shown?",
      "Does an animal play, run or jump?",
      "Does the scene take place outdoors?",
      "Is an animal carrying or catching an object?")),
    (("The battery barely lasts a day now.",
      "Charging takes forever with the supplied cable.",
      "After the update my phone dies by noon."),
     ("The hotel room was spotless and quiet.",
      "Add the garlic once the oil is hot.",
      "The striker scored in the final minute."),
     ("Does the writer complain about battery life?",
      "Is a phone or other electronic device discussed?",
      "Are charging or power problems mentioned?",
      "Has something got worse over time, according to the writer?")),
    (("Researchers found the enzyme slows tumour growth in mice.",
      "The trial showed the drug lowered blood pressure.",
      "A new vaccine protected monkeys against the virus."),
     ("Shares fell after the bank's earnings report.",
      "A girl in a red coat waits for the bus.",
      "The sequel is louder and dumber than the original."),
     ("Does the text report a medical research finding?",
      "Is a drug, vaccine or other treatment tested?",
      "Were animals used in the study described?",
      "Is a disease or a symptom mentioned?")),
)

# The worked examples' keywords (what ``cqg.keywords`` shows for a cluster), one tuple per example.
PROPERTY_EXAMPLE_KEYWORDS: tuple[tuple[str, ...], ...] = (
    ("dog", "puppies", "catch", "runs", "play", "grass", "snow", "frisbee"),
    ("battery", "charging", "phone", "lasts", "cable", "update", "dies", "day"),
    ("researchers", "trial", "drug", "mice", "vaccine", "virus", "growth", "tumour"),
)


def property_user(positives: list[str], negatives: list[str], n_questions: int, keywords: list[str] | tuple[str, ...] = ()) -> str:
    """The user turn of the property prompt: the texts, the positives' cluster keywords when given, then what to write."""
    _check_contrast(positives, negatives, n_questions)
    pos = "\n".join(f"{i}. {t}" for i, t in enumerate(positives, 1))
    neg = "\n".join(f"{i}. {t}" for i, t in enumerate(negatives, 1))
    kw = f"Words typical of texts like the positives: {', '.join(keywords)}\n\n" if keywords else ""
    return (f"Positive texts:\n{pos}\n\nNegative texts:\n{neg}\n\n{kw}"
            f"Write {n_questions} yes/no questions that are true of all positive texts and false of all negative texts.")


def property_messages(positives: list[str], negatives: list[str], n_questions: int = 10, examples: int = len(PROPERTY_EXAMPLES),
                      keywords: list[str] | tuple[str, ...] = ()) -> list[Message]:
    """CQG asking for properties rather than contents (``cqg.prompt: property``; the paper's A.1 is ``cqg_messages``):
    a system turn with the rules, ``examples`` worked examples as user/assistant turns, then this cluster's texts.
    With ``keywords`` (the cluster's c-TF-IDF words) every user turn, the examples' too, lists its keywords."""
    msgs: list[Message] = [{"role": "system", "content": PROPERTY_SYSTEM + (PROPERTY_KEYWORDS_RULE if keywords else "")}]
    for (pos, neg, qs), kw in zip(PROPERTY_EXAMPLES[:examples], PROPERTY_EXAMPLE_KEYWORDS):
        msgs.append({"role": "user", "content": property_user(list(pos), list(neg), len(qs), kw if keywords else ())})
        msgs.append({"role": "assistant", "content": "\n".join(f"{i}. {q}" for i, q in enumerate(qs, 1))})
    msgs.append({"role": "user", "content": property_user(positives, negatives, n_questions, keywords)})
    return msgs


def judge_prompt(text: str, question: str) -> str:
    """The faithfulness judge's prompt: an instruction, the text, the question (not the labelling prompt, so that the
    judge does not share the labeller's wording; everything before the question is shared by a text's questions).
    P(yes) is read from the reply's first token. Why this wording: docs/evaluation.md, "How far the judge is trusted"."""
    if not isinstance(text, str):
        raise TypeError(f"text is {type(text).__name__}, expected str")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty string")
    return f"{JUDGE_INSTRUCTION}\n\nText: {text}\n\nQuestion: {question}"


def judge_messages(text: str, question: str) -> list[Message]:
    return _user(judge_prompt(text, question))


# Worked examples for the judge as chat turns (text, question, answer): on topics and questions of their own, two that
# hold and two that do not, one of them near the text's topic without the text saying it.
JUDGE_SHOTS = (
    ("The bakery on Main Street sells fresh bread every morning.", "Is a shop or business mentioned?", "yes"),
    ("Two kids are splashing in the lake.", "Is a musical instrument mentioned?", "no"),
    ("The committee postponed its vote until next week.", "Is a decision or vote discussed?", "yes"),
    ("He repaired the fence behind the barn.", "Is the text about farming or crops?", "no"),
)


def judge_shot_messages(text: str, question: str) -> list[Message]:
    """``judge_messages`` after worked examples (``JUDGE_SHOTS``) as earlier chat turns."""
    turns: list[Message] = []
    for t, q, a in JUDGE_SHOTS:
        turns += [{"role": "user", "content": judge_prompt(t, q)}, {"role": "assistant", "content": a}]
    return turns + judge_messages(text, question)


def cqg_messages(positives: list[str], negatives: list[str], n_questions: int = 10) -> list[Message]:
    return _user(cqg_prompt(positives, negatives, n_questions))


def qaemb_messages(articles: list[str], example_questions: list[str] | tuple[str, ...] = QAEMB_EXAMPLE_QUESTIONS, n_questions: int = 10) -> list[Message]:
    return _user(qaemb_prompt(articles, example_questions, n_questions))


def answer_messages(text_chunk: str, questions: list[str]) -> list[Message]:
    return _user(answer_prompt(text_chunk, questions))


def chunk_questions(questions: list[str], per_prompt: int = 20) -> list[list[str]]:
    """Split a question list into prompts of at most ``per_prompt`` questions (the paper groups 20)."""
    if per_prompt < 1:
        raise ValueError(f"per_prompt must be >= 1, got {per_prompt}")
    return [list(questions[i : i + per_prompt]) for i in range(0, len(questions), per_prompt)]
