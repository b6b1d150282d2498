"""The m classification heads C_1..C_m of the MBQA model (paper section 3.2), stored as stacked tensors.

Each head is the paper's small MLP, C_i(e) = W2_i . ReLU(W1_i e + b1_i) + b2_i, with W1_i of shape (hidden, d).
Instead of m separate modules called in a Python loop, the m heads live in four tensors

    w1 (m, hidden, d)   b1 (m, hidden)   w2 (m, hidden)   b2 (m,)

(head i is row i of each, and w1[i] is exactly the weight of its ``nn.Linear(d, hidden)``), so that

    x (B, d)     -> every head on every text:     one (B, d) x (d, m*hidden) matmul + a small reduction -> (B, m)
    x (m, K, d)  -> head i on its own K texts:    one batched matmul over the m heads                 -> (m, K)

The first form is inference (`InterpretableEmbedder.encode`); the second is training on labelled pairs,
where each head only sees the texts that have an answer for it (see `cqg_ray.mbqa.train`).
`forward_pairs` evaluates head q[p] on text x[p] for arbitrary (text, question) pairs.

Weights are saved with safetensors; the file's metadata holds d, m and hidden, so a file describes itself.
"""

from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

FORMAT = "cqg_ray.StackedHeads"


class StackedHeads(nn.Module):
    def __init__(self, d: int, m: int, hidden: int = 8):
        super().__init__()
        if d < 1 or m < 1 or hidden < 1:
            raise ValueError(f"StackedHeads needs d, m, hidden >= 1 (got d={d}, m={m}, hidden={hidden})")
        self.d, self.m, self.hidden = d, m, hidden
        self.w1 = nn.Parameter(torch.empty(m, hidden, d))
        self.b1 = nn.Parameter(torch.empty(m, hidden))
        self.w2 = nn.Parameter(torch.empty(m, hidden))
        self.b2 = nn.Parameter(torch.empty(m))
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """nn.Linear's default initialisation, head by head: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        with torch.no_grad():
            for p, fan_in in ((self.w1, self.d), (self.b1, self.d), (self.w2, self.hidden), (self.b2, self.hidden)):
                bound = 1.0 / math.sqrt(fan_in)
                p.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits. x (B, d) -> (B, m): every head on every text; x (m, K, d) -> (m, K): head i on x[i]."""
        if x.dim() == 2:
            return self.forward_all(x)
        if x.dim() == 3:
            return self.forward_grouped(x)
        raise ValueError(f"StackedHeads expects (B, d) or (m, K, d) inputs, got shape {tuple(x.shape)}")

    def forward_all(self, x: torch.Tensor) -> torch.Tensor:
        """(B, d) -> (B, m) logits: all m heads on every text."""
        m, h, d = self.w1.shape
        if x.shape[-1] != d:
            raise ValueError(f"inputs have {x.shape[-1]} dims, the heads expect d={d}")
        hid = F.linear(x, self.w1.reshape(m * h, d), self.b1.reshape(m * h)).relu_()  # (B, m*h), one matmul
        return torch.einsum("bmh,mh->bm", hid.view(-1, m, h), self.w2) + self.b2

    @torch.no_grad()
    def probability_sums(self, x, floats: int = 1 << 22):
        """(m,) float64 numpy: each head's sum of sigma(logit) over the texts x (n, d), in chunks of texts whose hidden
        activations (chunk x m x hidden) stay under ``floats`` numbers (16 MB), however many heads there are."""
        import numpy as np

        x = np.asarray(x, dtype=np.float32)
        m, h, _ = self.w1.shape
        chunk = max(1, floats // (m * h))
        total = torch.zeros(m, dtype=torch.float64)
        for i in range(0, len(x), chunk):  # torch.tensor copies the chunk (x may be a read-only Arrow buffer)
            total += torch.sigmoid(self.forward_all(torch.tensor(x[i : i + chunk]).to(self.w1.device, self.w1.dtype))).double().sum(0).cpu()
        return total.numpy()

    def mean_probabilities(self, x):
        """(m,) float32 numpy: each head's mean sigma(logit) over the texts x (n, d) (the centring statistics)."""
        return (self.probability_sums(x) / max(len(x), 1)).astype("float32")

    def forward_grouped(self, x: torch.Tensor) -> torch.Tensor:
        """(m, K, d) -> (m, K) logits: head i on its own K texts x[i] (one batched matmul)."""
        m, h, d = self.w1.shape
        if x.shape[0] != m or x.shape[-1] != d:
            raise ValueError(f"grouped inputs must be (m={m}, K, d={d}), got {tuple(x.shape)}")
        # computed transposed, (m, h, d) x (m, d, K) -> (m, h, K), so that w1's gradient comes out in w1's layout
        hid = F.relu(torch.bmm(self.w1, x.transpose(1, 2)) + self.b1.unsqueeze(2))
        return torch.bmm(self.w2.unsqueeze(1), hid).squeeze(1) + self.b2.unsqueeze(1)

    def forward_pairs(self, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """(P, d), (P,) -> (P,) logits of head q[p] on text x[p]. Memory ~ P*hidden*d: pass pairs in chunks."""
        hid = F.relu(torch.bmm(self.w1[q], x.unsqueeze(2)).squeeze(2) + self.b1[q])  # (P, h)
        return (hid * self.w2[q]).sum(-1) + self.b2[q]

    @torch.no_grad()
    def calibrated(self, a: float, b: float) -> "StackedHeads":
        """A copy whose logits are ``a * logit + b`` (Platt scaling folded into the last layer: w2 * a, b2 * a + b)."""
        if not a > 0:
            raise ValueError(f"calibration scale must be positive, got {a}")
        out = self.subset(torch.ones(self.m, dtype=torch.bool))
        out.w2.mul_(a)
        out.b2.mul_(a).add_(b)
        return out

    @torch.no_grad()
    def subset(self, keep) -> "StackedHeads":
        """A copy holding only the heads where ``keep`` (bool (m,)) is true, in their order."""
        keep = torch.as_tensor(keep, dtype=torch.bool, device="cpu")
        if keep.shape != (self.m,) or not keep.any():
            raise ValueError(f"keep must be a bool mask of {self.m} heads with at least one true")
        idx = keep.nonzero().squeeze(1).to(self.w1.device)
        out = StackedHeads(self.d, int(keep.sum()), self.hidden).to(self.w1.device, self.w1.dtype)
        for name in ("w1", "b1", "w2", "b2"):
            getattr(out, name).copy_(getattr(self, name).index_select(0, idx))
        return out

    # ------------------------------------------------------------------ safetensors
    def config(self) -> dict:
        return {"format": FORMAT, "d": self.d, "m": self.m, "hidden": self.hidden}

    def to_bytes(self) -> bytes:
        tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.state_dict().items()}
        return st_save(tensors, metadata={"config": json.dumps(self.config())})

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>") -> "StackedHeads":
        try:
            tensors = st_load(data)
            meta = safetensors_metadata(data)
        except Exception as e:
            raise ValueError(f"{source} is not a valid safetensors file: {e}") from None
        try:
            cfg = json.loads(meta["config"])
            if cfg.get("format") != FORMAT:
                raise ValueError(f"format is {cfg.get('format')!r}, expected {FORMAT!r}")
            heads = cls(int(cfg["d"]), int(cfg["m"]), int(cfg["hidden"]))
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
            raise ValueError(f"{source}: bad StackedHeads metadata ({e})") from None
        expected = {k: tuple(v.shape) for k, v in heads.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if got != expected:
            raise ValueError(f"{source}: tensors {got} do not match the stored config {expected}")
        broken = [k for k, v in sorted(tensors.items()) if not torch.isfinite(v).all()]
        if broken:
            raise ValueError(f"{source}: {', '.join(broken)} hold NaN or infinite weights (a diverged training or a damaged file: "
                             "train the model again, or copy it again)")
        heads.load_state_dict(tensors)
        return heads

    def save(self, path: str) -> None:
        """Write a local .safetensors file (see `InterpretableEmbedder.save` for the full model folder)."""
        with open(path, "wb") as f:
            f.write(self.to_bytes())

    @classmethod
    def load(cls, path: str) -> "StackedHeads":
        with open(path, "rb") as f:
            return cls.from_bytes(f.read(), source=path)


def safetensors_metadata(data: bytes) -> dict:
    """The safetensors header's __metadata__ (8-byte little-endian length, then JSON); {} when it has none."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]).get("__metadata__") or {}


def sorted_header(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its header's keys in sorted order, so equal contents give equal bytes:
    safetensors writes the metadata of several keys in a hash map's order, new at every save. The header keeps its
    length (padded with spaces, as safetensors pads it), so the tensors' offsets stay as they are."""
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8 : 8 + n]), sort_keys=True, separators=(",", ":")).encode()
    if len(header) > n:  # a header written with spaces between its items: leave it
        return data
    return data[:8] + header.ljust(n, b" ") + data[8 + n :]


def masked_bce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, pos_weight: float | torch.Tensor) -> torch.Tensor:
    """Weighted binary cross-entropy over the labelled pairs only (the paper's BCEWithLogitsLoss with pos_weight).

    loss = sum_{mask} -[w * y * log sigma(z) + (1 - y) * log(1 - sigma(z))] / #mask,  w = pos_weight = #no / #yes.
    ``mask`` is 1 where a label exists; entries outside it count for nothing (their labels may hold anything).
    Returns 0 (with a gradient path) when nothing is labelled.
    """
    mask = mask.to(logits.dtype)
    pw = torch.as_tensor(pos_weight, dtype=logits.dtype, device=logits.device)
    per_pair = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), pos_weight=pw, reduction="none")
    return (per_pair * mask).sum() / mask.sum().clamp_min(1.0)
