"""Single-pass yes/no scoring in torch (transformers), on the bundled model's weights dequantised once.

    scorer = TorchScorer("~/.cache/cqg-ray/models/qwen2.5-coder-0.5b-hf", dtype="bfloat16", n_threads=2)
    scorer.score([tokens, ...], yes_ids, no_ids)            # -> [(p_yes, shared_tokens), ...], like BatchEngine.score

The same prefix tree as the llama.cpp engine (``batch.tree_entries``), run as one sequence: each tree token once,
its position its depth, and a 4D attention mask that lets a token see only its own ancestors; P(yes) comes from
the final hidden state at each prompt's last token times the yes/no rows of the output matrix (softmax over
the two answers needs no other logits). bfloat16 reaches the matrix units of CPUs with AVX-512-BF16 or AMX; on
others it is emulated and float32 is the fast choice (``hardware.pick_dtype``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from cqg_ray.hardware import pick_dtype
from cqg_ray.llm.batch import p_yes_from_logits, tree_batches


def tree_mask(token_lists: Sequence[Sequence[int]], lcp: Sequence[int], n_entries: int) -> np.ndarray:
    """(n, n) bool: entry a may attend to entry b, i.e. b is on the path from the root to a (a included).

    Entries are numbered as ``tree_entries`` numbers them: prompt by prompt, each prompt's own tokens from ``lcp[j]``."""
    mask = np.zeros((n_entries, n_entries), dtype=bool)
    chain: list[int] = []  # entry index of each position of the previous prompt's path
    e = 0
    for j, t in enumerate(token_lists):
        chain = chain[: lcp[j]] + list(range(e, e + len(t) - lcp[j]))
        for pos in range(lcp[j], len(t)):
            mask[e, chain[: pos + 1]] = True
            e += 1
    return mask


class TorchScorer:
    """A causal LM in torch that scores single-pass prompts as prefix trees."""

    def __init__(self, model_dir: str | Path, dtype: str = "auto", n_threads: int | None = None, max_seqs: int = 64, max_tokens: int = 2048):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        if n_threads:
            torch.set_num_threads(n_threads)
        self.dtype_name = pick_dtype() if dtype == "auto" else dtype
        self.dtype = getattr(torch, self.dtype_name)
        self.model = AutoModelForCausalLM.from_pretrained(str(Path(model_dir).expanduser()), dtype=self.dtype, attn_implementation="sdpa").eval()
        self.out = self.model.get_output_embeddings().weight
        self.max_seqs, self.max_tokens = max_seqs, max_tokens

    def score(self, token_lists: Sequence[Sequence[int]], yes_ids: Sequence[int], no_ids: Sequence[int], share_prefix: bool = True) -> list[tuple[float, int]]:
        """(P(yes) at the position after each prompt, prompt tokens shared with another prompt of its batch) per prompt."""
        torch = self.torch
        rows = torch.as_tensor(list(yes_ids) + list(no_ids))
        ny = len(yes_ids)
        yes_cols, no_cols = range(ny), range(ny, ny + len(no_ids))
        out: list[tuple[float, int]] = [(float("nan"), 0)] * len(token_lists)
        for indices, group, entries, last, shared in tree_batches(token_lists, self.max_seqs if share_prefix else 1, self.max_tokens):
            mask = torch.from_numpy(tree_mask(group, shared, len(entries)))[None, None]
            ids = torch.tensor([[e[0] for e in entries]])
            pos = torch.tensor([[e[1] for e in entries]])
            with torch.inference_mode():
                hidden = self.model.model(input_ids=ids, position_ids=pos, attention_mask=mask).last_hidden_state[0]
                logits = (hidden[last] @ self.out[rows].T).double().numpy()  # the yes and no rows of the output matrix only
            for j, i in enumerate(indices):
                out[i] = (p_yes_from_logits(logits[j], yes_cols, no_cols), shared[j])
        return out

    def close(self) -> None:
        self.model = None

