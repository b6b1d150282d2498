"""This machine's LLM rates on the embedded engines, measured in seconds and kept per machine.

    rates, source = machine_rates(writer_llm(cfg), cfg.llm)   # measured now, or what an earlier run measured here

The writer's prompt reading and generation, and the answerer's single-pass work (pairs a second, and its prompt
tokens read a second on one long prompt). `cqg-ray demo` sizes itself from them and `cqg-ray plan --measure` turns
them into hours. Kept in the model cache's ``demo-rates.json``, keyed by the CPU, its cores, the models, the engines as
resolved (``auto`` changes with the CPU) and the threads.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

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
    write: float  # the writer's tokens generated per second (one sequence: batches only do better)
    pairs: float  # the answerer's single-pass (text, question) pairs per second (short texts, their prefixes shared)
    answer_read: float | None = None  # the answerer's prompt tokens read per second (one long single-pass prompt)


def _prompt(texts: list[str], tokens: int):
    from cqg_ray.llm.base import Request

    return Request([{"role": "user", "content": "Write ten yes/no questions about these texts:\n" + "\n".join(texts)}], max_tokens=tokens)


def measure_rates(writer: LLMConfig, answerer: LLMConfig) -> Rates:
    """This machine's `Rates` on the engines the run uses, from `time_engines`."""
    return rates_from(time_engines(writer, answerer))


def rates_from(timed: dict[str, tuple[float, int]]) -> Rates:
    """`Rates` from `time_engines`' (seconds, count) per measure."""
    (read_s, read), (write_s, wrote), (pairs_s, pairs), (answer_s, answer) = (timed[k] for k in ("read", "write", "pairs", "answer_read"))
    return Rates(read=read / read_s, write=max(wrote, 1) / max(write_s, 1e-3), pairs=pairs / pairs_s, answer_read=answer / answer_s)


def time_engines(writer: LLMConfig, answerer: LLMConfig) -> dict[str, tuple[float, int]]:
    """(seconds, count) for each rate, after the models load: ``read``, a ~250-token prompt's tokens read; ``write``,
    a short prompt answered with 1 and with 33 tokens, the difference being 32 tokens written (nothing estimated is
    subtracted: the engine keeps no cache between calls); each prompt timed twice, interleaved, the faster kept (a
    neighbour's burst on the cores lands in one repeat); ``pairs``, 20 single-pass pairs answered; ``answer_read``, one ~250-token
    single-pass prompt's tokens read (what a cache held is not counted)."""
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    def timed(req):
        t0 = time.perf_counter()
        (_, c), = model.generate_batched([req])
        return time.perf_counter() - t0, c

    model = LlamaCppBackend(writer)
    try:
        list(model.generate_batched([_prompt(RATE_TEXTS[:1], 1)]))  # warm-up: engines load lazily
        a, b1, b33 = _prompt(RATE_TEXTS * 2, 1), _prompt(RATE_TEXTS[-1:], 1), _prompt(RATE_TEXTS[-1:], 33)
        runs = [(timed(a), timed(b1), timed(b33)) for _ in range(2)]
        (_, ca), (_, c1), (_, c33) = runs[0]
        out = {"read": (min(r[0][0] for r in runs), ca.prompt_tokens),
               "write": (min(r[2][0] for r in runs) - min(r[1][0] for r in runs), c33.completion_tokens - c1.completion_tokens)}
        if answerer != writer:  # the same section (the reference build's 1.5B): its model stays loaded
            model.close()
            model = LlamaCppBackend(answerer)
        reqs = [r for t in RATE_TEXTS for r in answer_requests(t, range(len(RATE_QUESTIONS)), RATE_QUESTIONS, "single", 20, 1)]
        model.score(reqs[:2])  # warm-up
        t0 = time.perf_counter()
        model.score(reqs)
        out["pairs"] = time.perf_counter() - t0, len(reqs)
        long = answer_requests(" ".join(RATE_TEXTS[::-1] * 2), [0], RATE_QUESTIONS[:1], "single", 20, 1)  # nothing shared
        t0 = time.perf_counter()
        (scored,) = model.score(long)
        out["answer_read"] = time.perf_counter() - t0, scored.prompt_tokens - scored.cached_tokens
    finally:
        model.close()
    return out


def machine_rates(writer: LLMConfig, answerer: LLMConfig) -> tuple[Rates, str]:
    """`measure_rates`, or the rates an earlier run measured on this machine with the same models and engines (kept in
    the model cache's demo-rates.json); and where they come from. Rates kept before ``answer_read`` existed are
    measured again."""
    from cqg_ray.hardware import available_cpus, cpu_model
    from cqg_ray.llm.base import resolve_engine
    from cqg_ray.llm.engines.bundled import cache_root

    ll = answerer.llamacpp
    engines = resolve_engine(ll.generate_engine, work="generate"), resolve_engine(ll.score_engine, work="score")  # as resolved: auto changes
    key = "|".join(map(str, (cpu_model(), available_cpus(), writer.llamacpp.model, ll.model, *engines, ll.n_threads)))
    path = cache_root(ll.cache_dir) / "demo-rates.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), dict):
        try:
            rates = Rates(**known[key])
        except TypeError:
            rates = None
        if rates is not None and rates.answer_read is not None:
            return rates, f"measured earlier on this machine ({path})"
    rates = measure_rates(writer, answerer)
    known[key] = asdict(rates)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, path)
    return rates, "measured now"
