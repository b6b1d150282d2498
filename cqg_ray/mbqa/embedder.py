"""The trained MBQA model M = (Enc, {C_1..C_m}) as a self-contained folder, and its Python API.

    from cqg_ray import InterpretableEmbedder
    model = InterpretableEmbedder.load("runs/demo/model")    # a folder, a URI, or a shipped model's name (models/<name>)
    sparse = model.encode(["a text", "another"], output="sparse")   # scipy csr_array (n, m): the budgeted questions' values
    bits = model.encode(texts)                                 # (n, m) uint8 0/1: the active questions (model.budget)
    probs = model.encode(texts, output="probs")                # (n, m) float32 sigma(C_i(Enc(t))), dense
    packed = model.encode(texts, output="packed")              # (n, ceil(m/8)) uint8, np.packbits of the bits
    bits = model.encode(texts, k=16)                           # another budget for one call (k=, threshold=, budget=)
    ex = model.explain("text a", "text b")                     # shared active questions (cognitive load), differences
    model.questions                                            # the m questions, dimension order

Which questions are active is the model's ``budget`` (``cqg_ray.mbqa.budget``): top-k by confidence with a floor,
or the paper's global tau. Every surface (encode, explain, search, serve, embed, evaluate) asks ``model.apply``.

The folder (local path or any URI `cqg_ray.rundir` understands):

    config.json        format, format_version, encoder (name or path), dims d, hidden, m, tau, budget, normalize, versions,
                       labelled_by (the LLM that labelled its training texts: backend, model, answer_mode, prompt, yes_above,
                       score_engine for the embedded backend), sha256 (the weights files' checksums)
    questions.json     [{"id", "text", "cluster", "quality", "yes_rate", "labels", ...}, ...] in dimension order
    heads.safetensors  the stacked heads (`StackedHeads`), with d/m/hidden in its metadata
    stats.safetensors  ``mean``: each question's mean probability on the training texts (centred values)
    eval_report.json   the held-out question-answering report (paper Table 6), when there is one

Format version 1 has no budget: its rule is p > tau with 0/1 values, exactly as before. A budget (or stats) makes the
folder version 2, which an older cqg-ray refuses instead of silently using tau.
Loading checks that the files exist and parse, that the weights match their checksums (a folder saved before them has
none), and that questions, heads, config and encoder agree.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from cqg_ray.encoder import batch_plan, length_order, unit_rows
from cqg_ray.texts import BLANK, blank, text_list, unicode_error
from cqg_ray.explain import Explanation, explanation
from cqg_ray.mbqa.budget import Budget, apply_budget
from cqg_ray.mbqa.budget_torch import join_parts, output_part, zero_rows
from cqg_ray.mbqa.heads import StackedHeads, sorted_header
from cqg_ray.mbqa.folder import (STATS, ModelError, check_digest, model_dirs, read_json, read_questions, read_stats, resolve_model,
                                 sha256, shipped_models)
from cqg_ray.progress import View as progress_view
from cqg_ray.progress import add as add_progress
from cqg_ray.rundir import RunDir, versions

FORMAT = "cqg-ray-mbqa"
FORMAT_VERSION = 2  # 2: config.json may hold a budget, the folder a stats.safetensors; 1: p > tau only
OUTPUTS = ("bits", "packed", "probs", "sparse")  # active questions 0/1, np.packbits of them, probabilities, csr values
HEAD_CHUNK = {"cpu": 256, "cuda": 4096}  # texts per heads-and-budget step: device memory is bounded by one chunk's (n, m)
CHUNK_SIZE = 4096  # texts per encoder call in `encode` (its embeddings stay on the device until the heads have run)


_count = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1  # noqa: E731
CONFIG_TYPES = (  # config.json's fields: (key, what it must be, the check)
    ("format_version", "a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    ("encoder", "a model name or path", lambda v: isinstance(v, str) and bool(v.strip())),
    ("dims", "a whole number >= 1", _count), ("hidden", "a whole number >= 1", _count), ("m", "a whole number >= 1", _count),
    ("tau", "a number in (0, 1)", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1),
    ("normalize", "true or false", lambda v: isinstance(v, bool)),
    ("labelled_by", "an object naming a model", lambda v: isinstance(v, dict) and isinstance(v.get("model"), str)),
    ("sha256", "an object of file names and their checksums", lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values())),
)


class InterpretableEmbedder:
    """A trained CQG-MBQA model: a frozen sentence encoder and one small head per yes/no question. ``encode`` gives
    texts' answers (bits, packed, probabilities or sparse values), ``explain`` why two texts are similar; load a folder
    or a shipped model with ``InterpretableEmbedder.load``."""

    def __init__(self, encoder_name: str, questions: list[dict], heads: StackedHeads, tau: float = 0.5,
                 eval_report: dict | None = None, normalize: bool = True, device: str | None = None, encoder=None,
                 backend: str = "auto", budget: Budget | None = None, mean: np.ndarray | None = None):
        if len(questions) != heads.m:
            raise ModelError(f"{len(questions)} questions but {heads.m} heads")
        if not 0 < tau < 1:
            raise ModelError(f"tau must lie in (0, 1), got {tau}")
        self.encoder_name = encoder_name
        self.question_records = [{"text": q} if isinstance(q, str) else dict(q) for q in questions]  # records, or their texts
        self.tau = float(tau)
        self.budget = Budget(rule="tau", tau=self.tau) if budget is None else budget  # None: format 1, p > tau
        self.versioned_budget = budget is not None or mean is not None  # written to config.json (format 2)
        self.mean = mean
        self.stats_source = ""  # which training texts the means were measured on (stats.safetensors metadata)
        if self.mean is not None and self.mean.shape != (heads.m,):
            raise ModelError(f"stats mean has shape {self.mean.shape}, expected ({heads.m},)")
        if self.budget.needs_mean and self.mean is None:
            raise ModelError("the budget centres values or ranks by p - mean but the model has no stats (mean probabilities)")
        self.eval_report = eval_report
        self.normalize = normalize
        self.device = device if device is not None else "cuda" if torch.cuda.is_available() else "cpu"
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ValueError(f"device={self.device!r} is not a torch device: 'cpu', 'cuda' or 'cuda:N' (or leave it out)") from None
        if str(self.device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r}, but torch {torch.__version__} sees no CUDA GPU here; leave device out, or 'cpu'")
        self.backend = backend  # the encoder backend (cqg_ray.encoder); the heads stay torch
        self.path: str | None = None  # the folder it was loaded from
        self.loaded_config: dict = {}  # its config.json: keys this version does not write, and the versions, survive a save
        self.labelled_by: dict | None = None  # the LLM that labelled its training texts (the training stage's), if known
        self.heads = heads.to(self.device).eval()
        self._encoder = encoder
        if encoder is not None:
            self._check_encoder(encoder)

    # ------------------------------------------------------------------ properties
    @property
    def questions(self) -> list[str]:
        """The m question texts, in dimension order."""
        return [q["text"] for q in self.question_records]

    @property
    def mean(self) -> np.ndarray | None:
        """(m,) float32: each question's mean probability on the training texts (None: the model has no stats)."""
        return self._mean

    @mean.setter
    def mean(self, mean) -> None:
        self._mean = None if mean is None else np.asarray(mean, dtype=np.float32)
        self._mean_t = None  # its copy on the heads' device, made on first use

    @property
    def dims(self) -> int:
        return self.heads.d

    @property
    def m(self) -> int:
        return self.heads.m

    @property
    def encoder(self):
        """The frozen sentence encoder (`cqg_ray.encoder.Encoder`), loaded on first use."""
        if self._encoder is None:
            from cqg_ray.encoder import load_encoder

            try:
                enc = load_encoder(self.encoder_name, backend=self.backend, device=self.device)
            except (OSError, ValueError) as e:  # an unknown bundled name, a missing folder, a hub name not cached here
                raise ModelError(f"cannot load the encoder {self.encoder_name!r} the model names: {e}") from None
            self._check_encoder(enc)
            self._encoder = enc
        return self._encoder

    def _check_encoder(self, enc) -> None:
        dim = enc.dim
        if dim != self.heads.d:
            raise ModelError(f"encoder {self.encoder_name!r} gives {dim} dims but the heads expect d={self.heads.d}")

    # ------------------------------------------------------------------ folder
    def save(self, path: str | os.PathLike) -> None:
        """Write the model folder; config.json goes last, so a folder with a config.json is complete."""
        run = RunDir(os.fspath(path))
        heads = self.heads.to_bytes()
        digests = {"heads.safetensors": sha256(heads)}  # the weights' checksums, in config.json: `load` checks them
        run.write_bytes("heads.safetensors", heads)
        run.write_json("questions.json", self.question_records)
        if self.eval_report is not None:
            run.write_json("eval_report.json", self.eval_report)
            from cqg_ray.mbqa.report import format_report, is_table6

            if is_table6(self.eval_report):  # the paper's Table 6 form, for people
                run.write_bytes("eval_report.md", (format_report(self.eval_report) + "\n").encode())
        cfg = {"format": FORMAT, "format_version": 1, "encoder": self.encoder_name, "dims": self.heads.d,
               "hidden": self.heads.hidden, "m": self.heads.m, "tau": self.tau, "normalize": self.normalize}
        if self.versioned_budget:
            cfg.update(format_version=2, budget=self.budget.to_dict())
        if self.mean is not None:
            from safetensors.numpy import save

            stats = sorted_header(save({"mean": self.mean}, metadata={"what": "mean probability per question on the training texts",
                                                                    "source": self.stats_source}))
            run.write_bytes(STATS, stats)
            cfg["stats"], digests[STATS] = STATS, sha256(stats)
        cfg["sha256"] = digests
        if self.labelled_by is not None:
            cfg["labelled_by"] = self.labelled_by
        kept = {k: v for k, v in self.loaded_config.items() if k not in (*cfg, "budget", "stats", "versions")}
        run.write_json("config.json", {**kept, **cfg, "versions": self.loaded_config.get("versions") or versions()})
        if self.mean is None and run.exists(STATS):  # saved over a model with stats: they would stay behind, unnamed
            run.rm(STATS)

    @classmethod
    def load(cls, path: str, device: str | None = None, encoder=None, load_encoder: bool = True,
             backend: str = "auto") -> "InterpretableEmbedder":
        """Load and check a model folder. `encoder`: an already loaded `Encoder` to use instead; `backend`: the
        encoder backend otherwise (cqg_ray.encoder); `load_encoder=False` defers loading the encoder to the first
        `encode` (heads-only use)."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"load takes a model folder, a URI or a shipped model's name (str or path), got {type(path).__name__}")
        if not os.fspath(path).strip():
            raise ModelError("no model given: name a model folder, a URI or a shipped model")
        path = resolve_model(os.fspath(path))
        run = RunDir(path)
        if not run.exists("config.json"):
            what = "a file, not a folder" if os.path.isfile(path) else "folder exists" if run.exists() else "path does not exist"
            hint = ""
            if "/" not in path and os.sep not in path:
                hint = f"; shipped models: {', '.join(shipped_models()) or 'none found'} (looked in {', '.join(map(str, model_dirs()))})"
            raise ModelError(f"not a cqg-ray model: no config.json in {path} ({what}){hint}")
        cfg = read_json(run, "config.json")
        if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
            raise ModelError(f"{path}/config.json is not a cqg-ray model config (format {cfg.get('format') if isinstance(cfg, dict) else None!r})")
        missing = [k for k in ("encoder", "dims", "hidden", "m", "tau") if k not in cfg]
        if missing:
            raise ModelError(f"{path}/config.json lacks {', '.join(missing)}")
        wrong = [f"{k} must be {what}, got {cfg[k]!r}" for k, what, ok in CONFIG_TYPES if k in cfg and not ok(cfg[k])]
        if wrong:
            raise ModelError(f"{path}/config.json: {'; '.join(wrong)}")
        if cfg.get("format_version", 0) > FORMAT_VERSION:
            raise ModelError(f"{path} has model format version {cfg['format_version']}; this cqg-ray reads up to {FORMAT_VERSION}")
        questions = read_questions(run, path)
        if not run.exists("heads.safetensors"):
            raise ModelError(f"missing artifact: {path}/heads.safetensors")
        data = run.read_bytes("heads.safetensors")
        try:
            heads = StackedHeads.from_bytes(data, source=f"{path}/heads.safetensors")
        except ValueError as e:
            raise ModelError(str(e)) from None
        check_digest(data, "heads.safetensors", path, cfg)  # it parses and its weights are finite: the bytes saved?
        if (heads.d, heads.hidden, heads.m) != (cfg["dims"], cfg["hidden"], cfg["m"]):
            raise ModelError(f"{path}: heads.safetensors has d={heads.d}, hidden={heads.hidden}, m={heads.m} "
                             f"but config.json says dims={cfg['dims']}, hidden={cfg['hidden']}, m={cfg['m']}")
        if len(questions) != heads.m:
            raise ModelError(f"{path}: questions.json has {len(questions)} questions but there are {heads.m} heads")
        report = read_json(run, "eval_report.json") if run.exists("eval_report.json") else None
        budget, mean = None, None
        if "budget" in cfg:
            try:
                budget = Budget.from_dict(cfg["budget"]) if isinstance(cfg["budget"], dict) else Budget.from_dict({"rule": cfg["budget"]})
            except (TypeError, ValueError) as e:
                raise ModelError(f"{path}/config.json: bad budget: {e}") from None
        if cfg.get("stats"):
            mean, source = read_stats(run, str(cfg["stats"]), path, cfg)
        try:
            model = cls(cfg["encoder"], questions, heads, cfg["tau"], report, cfg.get("normalize", True), device, encoder, backend,
                        budget=budget, mean=mean)
        except ModelError as e:
            raise ModelError(f"{path}: {e}") from None
        model.path, model.loaded_config, model.labelled_by = path, cfg, cfg.get("labelled_by")
        if mean is not None:
            model.stats_source = source
        if load_encoder:
            model.encoder
        return model

    # ------------------------------------------------------------------ embedding
    @torch.no_grad()
    def _parts(self, emb: torch.Tensor, output: str, budget: Budget) -> list:
        """The heads and the budget on embeddings (n, d), a chunk of texts at a time on the heads' device; per chunk,
        only what ``output`` needs is copied to the host (``budget_torch.output_part``)."""
        if self._mean_t is None and self._mean is not None:
            self._mean_t = torch.from_numpy(self._mean).to(self.device)
        step = HEAD_CHUNK["cuda" if str(self.device).startswith("cuda") else "cpu"]
        parts = []
        for i in range(0, len(emb), step):
            p = torch.sigmoid(self.heads(emb[i : i + step].to(self.device, self.heads.w1.dtype))).float()
            parts.append(output_part(p, output, budget, self._mean_t))
        return parts

    # ------------------------------------------------------------------ the budget
    def budget_for(self, threshold: float | None = None, k: int | None = None, budget: Budget | None = None, output: str = "bits") -> Budget:
        """The budget of one call: ``budget`` as given (a ``Budget``, or its dict); ``threshold``: the tau rule at that tau (values as the model's);
        ``k``: the model's budget with k questions (a tau-rule model: top-k with its tau as the floor); else the model's.
        output "probs" is every probability, unbudgeted, so it takes none of the three."""
        if output == "probs" and (threshold is not None or k is not None or budget is not None):
            raise ValueError("output='probs' gives every probability, unbudgeted: k, threshold and budget choose the active questions of bits, packed, sparse")
        if budget is not None:
            if threshold is not None or k is not None:
                raise ValueError("give budget, or threshold / k, not both")
            if isinstance(budget, dict):  # Budget.to_dict()'s form, as config.json holds it
                return Budget.from_dict(budget)
            if not isinstance(budget, Budget):
                raise TypeError(f"budget must be a cqg_ray.mbqa.budget.Budget (or its dict), got {type(budget).__name__}")
            return budget
        if threshold is not None and k is not None:
            raise ValueError("give threshold (the tau rule) or k (top-k), not both")
        if threshold is not None:
            if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) or not 0 < threshold < 1:
                raise ValueError(f"threshold must be a number in (0, 1), got {threshold!r}")
            return Budget(rule="tau", tau=float(threshold), value=self.budget.value)
        if k is not None:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.m:
                raise ValueError(f"k must be an integer from 1 to m={self.m}, got {k!r}")
            if self.budget.rule == "top_k":
                return self.budget.with_(k=int(k))  # floor, values and ranking stay the model's
            return Budget(rule="top_k", k=int(k), floor=self.budget.tau, value=self.budget.value)
        return self.budget

    def apply(self, probs: np.ndarray, budget: Budget | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(active bool, values float32) of probabilities (n, m) under ``budget`` (default the model's): the one place
        that decides which questions a text answers yes."""
        return apply_budget(probs, self.budget if budget is None else budget, self.mean)

    def encode_embeddings(self, emb: np.ndarray, output: str = "bits", threshold: float | None = None, *, k: int | None = None,
                          budget: Budget | None = None, binary: bool | None = None, packed: bool | None = None):
        """Heads on precomputed encoder embeddings (n, d), the encoder's outputs; L2-normalised here where the model was
        trained on normalised ones (its ``normalize``), as ``encode`` does. `output` as in `encode`."""
        output = _output(output, binary, packed)
        b = self.budget_for(threshold, k, budget, output)
        emb = np.asarray(emb, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[1] != self.dims:
            raise ValueError(f"embeddings must be (n, {self.dims}), got shape {emb.shape}")
        if (bad := np.flatnonzero(~np.isfinite(emb).all(axis=1))).size:
            raise ValueError(f"embeddings hold NaN or infinity in {bad.size} rows (the first: row {bad[0]})")
        t = torch.from_numpy(emb)
        return join_parts(self._parts(unit_rows(t) if self.normalize else t, output, b), output, self.m)

    def encode(self, texts: Sequence[str], output: str = "bits", threshold: float | None = None, batch_size: int = 64,
               progress: bool | None = None, chunk_size: int = CHUNK_SIZE, *, k: int | None = None, budget: Budget | None = None,
               binary: bool | None = None, packed: bool | None = None):
        """Embed texts. output: "sparse" (a ``scipy.sparse.csr_array`` (n, m) float32 of the active questions' values),
        "bits" (n, m) uint8 0/1 active questions, "packed" (n, ceil(m/8)) uint8 (np.packbits of the bits) or "probs"
        (n, m) float32 probabilities sigma(C_i(Enc(t))), dense and unbudgeted.

        The active questions are the model's ``budget``; for one call, ``k`` asks for top-k, ``threshold`` for the tau
        rule, ``budget`` for any ``Budget``. Texts go through the encoder `chunk_size` at a time in length order (the
        encoder batches them by `batch_size`); their embeddings stay on the device, the heads and the budget run there
        too, and only the output leaves it (device memory bounded by a chunk, not by the number of texts).
        progress: texts encoded, a bar or a log line every 25 s (None = when > chunk_size texts).
        A blank text (`texts.blank`: empty, or only whitespace and invisible characters) answers no to every question:
        its row is zeros (probabilities too).
        binary / packed: the old flags (deprecated): binary=False is output="probs", packed=True is output="packed".
        """
        output = _output(output, binary, packed)
        b = self.budget_for(threshold, k, budget, output)
        texts = text_list(texts)
        if problem := next(filter(None, (unicode_error(t, f"texts[{i}]") for i, t in enumerate(texts))), None):  # a lone surrogate
            raise ValueError(problem)
        if batch_size < 1 or chunk_size < 1:
            raise ValueError(f"batch_size and chunk_size must be at least 1, got {batch_size} and {chunk_size}")
        enc = self.encoder
        show = len(texts) > chunk_size if progress is None else progress
        parts = []
        # the encoder's length order over the whole call: batches pad as little as in one encoder call, whatever chunk_size
        order = length_order(texts)
        with progress_view("encode", "text", len(texts), kind="texts") if show else contextlib.nullcontext():  # no thread per small call
            for i in range(0, len(texts), chunk_size):
                chunk = [texts[j] for j in order[i : i + chunk_size]]
                parts += self._parts(enc.encode_tensor(chunk, batch_size=batch_size, normalize=self.normalize), output, b)
                add_progress(texts=len(chunk))
        return zero_rows(join_parts(parts, output, self.m, order), np.flatnonzero([blank(t) for t in texts]), output)

    def encode_tokens(self, chunks, output: str = "bits", *, budget: Budget | None = None):
        """`encode` of texts tokenized beforehand (the CPU stage of `cqg-ray embed`): ``chunks`` as `chunk_plan` cuts
        them, each (rows, [(indices into rows, the encoder's inputs)]); the same result as `encode` of those texts."""
        b = self.budget_for(budget=budget)
        parts, order = [], []
        for rows, batches in chunks:
            parts += self._parts(self.encoder.encode_tokens(len(rows), batches, normalize=self.normalize, tensor=True), output, b)
            order.append(np.asarray(rows))
        return join_parts(parts, output, self.m, np.concatenate(order) if order else np.zeros(0, dtype=np.int64))

    def explain(self, text_a: str, text_b: str, threshold: float | None = None, *, k: int | None = None,
                budget: Budget | None = None) -> Explanation:
        """The questions both texts answer yes under the budget (cognitive load = their count), ranked, with both
        probabilities; those only one answers; and the cosine of the two budgeted vectors."""
        if not isinstance(text_a, str) or not isinstance(text_b, str):
            raise TypeError(f"explain takes two texts (str), got {type(text_a).__name__} and {type(text_b).__name__}")
        if blank(text_a) or blank(text_b):
            raise ValueError(f"{'text_a' if blank(text_a) else 'text_b'} is {BLANK}: there is nothing to explain")
        if problem := unicode_error(text_a, "text_a") or unicode_error(text_b, "text_b"):
            raise ValueError(problem)
        b = self.budget_for(threshold, k, budget)
        p = self.encode([text_a, text_b], output="probs", progress=False)
        return self.explanation(p[0], p[1], b)

    def explanation(self, p_a: np.ndarray, p_b: np.ndarray, budget: Budget | None = None) -> Explanation:
        """The explanation of two probability vectors (m,) under ``budget`` (default the model's)."""
        b = self.budget if budget is None else budget
        (ya, yb), (va, vb) = self.apply(np.stack([p_a, p_b]), b)
        return explanation(p_a, p_b, ya, yb, va, vb, self.question_records, b.name_for(self.m))

    def __repr__(self) -> str:
        return (f"InterpretableEmbedder(encoder={self.encoder_name!r}, d={self.dims}, m={self.m}, budget={self.budget.name!r}, "
                f"device={self.device!r}, backend={getattr(self._encoder, 'backend', self.backend)!r})")  # as resolved, once loaded




def chunk_plan(texts: list[str], batch_size: int, st_order: bool, chunk_size: int = CHUNK_SIZE) -> list:
    """`InterpretableEmbedder.encode`'s chunks of one call as (rows, mini-batches): `chunk_size` texts at a time in
    length order, each cut into mini-batches as `Encoder.encode` cuts it (indices into the chunk's rows)."""
    order = length_order(texts)
    return [(rows, batch_plan([texts[j] for j in rows], batch_size, st_order))
            for rows in (order[i : i + chunk_size] for i in range(0, len(texts), chunk_size))]


def _output(output: str | bool, binary: bool | None, packed: bool | None) -> str:
    """`output`, or what the deprecated flags binary / packed ask for (with a DeprecationWarning)."""
    if isinstance(output, bool):  # the old second positional argument was `binary`
        output, binary = "bits", output
    if (binary is not None or packed is not None) and output != "bits":
        raise ValueError(f"give output={output!r}, or the deprecated binary / packed flags, not both")
    if binary is not None or packed is not None:
        warnings.warn("encode(binary=..., packed=...) is deprecated; use output='bits' | 'packed' | 'probs'", DeprecationWarning, stacklevel=3)
        output = "packed" if packed else "bits" if binary in (None, True) else "probs"
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(OUTPUTS)}; got {output!r}")
    return output
