"""Private internals of timm and accelerate that the package overrides or calls: fail loudly, here,
when one of them changes shape (pyproject.toml's upper bounds protect them; this test tells why).

Each entry: the object, its private attribute, and the parameters our code relies on.
"""

from __future__ import annotations

import inspect

import pytest
import timm
import torch
from accelerate.state import AcceleratorState, GradientState
from timm.layers import RotaryEmbedding, RotaryEmbeddingCat
from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3
from timm.models.eva import Eva

INTERNALS = [
    # pos/rope.py (ScaledRotaryEmbeddingCat overrides it) and interventions.pe_scale (axial RoPE)
    (RotaryEmbeddingCat, "_compute_bands", ["self", "device", "dtype"]),
    (RotaryEmbeddingCat, "_init_buffers", ["self"]),
    (RotaryEmbeddingCat, "_build_embed_cat", ["self", "feat_shape", "bands"]),
    (RotaryEmbedding, "_build_embed", ["self", "feat_shape", "bands"]),
    # interventions.pe_scale on DINOv3 RoPE
    (RotaryEmbeddingDinoV3, "_create_embed", ["self", "feat_shape", "no_aug"]),
    # models/vision_transformer_pe.py: PosGeomViT overrides Eva._pos_embed(x) -> (x, rope)
    (Eva, "_pos_embed", ["self", "x"]),
    # train: accelerate's process-wide singletons are reset after each train() call
    (AcceleratorState, "_reset_state", []),
    (GradientState, "_reset_state", []),
]


@pytest.mark.parametrize("owner,name,params", INTERNALS, ids=[f"{o.__name__}.{n}" for o, n, _ in INTERNALS])
def test_private_internal_has_the_shape_we_rely_on(owner, name, params):
    member = getattr(owner, name, None)
    assert member is not None, f"{owner.__module__}.{owner.__name__}.{name} is gone: update the code that uses it"
    found = list(inspect.signature(member).parameters)
    assert found[: len(params)] == params, f"{owner.__name__}.{name}{inspect.signature(member)} changed shape"


def test_rope_attributes_we_read():
    rope = RotaryEmbeddingCat(32, max_res=16, temperature=10000, in_pixels=False, feat_shape=[4, 4])
    assert isinstance(rope.bands, torch.Tensor) and list(rope.feat_shape) == [4, 4]
    assert isinstance(rope.pos_embed, torch.Tensor)  # the cached table pe_scale rebuilds
    rebuilt = rope._build_embed_cat(rope.feat_shape, rope.bands)
    torch.testing.assert_close(rebuilt, rope.pos_embed)
    model = timm.create_model("vit_small_patch16_dinov3", img_size=32, patch_size=8, depth=1, num_classes=0)
    assert isinstance(model.rope.periods, torch.Tensor)
