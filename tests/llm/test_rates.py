"""time_engines' rounds and machine_rates' message, on a stand-in engine whose calls advance a stand-in clock."""

import json
import types

import pytest

from cqg_ray import progress
from cqg_ray.config import LLMConfig
from cqg_ray.llm import rates
from cqg_ray.llm.base import Completion


class Clock:
    """A stand-in clock; ``slower``: what every cost is multiplied by (the host's pace), changed to ``slower_from_scoring``
    by the first score call where that is set."""

    def __init__(self, slower_from_scoring: float | None = None):
        self.now = 0.0
        self.slower = 1.0
        self.slower_from_scoring = slower_from_scoring

    def perf_counter(self):
        return self.now


def stand_in(clock: Clock, seconds_a_token: float, calls: list, seconds_a_pair: float = 0.03):
    """A LlamaCppBackend stand-in: a call reads its prompts' 100 shared tokens once, then decodes them together for
    max_tokens - 1 steps (the first token comes with the reading), each token read and each step taking
    seconds_a_token, and reports both to the progress counters as the real engines do; a score call takes
    seconds_a_pair a request."""

    class Backend:
        def __init__(self, cfg):
            clock.now += 5.0  # its load
            calls.append("load")

        def generate_batched(self, reqs):
            calls.append(("generate", len(reqs), reqs[0].max_tokens))
            steps = reqs[0].max_tokens - 1
            clock.now += seconds_a_token * (100 + steps) * clock.slower
            progress.add(read=100, read_s=seconds_a_token * 100, generated=len(reqs) * steps, generate_s=seconds_a_token * steps)
            return [(i, Completion("q?", prompt_tokens=100, completion_tokens=r.max_tokens)) for i, r in enumerate(reqs)]

        def score(self, reqs):
            calls.append(("score", len(reqs)))
            if clock.slower_from_scoring is not None:
                clock.slower = clock.slower_from_scoring
            clock.now += seconds_a_pair * len(reqs) * clock.slower
            return [Completion("", prompt_tokens=300, cached_tokens=0) for _ in reqs]

        def close(self):
            calls.append("close")

    return Backend


@pytest.mark.parametrize("seconds_a_token", [0.001, 0.05])
def test_the_writer_is_timed_once_a_read_then_a_batch_decoded(monkeypatch, seconds_a_token):
    """A fast engine (the read and the batch of 4 decoded to 9 tokens in 0.208 s) and a slow one (10.4 s) alike: one
    read, one batch, nothing timed a second time but the read after the answerer's work (where the writer is still
    loaded; here it is not). The write rate is the engine's own decoding time (8 steps), not the call's."""
    clock, calls = Clock(), []
    monkeypatch.setattr(rates, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr("cqg_ray.llm.engines.llamacpp.LlamaCppBackend", stand_in(clock, seconds_a_token, calls))
    writer = LLMConfig()
    writer.llamacpp.model = "bundled:qwen2.5-coder-1.5b"
    timed = rates.time_engines(writer, LLMConfig())
    generates = [c for c in calls if c[0] == "generate"]
    assert generates == [("generate", 1, 1), ("generate", 1, 1), ("generate", 4, 9)]
    assert calls.count("load") == 2 and calls.count("close") == 2
    assert timed["write"][1] == 4 * 8 and timed["read"][1] == 100 and timed["write_batch"] == (4, 4)
    assert timed["read"][0] == pytest.approx(seconds_a_token * 100)
    assert timed["write"][0] == pytest.approx(seconds_a_token * 8)
    assert timed["writer_load"] == (pytest.approx(5 + seconds_a_token * 100), 1)
    assert timed["answerer_load"] == (pytest.approx(5.06), 1)


def test_the_long_answer_read_is_timed_only_where_it_is_asked_for(monkeypatch):
    """The demo's sizing does not use the answerer's long-prompt read (`cqg-ray plan` does): without it, one score call
    fewer (the warm-up's 2 pairs and the calls of 20 pairs), and rates_from leaves it None."""
    clock = Clock()
    monkeypatch.setattr(rates, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    scores = {}
    for asked in (True, False):
        calls = []
        monkeypatch.setattr("cqg_ray.llm.engines.llamacpp.LlamaCppBackend", stand_in(clock, 0.05, calls))
        timed = rates.time_engines(LLMConfig(), LLMConfig(), answer_read=asked)
        scores[asked] = [c for c in calls if c[0] == "score"]
        assert ("answer_read" in timed) is asked
        assert rates.rates_from(timed).answer_read == (pytest.approx(300 / 0.03) if asked else None)
    assert scores == {True: [("score", 2), *[("score", 20)] * 4, ("score", 1)], False: [("score", 2), *[("score", 20)] * 4]}


@pytest.mark.parametrize("seconds_a_pair, calls_of_20", [(0.03, 4), (0.2, 1)])
def test_the_pairs_are_timed_over_calls_until_pairs_min_s_have_passed(monkeypatch, seconds_a_pair, calls_of_20):
    """A call of 20 pairs at 0.6 s is made 4 times (2.4 s: 3 were 1.8 s, under PAIRS_MIN_S), one at 4 s once; the rate
    counts every pair answered over all of the calls."""
    assert rates.PAIRS_MIN_S == 2.0
    clock, calls = Clock(), []
    monkeypatch.setattr(rates, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr("cqg_ray.llm.engines.llamacpp.LlamaCppBackend", stand_in(clock, 0.05, calls, seconds_a_pair))
    timed = rates.time_engines(LLMConfig(), LLMConfig(), answer_read=False)
    assert [c for c in calls if c[0] == "score"] == [("score", 2), *[("score", 20)] * calls_of_20]
    assert timed["pairs"] == (pytest.approx(20 * calls_of_20 * seconds_a_pair), 20 * calls_of_20)
    assert rates.rates_from(timed).pairs == pytest.approx(1 / seconds_a_pair)


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


@pytest.mark.parametrize("slower, read_share, writer_share, answerer_share", [
    (1.0, 1.0, 1.0, 1.0), (0.5, 1.0, 1.0, 0.5), (2.0, 0.5, 0.5, 1.0), (1.25, 1.0, 1.0, 1.0), (0.8, 1.25, 1.0, 1.0)])
def test_every_rate_is_taken_at_the_slower_host_of_the_writers_two_reads(monkeypatch, slower, read_share, writer_share, answerer_share):
    """The writer (kept loaded) reads its prompt once more after the answerer's pairs. A host twice as fast from the
    answerer's timing on (costs x 0.5) gives pairs at half their timed rate and the writer's as timed; a host half as
    fast (x 2) gives the writer's rates halved and the pairs as timed; a steady host, or one within HOST_CHANGE (1.3x:
    0.8x and 1.25x here), all as timed but the read, which is the faster of its two timings (1.25x where the later
    read took 0.8x). host_speed is the later read's rate over the earlier's."""
    assert rates.HOST_CHANGE == 1.3
    clock, calls = Clock(slower_from_scoring=slower), []
    monkeypatch.setattr(rates, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr("cqg_ray.llm.engines.llamacpp.LlamaCppBackend", stand_in(clock, 0.05, calls))
    writer = LLMConfig()
    writer.llamacpp.model = "bundled:qwen2.5-coder-1.5b"
    kept = []
    timed = rates.time_engines(writer, LLMConfig(), keep=kept.append, answer_read=False)
    assert len(kept) == 2 and calls[-1] == ("generate", 1, 1)  # the read again, on the kept writer, after the pairs
    assert timed["read_again"] == (pytest.approx(0.05 * 100 * slower), 100)
    r = rates.rates_from(timed)
    assert r.host_speed == pytest.approx(1 / slower)
    assert r.read == pytest.approx(100 / 5.0 * read_share) and r.write == pytest.approx(4 / 0.05 * writer_share)
    assert r.pairs == pytest.approx(1 / (0.03 * slower) * answerer_share)


def test_without_the_writer_loaded_after_the_answerer_the_rates_are_as_timed(monkeypatch):
    """Two models and nothing kept: the writer is closed before the answerer loads, so there is no second read."""
    clock, calls = Clock(slower_from_scoring=0.5), []
    monkeypatch.setattr(rates, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr("cqg_ray.llm.engines.llamacpp.LlamaCppBackend", stand_in(clock, 0.05, calls))
    writer = LLMConfig()
    writer.llamacpp.model = "bundled:qwen2.5-coder-1.5b"
    timed = rates.time_engines(writer, LLMConfig(), answer_read=False)
    assert "read_again" not in timed and calls[-1] == "close"
    r = rates.rates_from(timed)
    assert r.host_speed is None and r.pairs == pytest.approx(1 / (0.03 * 0.5))


def test_kept_rates_are_taken_down_to_a_slower_pace_of_the_host():
    """Rates measured at pace 71.9k (the encode stage's bytes a unit-second then) reused at 37.1k: every rate x 0.516
    (the Intel AMX host's two demos); at 60k (within HOST_CHANGE), at a faster pace, or without either pace, as kept."""
    kept = rates.Rates(read=432.0, write=24.7, pairs=64.4, answer_read=500.0, write_batch=4, writer_load=5.4, answerer_load=2.4,
                       host_speed=0.955, pace=71_900.0)
    share = 37_100.0 / 71_900.0
    assert rates.at_pace(kept, 37_100.0) == rates.Rates(read=432.0 * share, write=24.7 * share, pairs=64.4 * share,
                                                        answer_read=500.0 * share, write_batch=4, writer_load=5.4,
                                                        answerer_load=2.4, host_speed=0.955, pace=71_900.0)
    for pace in (60_000.0, 140_000.0, None):
        assert rates.at_pace(kept, pace) is kept
    assert rates.at_pace(rates.Rates(read=1.0, write=1.0, pairs=1.0), 10.0).pairs == 1.0  # kept without a pace


def test_machine_rates_keep_the_pace_they_were_measured_at_and_say_when_they_take_rates_down(monkeypatch, tmp_path):
    monkeypatch.setattr(rates, "measure_rates", lambda w, a, keep=None, answer_read=True: rates.Rates(
        read=400.0, write=24.0, pairs=50.0, write_batch=4, writer_load=6.3, answerer_load=3.0, host_speed=1.0))
    answerer = LLMConfig()
    answerer.llamacpp.cache_dir = str(tmp_path)
    measured, source = rates.machine_rates(answerer, answerer, keep=lambda m: None, answer_read=False, pace=70_000.0)
    assert source == "measured now" and measured.pace == 70_000.0 and measured.pairs == 50.0
    reused, source = rates.machine_rates(answerer, answerer, keep=lambda m: None, answer_read=False, pace=35_000.0)
    assert source.endswith("demo-rates.json), taken to this run's pace (0.50 of theirs)") and source.startswith("measured earlier")
    assert (reused.read, reused.write, reused.pairs, reused.pace) == (200.0, 12.0, 25.0, 70_000.0)
    same, source = rates.machine_rates(answerer, answerer, keep=lambda m: None, answer_read=False, pace=65_000.0)
    assert same == measured and source.endswith("demo-rates.json)")
    # rates kept without a pace are measured again where this run has one (and reused where it has none)
    path = tmp_path / "demo-rates.json"
    path.write_text(json.dumps({k: {**v, "pace": None} for k, v in json.loads(path.read_text()).items()}))
    assert rates.machine_rates(answerer, answerer, keep=lambda m: None, answer_read=False)[1].startswith("measured earlier")
    again, source = rates.machine_rates(answerer, answerer, keep=lambda m: None, answer_read=False, pace=35_000.0)
    assert source == "measured now" and again.pace == 35_000.0


def test_kept_rates_that_are_not_rates_are_measured_again(monkeypatch, tmp_path):
    """A demo-rates.json that is JSON but not rates by key (a list), or whose rates are not positive finite numbers (0,
    a string, NaN, Infinity), is measured again and rewritten; before, a list was an AttributeError traceback and a
    zero rate a ZeroDivisionError in the demo's sizing."""
    measured = []
    monkeypatch.setattr(rates, "measure_rates", lambda w, a, keep=None, answer_read=True: measured.append(1) or rates.Rates(
        read=400.0, write=24.0, pairs=50.0, write_batch=4, writer_load=6.3, answerer_load=3.0, host_speed=1.0))
    answerer = LLMConfig()
    answerer.llamacpp.cache_dir = str(tmp_path)
    path = tmp_path / "demo-rates.json"
    path.write_text("[1, 2]\n")
    assert rates.machine_rates(answerer, answerer, answer_read=False)[1] == "measured now" and measured == [1]
    good = json.loads(path.read_text())
    assert rates.machine_rates(answerer, answerer, answer_read=False)[1].startswith("measured earlier") and measured == [1]
    for bad in ({"read": 0.0}, {"write": "fast"}, {"pairs": float("nan")}, {"read": float("inf")}):
        path.write_text(json.dumps({k: {**v, **bad} for k, v in good.items()}))
        assert rates.machine_rates(answerer, answerer, answer_read=False)[1] == "measured now"
    assert measured == [1] * 5 and json.loads(path.read_text()) == good
