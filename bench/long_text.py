"""One huge text among normal ones: seconds of `Encoder.encode` for a list of one ~15 MB text and 100 sentences.

    python bench/long_text.py [--mb 15] [--kind spaces|cjk|punct|word] [--backend auto] [--repeat 3]

The encoder reads only a text's first max_seq_length tokens; the tokenizer is handed a prefix of a huge text that
gives the same tokens (`cqg_ray.long_texts`). Kinds of the huge text: spaces (English sentences), cjk (Chinese
characters, no whitespace), punct ("a,b." repeated: no whitespace), word (one word of "a"s: no cut point, tokenized
whole). Prints the load, the 100 sentences alone and with the huge text's first 2,000 characters (a normal text that
fills max_seq_length) for scale, then per repeat the seconds of the call, and the best.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SENTENCES = ["Stock markets fell sharply on Tuesday after the central bank raised rates.", "a cat sat on the mat",
             "How do I reset my password?", "The film was long, but the acting made up for it.",
             "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen in the chloroplasts of plant cells."]
HUGE = {"spaces": " ".join(SENTENCES) + " ", "cjk": "中文字符", "punct": "a,b.", "word": "a"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=15.0, help="characters of the huge text, in millions")
    ap.add_argument("--kind", choices=sorted(HUGE), default="spaces")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from cqg_ray.encoder import load_encoder

    t0 = time.perf_counter()
    enc = load_encoder("bundled:all-MiniLM-L6-v2", backend=args.backend, device="cpu")
    print(f"load {enc.backend}: {time.perf_counter() - t0:.1f} s")
    normal = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(100)]
    unit = HUGE[args.kind]
    huge = (unit * (int(args.mb * 1e6) // len(unit) + 1))[: int(args.mb * 1e6)]
    enc.encode(normal)  # warm-up
    t0 = time.perf_counter()
    enc.encode(normal)
    print(f"100 sentences alone: {time.perf_counter() - t0:.3f} s")
    t0 = time.perf_counter()
    enc.encode([huge[:2000]] + normal)  # a normal text past max_seq_length: its mini-batch runs at full length
    print(f"its first 2,000 characters + 100 sentences: {time.perf_counter() - t0:.3f} s")
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        enc.encode([huge] + normal)
        times.append(time.perf_counter() - t0)
        print(f"{len(huge):,} characters ({args.kind}) + 100 sentences: {times[-1]:.3f} s")
    print(f"best: {min(times):.3f} s")


if __name__ == "__main__":
    main()
