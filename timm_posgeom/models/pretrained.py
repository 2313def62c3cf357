"""The trained weights behind ``pretrained=True``: timm pretrained configs for the trained micro models.

The trained micro models are the finished runs of the repository's scaling studies
(``experiments/scaling/<study>/runs/<condition>_s<seed>/export``): Imagenette (10 classes) at 64 px, 8 x 8
patches of 8 px, width 128, depth 4, 4 heads, the registered ``posgeom_vit_micro_patch8_64_*``
architecture. Each is one Hugging Face Hub repository, named as ``experiments/README.md`` pushes it
(``posgeom push RUN --repo-id <HUB_ORG>/posgeom-<study>-<condition>-s<seed>``), and one timm name,
``posgeom_vit_micro_patch8_64_<variant>.imagenette_<study>_s<seed>`` (the study's hyphens as underscores),
whose config carries that ``hf_hub_id``, the 10 classes and the run's preprocessing::

    timm.create_model("posgeom_vit_micro_patch8_64_ape.imagenette_8x8_paper_s0", pretrained=True)

Only runs that the registered name builds unchanged are listed. The 14 x 14 studies (112 px, width 64) and the
other widths (64, 192, 256, 384) need other constructor arguments than their name gives, which a timm tag
cannot carry: they load as ``hf-hub:<HUB_ORG>/posgeom-<study>-<condition>-s<seed>`` (their ``config.json``
holds the arguments). The bare names stay untrained (1000 classes, timm's random init): a tag names the weights.

Where ``pretrained=True`` finds them: the Hugging Face Hub cache first (``HF_HUB_CACHE``, ``HF_HOME``), without
asking the network, where a download or ``posgeom weights restore`` (from a clone of the repository: its git
history holds every committed export) leaves them; else the Hub. Without either, one line says how to get them.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import PosgeomError

__all__ = [
    "HUB_ORG",
    "IMAGENETTE_CLASSES",
    "IMAGENETTE_WNIDS",
    "TRAINED_MICRO",
    "hub_repo",
    "pretrained_name",
    "micro_pretrained_cfgs",
    "WEIGHTS_FILE",
    "WeightsNotFoundError",
    "cached_hub_file",
    "hub_weights_file",
    "weights_sha1",
]

WEIGHTS_FILE = "model.safetensors"  # what an export and a Hub repository of one hold, beside config.json


class WeightsNotFoundError(PosgeomError, FileNotFoundError):
    """Trained weights that are neither in the Hugging Face Hub cache nor downloadable now (one line: which, and
    how to get them)."""


# The Hub organisation the exports are published under (experiments/README.md's ORG).
HUB_ORG = "timm-posgeom"

# Imagenette's classes in label order, as the exports' config.json record them (``label_names``): by name (the
# Hub's parquet copy) or by WordNet id (the ImageFolder copy the GPU study read).
IMAGENETTE_CLASSES = (
    "tench",
    "English springer",
    "cassette player",
    "chain saw",
    "church",
    "French horn",
    "garbage truck",
    "gas pump",
    "golf ball",
    "parachute",
)
IMAGENETTE_WNIDS = (
    "n01440764",
    "n02102040",
    "n02979186",
    "n03000684",
    "n03028079",
    "n03394916",
    "n03417042",
    "n03425413",
    "n03445777",
    "n03888605",
)

# study -> (conditions, number of seeds): every finished run of the studies trained at the registered micro
# architecture (width 128, 4 heads, 64 px), with the initialisation the study's name says.
TRAINED_MICRO: dict[str, tuple[tuple[str, ...], int]] = {
    "8x8-paper": (("nope", "ape", "sincos", "rope", "rpt"), 4),
    "8x8-timm": (("nope", "ape", "sincos", "rope", "rpt"), 2),
    "8x8-w128-paper-gpu": (("nope", "ape"), 1),
}

_VARIANTS = {"nope": "nope", "ape": "ape", "sincos": "sincos", "rope": "rope", "rpt": "ape_rpt"}  # condition -> name
_TRAINING = {
    "8x8-paper": "the paper's initialisation",
    "8x8-timm": "timm's initialisation",
    "8x8-w128-paper-gpu": "the paper's initialisation, on a GPU from an ImageFolder copy",
}
_LABELS = {"8x8-w128-paper-gpu": IMAGENETTE_WNIDS}  # the others: IMAGENETTE_CLASSES


def hub_repo(study: str, condition: str, seed: int) -> str:
    """The Hub repository of a run, e.g. ``timm-posgeom/posgeom-8x8-paper-ape-s0``."""
    return f"{HUB_ORG}/posgeom-{study}-{condition}-s{seed}"


def pretrained_name(study: str, condition: str, seed: int) -> str:
    """timm's ``<model>.<tag>`` name of a run, e.g. ``posgeom_vit_micro_patch8_64_ape.imagenette_8x8_paper_s0``."""
    return f"posgeom_vit_micro_patch8_64_{_VARIANTS[condition]}.imagenette_{study.replace('-', '_')}_s{seed}"


def micro_pretrained_cfgs() -> dict[str, dict[str, Any]]:
    """``{"<model>.<tag>": cfg}`` for every run of :data:`TRAINED_MICRO`: its ``hf_hub_id`` and what its
    config differs in from the model's base config (10 classes and the names the run recorded, its squash resize)."""
    cfgs: dict[str, dict[str, Any]] = {}
    for study, (conditions, seeds) in TRAINED_MICRO.items():
        for condition in conditions:
            for seed in range(seeds):
                cfgs[pretrained_name(study, condition, seed)] = dict(
                    hf_hub_id=hub_repo(study, condition, seed),
                    num_classes=len(IMAGENETTE_CLASSES),
                    label_names=_LABELS.get(study, IMAGENETTE_CLASSES),
                    crop_mode="squash",
                    description=f"Imagenette at 64 px, {_TRAINING[study]}, seed {seed} "
                    f"(study {study}, run {condition}_s{seed})",
                    paper_ids="arXiv:2606.00124",
                )
    return cfgs


def weights_sha1(path: str | os.PathLike) -> str:
    """SHA-1 of a weights file (``model.safetensors``): which weights a measurement was made on (the records'
    ``weights_sha1``, ``export_sha1``)."""
    import hashlib

    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cached_hub_file(
    repo_id: str, filename: str = WEIGHTS_FILE, cache_dir: str | os.PathLike | None = None
) -> str | None:
    """The path of ``filename`` of the Hub repository ``repo_id`` (its ``main`` revision) in the Hugging Face Hub
    cache (``cache_dir``, else ``HF_HUB_CACHE`` / ``HF_HOME``), or None; never asks the network."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename, cache_dir=None if cache_dir is None else str(cache_dir))
    return found if isinstance(found, str) and os.path.isfile(found) else None


def hub_weights_file(name: str, repo_id: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The weights file behind the pretrained name ``name`` (``<model>.<tag>``), published as ``repo_id``: from
    the Hub cache when it is there (no network asked: a restored or downloaded copy loads offline with no
    setting), else downloaded from the Hub into that cache. :class:`WeightsNotFoundError` in one line when neither
    has it, saying how to get it."""
    found = cached_hub_file(repo_id, cache_dir=cache_dir)
    if found is not None:
        return found
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled  # 0.23: no .errors

    try:
        return hf_hub_download(repo_id, WEIGHTS_FILE, cache_dir=None if cache_dir is None else str(cache_dir))
    except (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled, OSError) as e:
        raise WeightsNotFoundError(
            f"the weights of {name} ({repo_id}) are not in the Hugging Face Hub cache and the Hub did not give them "
            f"({type(e).__name__}): from a clone of timm-posgeom, `posgeom weights restore {name}` puts them in the "
            "cache (docs/guide.md, 'Trained weights')"
        ) from None
