"""Question generation: cluster prompts decoded together against one at a time, on each embedded engine.

    python bench/generate.py                      # 32 CQG prompts on clusters of the shared corpus, bundled 0.5B model
    python bench/generate.py --prompts 8 --batch 8 --engines torch-float32
    python bench/generate.py --demo --prompts 4 --no-baseline --engines llamacpp,torch-float32   # the demo's own work

``--engines llamacpp,llamacpp-whole``: llama.cpp's batched decoding with the call's common prefix read once (the
default) and with every prompt read whole (``share_prefix=False``); last line ``llamacpp_shared_prefix_vs_whole``.

``--demo``: what the demo's questions stage asks instead: the property prompt (3 worked examples) with 6 positives
and 36 negatives (n_p, n_h + n_e) clipped at 200 characters, written by the bundled 1.5B (``cqg.writer_model``);
``--negatives 12`` gives the prompts of the demo's floor sizing (6 + 6):

    python bench/generate.py --demo --prompts 16 --negatives 12 --no-baseline --no-ceiling --engines torch-float32

Every side runs the same A.1 prompts (6 positives, 12 negatives, texts clipped at 200 characters, as the demo) with
greedy decoding and at most 260 new tokens: one at a time through llama.cpp's ``create_chat_completion`` (the path
before batching, the baseline), and ``--batch`` sequences at a time on each of ``--engines`` (``llamacpp``:
``BatchEngine.generate``, continuous batching; ``torch-<dtype>``: ``TorchEngine.generate`` on the GGUF's weights
dequantised once, static batches of similar length; default dtype: bfloat16 where the CPU has AVX-512-BF16 or AMX,
float32 elsewhere). Printed per side: wall time (model loading excluded), prompt and generated tokens, how many
questions it parsed and how many replies are identical to the baseline's (a torch engine also: the seconds its own
counters give to reading the prompts and to decoding steps); then the prefill ceiling: the time the
torch engine needs only to read the prompts (``max_tokens=1``), the floor of any batched run on it. Last lines:
generation_batch_speedup (the fastest batched side against the baseline) and, when llama.cpp and a torch engine both
ran batched, torch_vs_llamacpp_batched_generate (llama.cpp's batched wall time over the fastest torch engine's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import cpu_line, cqg_prompts  # noqa: E402

from cqg_ray import progress  # noqa: E402
from cqg_ray.config import LLMConfig, LlamaCppConfig  # noqa: E402
from cqg_ray.hardware import pick_dtype  # noqa: E402
from cqg_ray.llm.base import Request, resolve_engine  # noqa: E402
from cqg_ray.llm.engines.llamacpp import LlamaCppBackend  # noqa: E402
from cqg_ray.llm.parse import parse_questions  # noqa: E402


def report(name: str, outs, wall: float, one=None) -> None:
    pt, ct = sum(o.prompt_tokens for o in outs), sum(o.completion_tokens for o in outs)
    nq = sum(len(parse_questions(o.text)) for o in outs)
    same = f"  {sum(a.text == b.text for a, b in zip(outs, one))} of {len(outs)} replies identical to one at a time" if one else ""
    print(f"{name:>24}: {wall:7.1f} s  {len(outs)} prompts  {pt} prompt + {ct} generated tokens  {ct / wall:6.1f} generated tok/s  "
          f"{nq} questions parsed{same}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=LlamaCppConfig().batch_generate, help="sequences decoded together (llamacpp.batch_generate)")
    ap.add_argument("--max-tokens", type=int, default=260)
    ap.add_argument("--model", default="bundled:qwen2.5-coder-0.5b")
    ap.add_argument("--engines", default=f"llamacpp,torch-{pick_dtype()}",
                    help="batched engines to compare (llamacpp, llamacpp-whole: each prompt read whole, torch-float32, torch-bfloat16)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the prompt-reading-only run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demo", action="store_true", help="the demo's prompts and writer: property prompt, 6 + 36 texts, the bundled 1.5B")
    ap.add_argument("--no-baseline", action="store_true", help="skip the one-at-a-time llama.cpp run (the batched sides are compared alone)")
    ap.add_argument("--negatives", type=int, default=None, help="negative texts a prompt (default 12; 36 with --demo; 12 is the demo's floor)")
    args = ap.parse_args()
    if args.demo and args.model == ap.get_default("model"):
        args.model = "bundled:qwen2.5-coder-1.5b"
    print(cpu_line())
    print(f"llamacpp.generate_engine auto -> {resolve_engine('auto', work='generate')} on this CPU", flush=True)
    shape = {"n_pos": 6, "n_neg": 36, "prompt": "property"} if args.demo else {}
    if args.negatives is not None:
        shape["n_neg"] = args.negatives
    reqs = [Request(m, max_tokens=args.max_tokens) for m in cqg_prompts(args.prompts, args.seed, **shape)]
    print(f"{len(reqs)} {'property (demo)' if args.demo else 'A.1'} prompts, model {args.model}", flush=True)
    b = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(model=args.model, batch_generate=args.batch)))

    batched: dict[str, tuple[list, float]] = {}
    for engine in args.engines.split(","):
        if engine.startswith("torch-"):
            t0 = time.perf_counter()
            b._generator = b.torch_engine(engine.split("-", 1)[1])
            print(f"{engine}: model loaded in {time.perf_counter() - t0:.1f} s (not counted)", flush=True)
        else:
            b._generator = WholePrompts(b.engine) if engine == "llamacpp-whole" else b.engine
        before = progress.snapshot()
        t0 = time.perf_counter()
        got = dict(b.generate_batched(reqs))
        batched[engine] = ([got[i] for i in range(len(reqs))], time.perf_counter() - t0)
        report(f"{engine} batched x{args.batch}", *batched[engine])
        c = {k: v - before.get(k, 0.0) for k, v in progress.snapshot().items()}
        if c.get("read_s"):  # the torch engine's own counters
            print(f"{'':>24}  reading {c['read']:.0f} prompt tokens {c['read_s']:.1f} s ({c['read'] / c['read_s']:.0f} tok/s), "
                  f"decoding {c['generated']:.0f} tokens {c['generate_s']:.1f} s", flush=True)

    ceiling = None
    torch_engines = [e for e in batched if e.startswith("torch-")]
    if torch_engines and not args.no_ceiling:  # prompt reading only: one new token per prompt
        b._generator = b.torch_engine(torch_engines[0].split("-", 1)[1])
        t0 = time.perf_counter()
        got = dict(b.generate_batched([Request(r.messages, max_tokens=1) for r in reqs]))
        ceiling = time.perf_counter() - t0
        pt = sum(c.prompt_tokens for c in got.values())
        print(f"{torch_engines[0]} prompt reading only (max_tokens=1): {ceiling:.1f} s, {pt / ceiling:.0f} prompt tok/s", flush=True)

    best = min(batched, key=lambda e: batched[e][1])
    if not args.no_baseline:
        t0 = time.perf_counter()
        one = [b.complete_one(r) for r in reqs]
        t_one = time.perf_counter() - t0
        report("llamacpp one at a time", one, t_one)
        for engine, (outs, wall) in batched.items():
            report(f"{engine} batched x{args.batch}", outs, wall, one)
        if ceiling:
            print(f"ceiling: {t_one / ceiling:.2f}x if decoding cost nothing on {torch_engines[0]} "
                  f"(one at a time {t_one:.1f} s / prompt reading {ceiling:.1f} s)")
    print(f"fastest batched: {best}")
    if not args.no_baseline:
        print(f"generation_batch_speedup: {t_one / batched[best][1]:.2f}")
    if "llamacpp" in batched and torch_engines:  # the fastest torch engine against llama.cpp's own batched decoding
        fastest = min(torch_engines, key=lambda e: batched[e][1])
        print(f"fastest torch engine: {fastest}")
        print(f"torch_vs_llamacpp_batched_generate: {batched['llamacpp'][1] / batched[fastest][1]:.2f}")
    if "llamacpp" in batched and "llamacpp-whole" in batched:
        same = sum(a.text == w.text for a, w in zip(batched["llamacpp"][0], batched["llamacpp-whole"][0]))
        print(f"common prefix read once vs every prompt whole: {same} of {len(reqs)} replies identical")
        print(f"llamacpp_shared_prefix_vs_whole: {batched['llamacpp-whole'][1] / batched['llamacpp'][1]:.2f}")
    b.close()


class WholePrompts:
    """llama.cpp's batched decoding with every prompt read whole (no common prefix read once)."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, max_tokens):
        return self.engine.generate(prompts, max_tokens, share_prefix=False)

    def __getattr__(self, name):
        return getattr(self.engine, name)


if __name__ == "__main__":
    main()
