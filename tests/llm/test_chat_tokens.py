"""The Hugging Face tokenizer saved beside a bundled model's dequantised weights (``bundled.hf_folder``, what the torch
engines load) builds the same chat prompt tokens as llama.cpp on the GGUF (``ChatTokens``): what a backend that runs the
torch engines without llama.cpp would rest on (docs/pipeline.md, the set-up's next lever)."""

import pytest

from cqg_ray.llm.prompts import SINGLE_ANSWER_PREFIX, answer_messages, cqg_messages, judge_shot_messages, single_answer_messages

PROMPTS = [
    (answer_messages("The Eiffel Tower was completed in 1889.", ["Is it a building?", "Is a year named?"]), ""),
    (cqg_messages(["Whales use echolocation.", "Bats hunt at night, ünïcödé 数据 🎉."], ["Sharks smell blood."], 5), ""),
    (judge_shot_messages("A man plays the flute.", "Is an instrument mentioned?"), ""),
    (single_answer_messages("A cat sat on the mat.", "Is it about an animal?"), SINGLE_ANSWER_PREFIX),
]


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "smollm2-135m", "qwen2.5-coder-1.5b"])
def test_the_hf_tokenizer_beside_the_weights_gives_llama_cpps_chat_tokens(name):
    pytest.importorskip("llama_cpp")
    from transformers import AutoTokenizer

    from cqg_ray.config import LlamaCppConfig
    from cqg_ray.llm.engines.bundled import BundledModelError, cache_root, hf_folder, resolve_model
    from cqg_ray.llm.engines.llamacpp import ChatTokens

    if name == "qwen2.5-coder-1.5b" and not (cache_root(None) / "models" / f"{name}-hf" / "config.json").is_file():
        pytest.skip("the 1.5B's dequantised folder is not on this machine (3.4 GB, minutes to make; the reference build and "
                    "the torch writer make it): checked where it is")
    try:
        resolve_model(f"bundled:{name}")
    except BundledModelError as e:
        pytest.skip(str(e))
    ours = ChatTokens.vocab_only(LlamaCppConfig(model=f"bundled:{name}"))
    tok = AutoTokenizer.from_pretrained(str(hf_folder(f"bundled:{name}")))  # made once per machine (the torch engine tests, vLLM set-up)
    for messages, prefix in PROMPTS:
        hf = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        hf += tok.encode(prefix, add_special_tokens=False) if prefix else []
        assert ours(messages, prefix) == hf, messages[-1]["content"][:60]
