"""`cqg-ray explain MODEL TEXT_A TEXT_B`: the explanation that `InterpretableEmbedder.explain` gives, printed."""

import json

import pytest

from cqg_ray.cli import main
from cqg_ray.explain import format_explanation
from cqg_ray.mbqa.embedder import InterpretableEmbedder

A, B = "Aspirin relieves headaches and fever.", "A doctor prescribes medicine for migraines."


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> str:
    from cqg_ray.mbqa.toy import build_toy_model

    return build_toy_model(str(tmp_path_factory.mktemp("toy") / "model"))


def test_explain_prints_the_models_explanation(toy, capsys):
    model = InterpretableEmbedder.load(toy, device="cpu")
    assert main(["explain", toy, A, B]) == 0
    assert capsys.readouterr().out == format_explanation(model.explain(A, B), A, B) + "\n"
    assert main(["explain", toy, A, B, "--k", "2", "--json"]) == 0
    got, want = json.loads(capsys.readouterr().out), model.explain(A, B, k=2).to_dict()
    assert got.keys() == want.keys() and got["budget"] == want["budget"] == "top2>0.5"
    assert got["cognitive_load"] == want["cognitive_load"] and [q["id"] for q in got["shared_yes"]] == [q["id"] for q in want["shared_yes"]]
    assert got["cosine"] == pytest.approx(want["cosine"], abs=1e-6)


def test_a_long_text_is_echoed_clipped_and_said_to_fill_the_encoder(toy, capsys):
    """A text past the encoder's tokens: its echo is one line of 200 characters with its length, and a note says which
    text the encoder read only in part (a 96,000-character text was echoed whole, with no word of it)."""
    long = "The patient took aspirin for the headache. " * 300
    assert main(["explain", toy, long, B]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"Text A: {long[:197]}... ({len(long):,} characters)" and out.splitlines()[1] == f"Text B: {B}"
    limit = InterpretableEmbedder.load(toy, device="cpu").encoder.max_seq_length
    assert err.endswith(f"note: text A filled the encoder's {limit} tokens: words past its {limit}th token were not read\n")
    assert main(["explain", toy, A, B]) == 0
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]


@pytest.mark.parametrize("args,says", [
    (["", B], "explain: text_a is empty, or only whitespace and characters no encoder reads: there is nothing to explain"),
    (["a", "b", "--k", "0"], "explain: --k must be an integer from 1 to m=32, got 0"),
    (["a", "b", "--k", "33"], "explain: --k must be an integer from 1 to m=32, got 33"),
    (["a", "b", "--tau", "1.5"], "explain: --tau must be a number in (0, 1), got 1.5"),
    (["a", "b", "--tau", "nan"], "explain: --tau must be a number in (0, 1), got nan"),
    (["a", "b", "--tau", "0.5", "--k", "3"], "explain: give --tau (the tau rule) or --k (top-k), not both"),
    (["a", "b", "--rows", "0"], "explain: --rows must be at least 1, got 0"),
])
def test_explain_refuses_bad_input_in_one_line(toy, capsys, args, says):
    assert main(["explain", toy, *args]) == 2
    err = capsys.readouterr().err
    assert f"error: {says}\n" in err and "Traceback" not in err
