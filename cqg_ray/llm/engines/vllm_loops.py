"""vLLM's loop stop: a V1 logits processor that ends a ``Request.stop_on_loop`` reply at the newline where it loops.

``vllm.sampling_params`` asks for it per request (``extra_args={"cqg_stop_on_loop": True}``) and
``processor_config_kwargs`` registers it in the engine (``logits_processors=[PROCESSOR]``). Where such a reply's last
token holds a newline and its text loops (``parse.loops``: two items in a row repeat earlier ones), the next token is
forced to the request's end-of-sequence token, so the reply ends there as on the embedded engines (its text ends
at that newline; the EOS counts as one more written token).

Importing this module needs no vllm: the processor class is built on first access (vLLM's loader looks it up by
name in the engine's processes), and the part that says which rows stop (`stopping_rows`) is plain Python.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from cqg_ray.llm.parse import loops

EXTRA_ARG = "cqg_stop_on_loop"
PROCESSOR = f"{__name__}:LoopStop"


def wants_stop(params: Any) -> bool:
    """Whether a request's ``SamplingParams`` ask for the loop stop (their ``extra_args``)."""
    return bool((getattr(params, "extra_args", None) or {}).get(EXTRA_ARG))


def stop_token(params: Any) -> int | None:
    """The token that ends a request: its EOS, else its lowest stop token id; None where it has none (``ignore_eos``)."""
    if getattr(params, "ignore_eos", False):
        return None
    eos = getattr(params, "eos_token_id", None)
    if eos is not None:
        return int(eos)
    stops = getattr(params, "all_stop_token_ids", None) or ()
    return min(stops) if stops else None


def newline_ids(decode: Callable[[list[int]], str], vocab_size: int) -> frozenset[int]:
    """Ids of the tokens whose text holds a newline (the only tokens after which a reply can begin to loop)."""
    return frozenset(i for i in range(vocab_size) if "\n" in decode([i]))


def stopping_rows(rows: Mapping[int, Sequence[int]], newlines: frozenset[int], detokenize: Callable[[list[int]], str]) -> list[int]:
    """Batch indices of the rows (index -> the reply's token ids so far) whose reply has just begun to loop: its last
    token holds a newline and its text loops (``parse.loops``). A reply's text is decoded only after such a token."""
    return [i for i, out in rows.items() if out and out[-1] in newlines and loops(detokenize(list(out)))]


def update_rows(rows: dict[int, Any], batch_update: Any, track: Callable[[Any, Any, list[int]], Any]) -> None:
    """``rows`` (batch index -> state) after a vLLM ``BatchUpdate``: added requests (``track(params, prompt ids,
    output ids)``, None: not tracked), removed ones, then moves and swaps, as vLLM's own ``process_dict_updates``."""
    if not batch_update:
        return
    for index, params, prompt, output in batch_update.added:
        state = track(params, prompt, output)
        if state is None:
            rows.pop(index, None)
        else:
            rows[index] = state
    for index in batch_update.removed:
        rows.pop(index, None)
    for a, b, direction in batch_update.moved:
        a_state, b_state = rows.pop(a, None), rows.pop(b, None)
        if a_state is not None:
            rows[b] = a_state
        if b_state is not None and getattr(direction, "name", "") == "SWAP":
            rows[a] = b_state


def _processor_class() -> type:
    """``LoopStop``: the logits processor (vLLM V1's ``LogitsProcessor``), built where vllm is installed."""
    import logging

    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class LoopStop(LogitsProcessor):
        """Forces EOS for the rows whose ``stop_on_loop`` reply has begun to loop (`stopping_rows`). The tokenizer and
        its newline tokens are loaded at the first such request (once per engine)."""

        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool):
            self.model_config = vllm_config.model_config
            self.rows: dict[int, tuple[list[int], int]] = {}  # batch index -> (live output token ids, stop token)
            self.tokenizer: Any = None
            self.newlines: frozenset[int] | None = None  # None: not loaded yet; empty: no tokenizer, nothing stops

        def is_argmax_invariant(self) -> bool:
            return False  # it changes the greedy pick

        def _load(self) -> frozenset[int]:
            if self.newlines is None:
                try:
                    from vllm.tokenizers import cached_tokenizer_from_config

                    self.tokenizer = cached_tokenizer_from_config(self.model_config)
                    self.newlines = frozenset() if self.tokenizer is None else newline_ids(self.tokenizer.decode, len(self.tokenizer))
                except Exception as e:  # a reply that loops then runs on, as before
                    logging.getLogger("cqg_ray").warning("vLLM loop stop off: no tokenizer (%s)", e)
                    self.newlines = frozenset()
            return self.newlines

        def _track(self, params: Any, _prompt: Any, output: list[int]) -> tuple[list[int], int] | None:
            eos = stop_token(params) if wants_stop(params) else None
            return (output, eos) if eos is not None and self._load() else None

        def update_state(self, batch_update: Any) -> None:
            update_rows(self.rows, batch_update, self._track)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            # here, not in update_state: with async scheduling the output lists hold the last token only from now on
            if not self.rows:
                return logits
            detokenize = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
            for i in stopping_rows({i: out for i, (out, _) in self.rows.items()}, self.newlines or frozenset(), detokenize):
                logits[i] = float("-inf")
                logits[i, self.rows[i][1]] = 0.0
            return logits

    LoopStop.__module__, LoopStop.__qualname__ = __name__, "LoopStop"  # pickled by name, as vLLM's loader finds it
    return LoopStop


def __getattr__(name: str) -> Any:
    if name == "LoopStop":
        cls = globals()["LoopStop"] = _processor_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
