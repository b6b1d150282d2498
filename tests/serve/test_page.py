"""The page (GET /ui) in headless Chromium: type two texts, compare, check the rendered questions, search the list.

Needs Debian's `chromium` (apt-get install chromium); skipped with that reason when it is absent.
Screenshots go to tests/_artifacts/ (git-ignored).
"""

from pathlib import Path

import pytest

from tests.serve.cdp import Browser, find_chromium

ARTIFACTS = Path(__file__).resolve().parents[1] / "_artifacts"
A = "The film was a wonderful movie with great actors and a moving story."
B = "I watched a terrible movie at the cinema; the acting was poor and the plot made no sense."

ROWS_JS = """[...document.querySelectorAll('#answers tbody tr')].map(tr => ({
  kind: tr.className, id: tr.cells[0].textContent, question: tr.cells[1].textContent,
  a: tr.cells[2].textContent, b: tr.cells[3].textContent, precision: tr.cells[4].textContent,
  bg: getComputedStyle(tr.cells[1]).backgroundColor}))"""


def precision_text(q) -> str:
    """What the page shows for a question's measured precision (q: an item of an explanation, or a question record)."""
    get = (lambda k: q.get(k)) if isinstance(q, dict) else (lambda k: getattr(q, k))
    if get("n_heldout") is None:
        return "n/a"
    return "unmeasured" if get("precision") is None else f"{get('precision'):.2f} ({get('n_heldout')} labels)"


@pytest.fixture(scope="module")
def browser():
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); the page test needs a headless browser")
    b = Browser(binary)
    yield b
    b.close()


def test_compare_two_texts(server, browser, model):
    browser.goto(server.url + "/ui")
    browser.wait_for("document.body.dataset.ready === '1'")
    assert browser.eval("document.getElementById('model-info').textContent") == f"cqg-mbqa \u00b7 m = 32 questions \u00b7 budget {model.budget.name}"

    browser.type_into("#text-a", A)
    browser.type_into("#text-b", B)
    assert browser.eval("document.getElementById('text-a').value") == A
    browser.eval("document.getElementById('run').click()")
    browser.wait_for("document.body.dataset.state === 'compared'")
    rows = browser.eval(ROWS_JS)
    want = model.explain(A, B)

    shared = [r for r in rows if r["kind"] == "shared"]
    assert [(r["id"], r["question"]) for r in shared] == [(q.id, q.text) for q in want.shared_yes]
    assert len(shared) == want.cognitive_load > 0
    assert all(r["a"].startswith("Yes") and r["b"].startswith("Yes") for r in shared)
    assert all(r["bg"] == "rgb(216, 243, 220)" for r in shared)  # highlighted like the paper's case study
    only_a = [r["id"] for r in rows if r["kind"] == "only-a"]
    only_b = [r["id"] for r in rows if r["kind"] == "only-b"]
    assert only_a == [q.id for q in want.only_a] and only_b == [q.id for q in want.only_b]
    for r, q in zip([r for r in rows if r["kind"] == "only-a"], want.only_a):
        assert r["a"] == f"Yes ({q.p_a:.2f})" and r["b"] == f"No ({q.p_b:.2f})"
    assert all(r["bg"] != "rgb(216, 243, 220)" for r in rows if r["kind"] != "shared")
    items = want.shared_yes + want.only_a + want.only_b
    assert [r["precision"] for r in rows] == [precision_text(q) for q in items]
    assert {q.index % 3 for q in items} == {0, 1, 2}  # measured, unmeasured and no figures all shown
    assert browser.eval("document.getElementById('cosine').textContent") == f"{want.cosine:.4f}"
    assert browser.eval("document.getElementById('load').textContent") == str(want.cognitive_load)
    browser.screenshot(str(ARTIFACTS / "serve_page_compare.png"))
    assert (ARTIFACTS / "serve_page_compare.png").stat().st_size > 10_000


def test_empty_text_shows_a_message(server, browser):
    browser.goto(server.url + "/ui")
    browser.wait_for("document.body.dataset.ready === '1'")
    browser.type_into("#text-a", "only one text")
    browser.eval("document.getElementById('run').click()")
    assert browser.wait_for("document.getElementById('compare-error').textContent") == "Paste a text into both boxes."


def test_key_of_a_secure_server(server, browser):
    """A server with a key: the page shows the 401 until the key is typed, then the model; the key is kept for the
    tab only (sessionStorage), never in localStorage, which outlives the browser session."""
    browser.goto(server.secure_url + "/ui")
    browser.wait_for("document.body.dataset.ready === '1'")
    assert browser.eval("document.getElementById('questions-error').textContent").startswith("missing Authorization header")
    browser.type_into("#api-key", server.token)
    browser.eval("document.getElementById('api-key').dispatchEvent(new Event('change'))")
    assert browser.wait_for("document.getElementById('model-info').textContent").startswith("cqg-mbqa \u00b7 m = 32 questions")
    assert browser.eval("document.getElementById('questions-error').textContent") == ""
    assert browser.eval("[sessionStorage.getItem('cqg-ray-api-key'), localStorage.getItem('cqg-ray-api-key')]") == [server.token, None]
    browser.goto(server.secure_url + "/ui")  # a reload in the same tab keeps it
    browser.wait_for("document.body.dataset.ready === '1'")
    assert browser.eval("document.getElementById('api-key').value") == server.token
    assert browser.eval("document.getElementById('model-info').textContent").startswith("cqg-mbqa")


def test_question_list_search_and_sort(server, client, browser, model):
    client.post("/embed", json={"texts": [A, B]})  # served yes-rates need texts seen
    browser.goto(server.url + "/ui")
    browser.wait_for("document.body.dataset.ready === '1'")
    loads = int(browser.eval("document.body.dataset.questionLoads"))
    browser.eval("document.getElementById('tab-questions').click()")  # loads the questions again: wait for that load, whose
    browser.wait_for(f"Number(document.body.dataset.questionLoads) > {loads}")  # answer would overwrite the list set below
    browser.wait_for("document.querySelectorAll('#question-table tbody tr').length === 32")
    texts = browser.eval("[...document.querySelectorAll('#question-table tbody tr')].map(tr => tr.cells[2].textContent)")
    assert texts == model.questions
    shown = browser.eval("[...document.querySelectorAll('#question-table tbody tr')].map(tr => tr.cells[4].textContent)")
    assert shown == [precision_text(r) for r in model.question_records]
    browser.type_into("#filter", "movie")
    shown = browser.eval("[...document.querySelectorAll('#question-table tbody tr')].map(tr => tr.cells[1].textContent)")
    assert shown == [f"q{i:03d}" for i, q in enumerate(model.questions) if "movie" in q.lower()]
    assert browser.eval("document.getElementById('question-count').textContent") == f"{len(shown)} of 32 questions"
    browser.eval("document.getElementById('filter').value = ''; document.getElementById('filter').dispatchEvent(new Event('input'))")
    browser.eval("document.querySelector('th[data-key=yes_rate]').click()")  # most frequent yes first
    rates = browser.eval("[...document.querySelectorAll('#question-table tbody tr')].map(tr => tr.cells[3].textContent)")
    values = [float(r.rstrip("%")) for r in rates if r != "n/a"]
    assert values == sorted(values, reverse=True) and len(values) == 32
    assert "texts this server replica has embedded" in browser.eval("document.getElementById('rate-source').textContent")
    # ids sort as numbers where they are numbers (the shipped model's "0".."267"), not "1", "10", "100", "2"
    browser.eval("questions = ['10', '2', '1', 'q2', '100'].map((id, index) => ({index, id, text: 'Is it ' + id + '?', yes_rate: null, "
                 "precision: null, n_heldout: null})); renderQuestions(); document.querySelector('th[data-key=id]').click()")
    ids = browser.eval("[...document.querySelectorAll('#question-table tbody tr')].map(tr => tr.cells[1].textContent)")
    assert ids == ["1", "2", "10", "100", "q2"]
    browser.screenshot(str(ARTIFACTS / "serve_page_questions.png"))
