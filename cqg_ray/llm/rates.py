"""This machine's LLM rates on the embedded engines, measured in seconds and kept per machine.

    rates, source = machine_rates(writer_llm(cfg), cfg.llm)   # measured now, or what an earlier run measured here

The writer's prompt reading and generation, and the answerer's single-pass work (pairs a second, and its prompt
tokens read a second on one long prompt). `cqg-ray demo` sizes itself from them and `cqg-ray plan --measure` turns
them into hours. Kept in the model cache's ``demo-rates.json``, keyed by the CPU (`cpu_signature`), its cores, the models, the engines
as resolved (``auto`` changes with the CPU) and the threads.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from cqg_ray import progress
from cqg_ray.config import LLMConfig

RATE_TEXTS = ["The committee approved the new budget after a long debate about school funding and road repairs.",
              "A young boy in a red shirt is playing with a dog on the beach while his parents watch.",
              "The patient was given antibiotics for a chest infection and recovered within two weeks.",
              "Researchers measured the effect of temperature on the growth of bacteria in the lab."]
RATE_QUESTIONS = ["Is the text about health or medicine?", "Does the text mention an animal?", "Is the text about money?",
                  "Does the text describe a scientific study?", "Is a child mentioned?"]


@dataclass(frozen=True)
class Rates:
    """This machine's LLM rates on a run's engines."""

    read: float  # the writer's prompt tokens read per second
    write: float  # the writer's tokens generated per second, all of a batch of `write_batch` sequences together
    pairs: float  # the answerer's single-pass (text, question) pairs per second (short texts, their prefixes shared)
    answer_read: float | None = None  # the answerer's prompt tokens read per second (one long single-pass prompt)
    write_batch: int | None = None  # sequences decoded together when `write` was timed (None: one, kept before batches)
    writer_load: float | None = None  # seconds for the writer to load and answer its first prompt (paid where it is loaded again)
    answerer_load: float | None = None  # the same for the answerer
    host_speed: float | None = None  # the writer's read rate timed after the answerer's work as a share of the one before
    # it (`rates_from`: beyond `HOST_CHANGE` the rates above are taken down to the slower; None: the writer was not loaded then)
    pace: float | None = None  # the host's pace on other work when these were measured (the demo: its encode stage's
    # corpus bytes a unit-second); a later run at a pace slower by more than `HOST_CHANGE` takes them down (`at_pace`)


WRITE_TOKENS = 9  # tokens a timed sequence writes: the write rate is the 8 decoding steps after the first (which the reading gives)
PAIRS_MIN_S = 2.0  # the answerer's pairs are timed over calls of 20 until this long, not one ~0.3-0.4 s call on a fast
# CPU (an Intel AMX host's first call of 20 read ~10-15% under the calls after it, 2026-12-06); on an AVX2 host one call
# takes this long already
HOST_CHANGE = 1.3  # the writer's two reads differ by more than this factor: the host changed speed between them. Under
# the AVX2 cap on an Intel AMX host the later read was steadily 0.84 of the first (then the faster of two rounds, where
# the later is one read just after the answerer's threads ran); the host's own phases were 2-3x
WRITE_BATCH = 4  # sequences decoded together for the write rate (the demo decodes up to llamacpp.batch_generate: more
# sequences write more tokens a second, so the rate at 4 is a floor for the demo's 8-16 prompts, and ~4x the work of one)


def _prompt(texts: list[str], tokens: int):
    from cqg_ray.llm.base import Request

    return Request([{"role": "user", "content": "Write ten yes/no questions about these texts:\n" + "\n".join(texts)}], max_tokens=tokens)


def measure_rates(writer: LLMConfig, answerer: LLMConfig, keep: Callable[[Any], None] | None = None, answer_read: bool = True) -> Rates:
    """This machine's `Rates` on the engines the run uses, from `time_engines` (``keep``, ``answer_read``: as there)."""
    return rates_from(time_engines(writer, answerer, keep, answer_read))


def rates_from(timed: dict[str, tuple[float, int]]) -> Rates:
    """`Rates` from `time_engines`' (seconds, count) per measure (``write_batch``: (sequences, sequences); no
    ``answer_read``: None). With ``read_again`` (the writer's read timed once more after the answerer's work) differing
    from the first read by more than `HOST_CHANGE`, every rate is taken at the slower host of the two moments: the
    writer's by its own read's share of the slower read, the answerer's by the later read's. A host whose speed changes
    under the measurement (an Intel AMX host read 146-178 and 425-469 tokens/s within a minute, its pairs 44-47 and
    67-82 with them) otherwise mixes one moment's writer with another's answerer: one demo sized its probes on 60
    pairs/s beside a read of 192, and they ran at 21.9. Within `HOST_CHANGE` the read is the faster of the two."""
    (read_s, read), (write_s, wrote), (pairs_s, pairs) = (timed[k] for k in ("read", "write", "pairs"))
    answer_s, answer = timed.get("answer_read", (None, None))
    again_s, again = timed.get("read_again", (None, None))
    first, later = read / read_s, again / again_s if again_s else None
    speed = later / first if later else None  # `Rates.host_speed`
    if host_changed(speed):  # the writer's and the answerer's rates, taken down to the slower moment
        w, a = min(1.0, speed), min(1.0, 1 / speed)
        read_rate = first * w
    else:  # the read is the faster of its two timings (a neighbour's burst on the cores lands in one of them)
        w = a = 1.0
        read_rate = max(first, later or 0.0)
    return Rates(read=read_rate, write=max(wrote, 1) / max(write_s, 1e-3) * w, pairs=pairs / pairs_s * a,
                 answer_read=answer / answer_s * a if answer_s else None,
                 write_batch=int(timed["write_batch"][1]), writer_load=round(timed["writer_load"][0], 1),
                 answerer_load=round(timed["answerer_load"][0], 1), host_speed=round(speed, 3) if speed else None)


def host_changed(host_speed: float | None) -> bool:
    """Whether the writer's later read rate, as a share of its first (`Rates.host_speed`), says the host changed speed."""
    return host_speed is not None and not 1 / HOST_CHANGE <= host_speed <= HOST_CHANGE


def at_pace(rates: Rates, pace: float | None) -> Rates:
    """Kept rates for a run whose host works at ``pace`` (`Rates.pace`'s measure): where that is slower than the pace
    they were measured at by more than `HOST_CHANGE`, every rate taken down by the ratio; else as they are. The Intel
    AMX host's demo encoded at 71.9k bytes a unit-second when its rates were measured, and at 37.1k in a later demo
    that reused them, whose generation, probes and labels then took 1.7-2.3x as long (36.4k in a third, as slow)."""
    if pace is None or rates.pace is None or pace * HOST_CHANGE >= rates.pace:
        return rates
    share = pace / rates.pace
    return replace(rates, read=rates.read * share, write=rates.write * share, pairs=rates.pairs * share,
                   answer_read=rates.answer_read * share if rates.answer_read else None)


def time_engines(writer: LLMConfig, answerer: LLMConfig, keep: Callable[[Any], None] | None = None,
                 answer_read: bool = True) -> dict[str, tuple[float, int]]:
    """(seconds, count) for each rate, after the models load: ``read``, a ~170-token prompt's tokens read; ``write``,
    the decoding steps of `WRITE_BATCH` copies of a short prompt (at most ``batch_generate``) decoded together to
    `WRITE_TOKENS` tokens each, as the engine times them apart from the prompt's reading (``progress``' ``generated`` and
    ``generate_s``: the first token of each comes with the reading, so 8 tokens a sequence), each timed once (the read
    is timed again last: ``read_again``);
    ``write_batch``, those sequences; ``pairs``, calls of 20 single-pass pairs answered until `PAIRS_MIN_S` have passed (at
    least one), all of them; ``answer_read``, one ~200-token
    single-pass prompt's tokens read (what a cache held is not counted; only with ``answer_read``: `cqg-ray plan`
    uses it, the demo's sizing does not); ``writer_load`` and ``answerer_load``, (seconds
    to build each engine and answer its first request, 1): what a stage's engine pays before its work (the same model
    for both: one load, counted for each); ``read_again``, the writer's read timed once more after the answerer's work,
    where the writer is still loaded then (one model for both, or ``keep``: `rates_from` takes every rate to the
    slower host). ``keep``: handed the loaded backends once all is timed (writer first), instead of closing them."""
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    def timed(reqs, on=None):
        t0 = time.perf_counter()
        done = [c for _, c in (on or model).generate_batched(reqs)]
        return time.perf_counter() - t0, done

    batch = max(1, min(WRITE_BATCH, writer.llamacpp.batch_generate))
    t0 = time.perf_counter()
    kept: list = []  # loaded backends for ``keep``
    model = LlamaCppBackend(writer)
    try:
        list(model.generate_batched([_prompt(RATE_TEXTS[:1], 1)]))  # warm-up: engines load lazily
        loads = {"writer_load": (time.perf_counter() - t0, 1)}
        a = [_prompt(RATE_TEXTS * 2, 1)]
        # the same prompt in every sequence: each writes its WRITE_TOKENS tokens (other texts let some stop early, leaving
        # fewer sequences in the last steps); the engine times its decoding steps apart from the prompt's reading
        bn = [_prompt(RATE_TEXTS[-1:], WRITE_TOKENS)] * batch
        read_s, (read,) = timed(a)
        before = progress.snapshot()
        timed(bn)
        after = progress.snapshot()
        out = {"read": (read_s, read.prompt_tokens), "write": (after["generate_s"] - before["generate_s"], int(after["generated"] - before["generated"])),
               "write_batch": (batch, batch), **loads}
        reqs = [r for t in RATE_TEXTS for r in answer_requests(t, range(len(RATE_QUESTIONS)), RATE_QUESTIONS, "single", 20, 1)]
        t0 = time.perf_counter()
        if answerer != writer:  # the same section (the reference build's 1.5B): its model stays loaded
            if keep:
                kept.append(model)
            else:
                model.close()
            model = LlamaCppBackend(answerer)
        model.score(reqs[:2])  # warm-up
        out["answerer_load"] = (time.perf_counter() - t0, 1) if answerer != writer else loads["writer_load"]
        t0, answered = time.perf_counter(), 0
        while not answered or time.perf_counter() - t0 < PAIRS_MIN_S:
            model.score(reqs)
            answered += len(reqs)
        out["pairs"] = time.perf_counter() - t0, answered
        if answer_read:
            long = answer_requests(" ".join(RATE_TEXTS[::-1] * 2), [0], RATE_QUESTIONS[:1], "single", 20, 1)  # nothing shared
            t0 = time.perf_counter()
            (scored,) = model.score(long)
            out["answer_read"] = time.perf_counter() - t0, scored.prompt_tokens - scored.cached_tokens
        writer_model = model if answerer == writer else (kept[0] if kept else None)  # still loaded: the host's speed again
        if writer_model is not None:
            s, (read,) = timed(a, writer_model)
            out["read_again"] = s, read.prompt_tokens
        if keep:
            kept.append(model)
            model = None
    except BaseException:
        for m in kept:
            m.close()
        raise
    finally:
        if model is not None:
            model.close()
    for m in kept:
        keep(m)
    return out


def machine_rates(writer: LLMConfig, answerer: LLMConfig, say: Callable[[str], None] | None = None,
                  keep: Callable[[Any], None] | None = None, answer_read: bool = True, pace: float | None = None) -> tuple[Rates, str]:
    """`measure_rates`, or the rates an earlier run measured on this machine with the same models and engines (kept in
    the model cache's demo-rates.json, keyed by the CPU's `cpu_signature`: another CPU kind behind the same model name,
    or the AVX2 cap, measures anew); and where they come from. Rates kept without ``write_batch`` or the loads,
    without ``answer_read`` where it is asked for (``answer_read``: `time_engines`), without ``host_speed`` where
    ``keep`` lets it be timed, or without a pace where this run has one, are measured again. ``say``: told
    what is measured before the models load, and how long it took (the demo prints it). ``keep``: handed the backends
    a measurement loaded (`time_engines`; rates reused load none). ``pace``: the host's pace on other work now
    (`Rates.pace`), kept with rates measured now and applied to rates reused (`at_pace`)."""
    from cqg_ray.hardware import available_cpus, cpu_signature
    from cqg_ray.llm.base import resolve_engine
    from cqg_ray.cache import cache_root

    ll = answerer.llamacpp
    engines = resolve_engine(ll.generate_engine, work="generate"), resolve_engine(ll.score_engine, work="score")  # as resolved: auto changes
    key = "|".join(map(str, (cpu_signature(), available_cpus(), writer.llamacpp.model, ll.model, *engines, ll.n_threads)))
    path = cache_root(ll.cache_dir) / "demo-rates.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):  # JSON, but not the rates by key: measured again, and the file rewritten
        known = {}
    if isinstance(known.get(key), dict):
        try:
            rates = Rates(**known[key])
        except TypeError:
            rates = None
        if (rates is not None and all(isinstance(v, (int, float)) and 0 < v < math.inf for v in (rates.read, rates.write, rates.pairs))
                and None not in (rates.write_batch, rates.writer_load, rates.answerer_load)
                and not (answer_read and rates.answer_read is None) and not (keep and rates.host_speed is None)
                and not (pace is not None and rates.pace is None)):
            now = at_pace(rates, pace)
            slower = f", taken to this run's pace ({pace / rates.pace:.2f} of theirs)" if now is not rates else ""
            return now, f"measured earlier on this machine ({path}){slower}"
    if say:
        say(f"measuring this machine's LLM rates, once (kept in {path}): the writer {writer.llamacpp.model} on {engines[0]} and "
            f"the answerer {ll.model} on {engines[1]} load, then read, write and answer a few short prompts")
    t0 = time.perf_counter()
    rates = replace(measure_rates(writer, answerer, keep, answer_read), pace=pace)
    if say:
        loads = rates.writer_load + (rates.answerer_load if answerer != writer else 0.0)
        say(f"rates measured in {time.perf_counter() - t0:.0f} s ({loads:.0f} s of them the models loading"
            f"{', kept for the stages' if keep else ''})")
    known[key] = asdict(rates)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, path)
    return rates, "measured now"
