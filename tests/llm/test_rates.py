"""time_engines' rounds and machine_rates' message, on a stand-in engine whose calls advance a stand-in clock."""

import types

import pytest

from cqg_ray import progress
from cqg_ray.config import LLMConfig
from cqg_ray.llm import rates
from cqg_ray.llm.base import Completion


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def stand_in(clock: Clock, seconds_a_token: float, calls: list):
    """A LlamaCppBackend stand-in: a call reads its prompts' 100 shared tokens once, then decodes them together for
    max_tokens - 1 steps (the first token comes with the reading), each token read and each step taking
    seconds_a_token, and reports both to the progress counters as the real engines do."""

    class Backend:
        def __init__(self, cfg):
            clock.now += 5.0  # its load
            calls.append("load")

        def generate_batched(self, reqs):
            calls.append(("generate", len(reqs), reqs[0].max_tokens))
            steps = reqs[0].max_tokens - 1
            clock.now += seconds_a_token * (100 + steps)
            progress.add(read=100, read_s=seconds_a_token * 100, generated=len(reqs) * steps, generate_s=seconds_a_token * steps)
            return [(i, Completion("q?", prompt_tokens=100, completion_tokens=r.max_tokens)) for i, r in enumerate(reqs)]

        def score(self, reqs):
            calls.append(("score", len(reqs)))
            clock.now += 0.01 * len(reqs)
            return [Completion("", prompt_tokens=300, cached_tokens=0) for _ in reqs]

        def close(self):
            calls.append("close")

    return Backend


@pytest.mark.parametrize("seconds_a_token, rounds", [(0.001, 2), (0.05, 1)])
def test_the_writer_is_timed_a_second_round_only_where_its_first_round_was_short(monkeypatch, seconds_a_token, rounds):
    """Fast engine: the first round (a read, then a batch of 4 decoded to 9 tokens) takes 0.208 s and is timed again;
    slow: 10.4 s, over REPEAT_UNDER_S, and it is not. The write rate is the engine's own decoding time (8 steps), not
    the call's; the counts do not change with the rounds."""
    clock, calls = Clock(), []
    monkeypatch.setattr(rates, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr("cqg_ray.llm.engines.llamacpp.LlamaCppBackend", stand_in(clock, seconds_a_token, calls))
    writer = LLMConfig()
    writer.llamacpp.model = "bundled:qwen2.5-coder-1.5b"
    timed = rates.time_engines(writer, LLMConfig())
    generates = [c for c in calls if c[0] == "generate"]
    assert generates == [("generate", 1, 1)] + [("generate", 1, 1), ("generate", 4, 9)] * rounds
    assert calls.count("load") == 2 and calls.count("close") == 2
    assert timed["write"][1] == 4 * 8 and timed["read"][1] == 100 and timed["write_batch"] == (4, 4)
    assert timed["read"][0] == pytest.approx(seconds_a_token * 100)
    assert timed["write"][0] == pytest.approx(seconds_a_token * 8)
    assert timed["writer_load"] == (pytest.approx(5 + seconds_a_token * 100), 1)
    assert timed["answerer_load"] == (pytest.approx(5.02), 1)


def test_the_long_answer_read_is_timed_only_where_it_is_asked_for(monkeypatch):
    """The demo's sizing does not use the answerer's long-prompt read (`cqg-ray plan` does): without it, one score call
    fewer (the warm-up's 2 pairs and the 20 pairs), and rates_from leaves it None."""
    clock = Clock()
    monkeypatch.setattr(rates, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    scores = {}
    for asked in (True, False):
        calls = []
        monkeypatch.setattr("cqg_ray.llm.engines.llamacpp.LlamaCppBackend", stand_in(clock, 0.05, calls))
        timed = rates.time_engines(LLMConfig(), LLMConfig(), answer_read=asked)
        scores[asked] = [c for c in calls if c[0] == "score"]
        assert ("answer_read" in timed) is asked
        assert rates.rates_from(timed).answer_read == (pytest.approx(300 / 0.01) if asked else None)
    assert scores == {True: [("score", 2), ("score", 20), ("score", 1)], False: [("score", 2), ("score", 20)]}


def test_machine_rates_says_how_much_of_its_time_the_loads_took(monkeypatch, tmp_path):
    monkeypatch.setattr(rates, "measure_rates", lambda w, a, keep=None, answer_read=True: rates.Rates(
        read=400.0, write=24.0, pairs=50.0, answer_read=1000.0, write_batch=4, writer_load=6.3, answerer_load=3.0))
    answerer = LLMConfig()
    answerer.llamacpp.cache_dir = str(tmp_path)
    writer = LLMConfig()
    writer.llamacpp.model = "bundled:qwen2.5-coder-1.5b"
    said = []
    r, source = rates.machine_rates(writer, answerer, say=said.append, keep=lambda m: None)
    assert source == "measured now" and r.writer_load == 6.3
    assert said[-1].startswith("rates measured in 0 s (9 s of them the models loading, kept for the stages)")
    said.clear()
    assert rates.machine_rates(writer, answerer, say=said.append)[1].startswith("measured earlier on this machine") and said == []
