"""Zoo model sets (``posgeom zoo --model-set NAME``) and the numbers timm publishes for their models.

``pe-variants``: timm's positional-encoding variants trained by one recipe, side by side: the Naver RoPE-ViTs
(Heo et al. 2024, "Rotary Position Embedding for Vision Transformer": axial and mixed RoPE, each with and
without an absolute table, ViT-S/B/L), DeiT III with its absolute table (the same recipe's APE baseline),
EVA-02 (an absolute table and RoPE) and a DINOv3 backbone (RoPE; no ImageNet head: no top-1).

:data:`PUBLISHED` holds timm's own top-1 (%) of each model that has one on ImageNet-1k, ImageNet-R, ImageNet-A
and ImageNet-Sketch, copied from timm's ``results/results-imagenet.csv``, ``results-imagenet-r.csv``,
``results-imagenet-a.csv`` and ``results-sketch.csv`` (huggingface/pytorch-image-models, commit aa4b5850,
2026-08-08), so that the zoo's table puts them beside what it measures.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import SettingError

__all__ = ["MODEL_SETS", "PUBLISHED", "PUBLISHED_SETS", "PUBLISHED_SOURCE", "model_set", "published_top1"]

PUBLISHED_SOURCE = (
    "timm results/results-{imagenet,imagenet-r,imagenet-a,sketch}.csv, huggingface/pytorch-image-models "
    "commit aa4b5850 (2026-08-08)"
)
PUBLISHED_SETS = ("imagenet", "imagenet_r", "imagenet_a", "sketch")

_NAVER = [
    f"vit_{size}_patch16_rope{mixed}{ape}_224.naver_in1k"
    for size in ("small", "base", "large")
    for mixed in ("", "_mixed")
    for ape in ("", "_ape")
]
MODEL_SETS: dict[str, tuple[str, ...]] = {
    "pe-variants": (
        *_NAVER,
        "deit3_small_patch16_224.fb_in1k",
        "deit3_base_patch16_224.fb_in1k",
        "deit3_large_patch16_224.fb_in1k",
        "eva02_tiny_patch14_336.mim_in22k_ft_in1k",
        "eva02_small_patch14_336.mim_in22k_ft_in1k",
        "vit_small_patch16_dinov3.lvd1689m",
    ),
}

# model -> top-1 (%) on (ImageNet-1k, ImageNet-R, ImageNet-A, ImageNet-Sketch), from PUBLISHED_SOURCE
PUBLISHED: dict[str, tuple[float, float, float, float]] = {
    "vit_small_patch16_rope_224.naver_in1k": (81.222, 44.490, 25.000, 33.831),
    "vit_small_patch16_rope_ape_224.naver_in1k": (81.016, 44.163, 22.853, 33.520),
    "vit_small_patch16_rope_mixed_224.naver_in1k": (81.252, 44.347, 25.227, 34.088),
    "vit_small_patch16_rope_mixed_ape_224.naver_in1k": (80.974, 45.113, 24.573, 34.275),
    "vit_base_patch16_rope_224.naver_in1k": (83.714, 53.377, 38.480, 40.433),
    "vit_base_patch16_rope_ape_224.naver_in1k": (83.780, 53.390, 39.067, 40.097),
    "vit_base_patch16_rope_mixed_224.naver_in1k": (83.806, 54.380, 39.147, 41.414),
    "vit_base_patch16_rope_mixed_ape_224.naver_in1k": (83.898, 54.253, 39.467, 41.180),
    "vit_large_patch16_rope_224.naver_in1k": (84.646, 58.213, 47.107, 44.546),
    "vit_large_patch16_rope_ape_224.naver_in1k": (84.660, 57.820, 48.747, 44.638),
    "vit_large_patch16_rope_mixed_224.naver_in1k": (84.840, 58.283, 48.680, 44.953),
    "vit_large_patch16_rope_mixed_ape_224.naver_in1k": (84.846, 58.167, 48.107, 44.939),
    "deit3_small_patch16_224.fb_in1k": (81.382, 45.960, 26.013, 34.685),
    "deit3_base_patch16_224.fb_in1k": (83.800, 53.433, 38.920, 40.378),
    "deit3_large_patch16_224.fb_in1k": (84.772, 56.483, 48.573, 43.557),
    "eva02_tiny_patch14_336.mim_in22k_ft_in1k": (80.648, 40.767, 23.987, 28.525),
    "eva02_small_patch14_336.mim_in22k_ft_in1k": (85.770, 58.443, 51.067, 44.013),
}


def model_set(name: str) -> list[str]:
    """The models of the set ``name``; ValueError naming the sets for an unknown one."""
    if name not in MODEL_SETS:
        raise SettingError(f"unknown zoo model set {name!r}: choose among {', '.join(MODEL_SETS)}")
    return list(MODEL_SETS[name])


def published_top1(model: str) -> dict[str, float] | None:
    """timm's published top-1 (%) of ``model`` per set of :data:`PUBLISHED_SETS`, or None when timm publishes
    none (a name without its pretrained tag, a backbone without a head, a model not in the table)."""
    values: Sequence[float] | None = PUBLISHED.get(model)
    return None if values is None else dict(zip(PUBLISHED_SETS, values))
