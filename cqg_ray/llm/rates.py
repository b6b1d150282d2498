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
    """The writer's prompt reading and generation, and the answerer's single-pass pairs and prompt reading, on the
    engines the run uses (a prompt of ~250 tokens read; 32 tokens written after a short prompt, whose reading is taken
    off at the rate just measured, so that noise in reading the long prompt does not land in the writing rate; 20 pairs
    answered; one ~250-token single-pass prompt read: seconds, after the models load)."""
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.engines.llamacpp import LlamaCppBackend

    model = LlamaCppBackend(writer)
    try:
        list(model.generate_batched([_prompt(RATE_TEXTS[:1], 1)]))  # warm-up: engines load lazily
        a, b = _prompt(RATE_TEXTS * 2, 1), _prompt(RATE_TEXTS[-1:], 33)  # different texts: no cached prefix
        t0 = time.perf_counter()
        (_, read), = model.generate_batched([a])
        t1 = time.perf_counter()
        (_, wrote), = model.generate_batched([b])
        t2 = time.perf_counter()
        if answerer != writer:  # the same section (the reference build's 1.5B): its model stays loaded
            model.close()
            model = LlamaCppBackend(answerer)
        reqs = [r for t in RATE_TEXTS for r in answer_requests(t, range(len(RATE_QUESTIONS)), RATE_QUESTIONS, "single", 20, 1)]
        model.score(reqs[:2])  # warm-up
        t3 = time.perf_counter()
        model.score(reqs)
        t4 = time.perf_counter()
        long = answer_requests(" ".join(RATE_TEXTS[::-1] * 2), [0], RATE_QUESTIONS[:1], "single", 20, 1)  # nothing shared
        (scored,) = model.score(long)
        t5 = time.perf_counter()
    finally:
        model.close()
    read_rate = read.prompt_tokens / (t1 - t0)
    write_s = (t2 - t1) - wrote.prompt_tokens / read_rate
    return Rates(read=read_rate, write=max(wrote.completion_tokens - 1, 1) / max(write_s, 1e-3), pairs=len(reqs) / (t4 - t3),
                 answer_read=(scored.prompt_tokens - scored.cached_tokens) / (t5 - t4))  # what a cache held was not read


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
