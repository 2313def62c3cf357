"""``pretrained=True``: timm's pretrained configs for the trained micro models, loaded through timm's own path
(``build_model_with_cfg`` -> ``load_pretrained`` -> ``checkpoint_filter_fn``), and timm's ViT weights in a
``PosGeomViT``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from timm_posgeom.app.hub import export_for_hub
from timm_posgeom.models.checkpoint import adapt_state_dict
from timm_posgeom.models.pretrained import IMAGENETTE_CLASSES, TRAINED_MICRO, hub_repo, pretrained_name, weights_sha1
from timm_posgeom.models.vision_transformer_pe import PRETRAINED, build_default_cfgs, checkpoint_filter_fn

ROOT = Path(__file__).resolve().parents[1]
SCALING = ROOT / "experiments" / "scaling"
RUNS = [
    (study, condition, seed)
    for study, (conditions, seeds) in TRAINED_MICRO.items()
    for condition in conditions
    for seed in range(seeds)
]
# what the registered micro name builds: a run trained with anything else cannot be one of its tags
MICRO_ARCH = dict(embed_dim=128, depth=4, num_heads=4, patch_size=8, img_size=[64, 64], layout="timm")
CFG_KEYS = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std", "num_classes", "label_names")


def _run_dir(study: str, condition: str, seed: int) -> Path:
    return SCALING / study / "runs" / f"{condition}_s{seed}"


def _reexported_sha1(model: torch.nn.Module, directory: Path) -> str:
    """The SHA-1 of ``model`` exported again by the project's export code (what a run records of its export)."""
    export_for_hub(model, directory)
    return weights_sha1(directory / "model.safetensors")


def test_list_pretrained_names_the_trained_micro_models():
    names = sorted(pretrained_name(*run) for run in RUNS)
    assert len(names) == 32 and sorted(timm.list_pretrained("posgeom*")) == names
    assert set(PRETRAINED) == set(names)
    cfg = timm.models.get_pretrained_cfg("posgeom_vit_micro_patch8_64_ape_rpt.imagenette_8x8_timm_s1")
    assert cfg.hf_hub_id == "timm-posgeom/posgeom-8x8-timm-rpt-s1" == hub_repo("8x8-timm", "rpt", 1)
    assert (cfg.num_classes, cfg.input_size, cfg.label_names) == (10, (3, 64, 64), IMAGENETTE_CLASSES)
    # a bare name stays untrained: no weights, timm's 1000 classes, so nothing that builds one changes
    for name in ("posgeom_vit_micro_patch8_64_ape", "posgeom_vit_small_patch16_224_ape"):
        assert not timm.is_model_pretrained(name) and timm.models.get_pretrained_cfg(name).num_classes == 1000
        with torch.device("meta"):
            assert timm.create_model(name).num_classes == 1000


def test_build_default_cfgs_checks_its_entries():
    from timm.models import generate_default_cfgs

    cfgs = generate_default_cfgs(
        build_default_cfgs({"posgeom_vit_small_patch16_224_ape.in100_paper_s0": "org/vit-s-ape"})
    )
    tagged = cfgs["posgeom_vit_small_patch16_224_ape"].cfgs["in100_paper_s0"]
    assert tagged.hf_hub_id == "org/vit-s-ape" and tagged.input_size == (3, 224, 224)
    assert cfgs["posgeom_vit_small_patch16_224_ape"].tags[0] == ""  # the untagged cfg stays the default
    for bad, match in (
        ({"vit_huge_patch14_224_ape.x": "org/x"}, "registered model"),
        ({"posgeom_vit_small_patch16_224_ape": "org/x"}, "registered model"),
        ({"posgeom_vit_small_patch16_224_ape.x": {"num_classes": 10}}, "no hf_hub_id"),
    ):
        with pytest.raises(ValueError, match=match):
            build_default_cfgs(bad)


@pytest.mark.skipif(not SCALING.is_dir(), reason="the repository's experiments/ (not in the sdist)")
def test_pretrained_names_are_exactly_the_committed_micro_runs():
    """Every committed run trained at the registered micro architecture has a name, and no name lacks a run; each
    name's config says what the run's export config says (classes, their names, preprocessing)."""
    micro = set()
    for config_path in sorted(SCALING.glob("*/runs/*/export/config.json")):
        config = json.loads(config_path.read_text())
        args = dict(dict(layout="timm"), **config["model_args"])
        if all(args.get(k) == v for k, v in MICRO_ARCH.items()):
            run = config_path.parent.parent
            study, (condition, _, seed) = run.parent.parent.name, run.name.rpartition("_s")
            micro.add((study, condition, int(seed)))
            cfg = timm.models.get_pretrained_cfg(pretrained_name(study, condition, int(seed))).to_dict()
            assert cfg["architecture"] == config["architecture"], run
            recorded = config["pretrained_cfg"]
            assert {k: list(cfg[k]) if isinstance(cfg[k], tuple) else cfg[k] for k in CFG_KEYS} == {
                k: recorded[k] for k in CFG_KEYS
            }, run
    assert micro == set(RUNS)


def test_pretrained_true_loads_a_local_file_with_the_recorded_sha1(tmp_path):
    """The offline form of the Hub path: ``pretrained_cfg_overlay=dict(file=...)`` instead of the ``hf_hub_id``.
    The file is an export made here by the project's export code, its SHA-1 taken as a run records it."""
    name = pretrained_name("8x8-paper", "sincos", 1)
    torch.manual_seed(1)
    trained = timm.create_model(name.split(".")[0], num_classes=10)  # stands in for a trained run: never trained
    export = tmp_path / "run" / "export"
    export_for_hub(trained, export)
    recorded = weights_sha1(export / "model.safetensors")  # what summary.json's export_sha1 holds
    torch.manual_seed(2)
    assert _reexported_sha1(timm.create_model(name, pretrained=False), tmp_path / "fresh") != recorded
    model = timm.create_model(
        name, pretrained=True, pretrained_cfg_overlay=dict(file=str(export / "model.safetensors"))
    )
    assert _reexported_sha1(model, tmp_path / "loaded") == recorded
    assert model.num_classes == 10 and model.pretrained_cfg["hf_hub_id"] == hub_repo("8x8-paper", "sincos", 1)
    assert tuple(model.pretrained_cfg["label_names"]) == IMAGENETTE_CLASSES


def hub_cache(root: Path, repo_id: str, weights: Path) -> Path:
    """A Hugging Face Hub cache under ``root`` that holds ``weights`` as ``repo_id``'s ``model.safetensors``, as a
    download leaves it (``refs/main`` naming a snapshot): with ``HF_HUB_OFFLINE=1`` a download reads it."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    (repo / "snapshots" / revision).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(weights, repo / "snapshots" / revision / "model.safetensors")
    return root


@pytest.mark.slow
def test_pretrained_true_downloads_from_the_hub_id_in_its_config(tmp_path):
    """The whole path without an overlay: timm resolves the name's ``hf_hub_id`` and reads the Hub (here a Hub
    cache, offline, holding an export made here under that repository's name)."""
    name = pretrained_name("8x8-timm", "rope", 0)
    torch.manual_seed(3)
    export_for_hub(timm.create_model(name.split(".")[0], num_classes=10), tmp_path / "export")
    recorded = weights_sha1(tmp_path / "export" / "model.safetensors")
    cache = hub_cache(tmp_path / "hub", hub_repo("8x8-timm", "rope", 0), tmp_path / "export" / "model.safetensors")
    script = (
        "import sys, timm, timm_posgeom\n"
        "from timm_posgeom.app.hub import export_for_hub\n"
        "from timm_posgeom.models.pretrained import weights_sha1\n"
        f"model = timm.create_model({name!r}, pretrained=True)\n"
        "export_for_hub(model, sys.argv[1])\n"
        "print(weights_sha1(sys.argv[1] + '/model.safetensors'))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "again")], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == recorded


# --- timm's ViT weights ------------------------------------------------------------------------------------------


def _perturbed_vit(name: str, **kwargs) -> torch.nn.Module:
    """timm's ViT (``pretrained=False``) with every parameter moved off its init: timm's init zeroes the biases,
    which would hide a wrong split of the qkv bias (the key bias among them) or a LayerNorm left unloaded."""
    torch.manual_seed(0)
    vit = timm.create_model(name, pretrained=False, **kwargs).eval()
    with torch.no_grad():
        for p in vit.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return vit


@pytest.mark.parametrize(
    "size", ["tiny", pytest.param("small", marks=pytest.mark.slow), pytest.param("base", marks=pytest.mark.slow)]
)
def test_timm_vit_weights_load_into_the_ape_model_with_the_same_logits(size, tmp_path):
    vit = _perturbed_vit(f"vit_{size}_patch16_224")
    state = vit.state_dict()
    name = f"posgeom_vit_{size}_patch16_224_ape"
    with torch.device("meta"):  # the names and shapes alone
        shell = timm.create_model(name)
    ours = {k: v.shape for k, v in shell.state_dict().items()}
    assert (len(set(ours) - set(state)), len(set(state) - set(ours))) == (24, 12)  # q_bias/v_bias against qkv.bias
    assert {k: v.shape for k, v in checkpoint_filter_fn(state, shell).items()} == ours  # none missing or unexpected
    # timm's pretrained path: a file in the overlay, the filter, a strict load; then the same logits
    save_file(state, str(tmp_path / "vit.safetensors"))
    model = timm.create_model(
        name, pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "vit.safetensors"))
    )
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = vit(x)
        assert expected.abs().max() > 1  # logits that could differ
        torch.testing.assert_close(model.eval()(x), expected, rtol=0, atol=2e-5)


MICRO_VIT = dict(img_size=64, patch_size=8, embed_dim=128, depth=4, num_heads=4, num_classes=10)


@pytest.mark.parametrize("pe", ["ape", "sincos", "rope"])
def test_a_nonzero_key_bias_is_dropped_only_where_the_softmax_cancels_it(pe):
    vit = _perturbed_vit("vit_tiny_patch16_224", **MICRO_VIT)
    state = {k: v for k, v in vit.state_dict().items() if pe == "ape" or k != "pos_embed"}
    model = timm.create_model(f"posgeom_vit_micro_patch8_64_{pe}", num_classes=10).eval()
    if pe == "rope":  # the keys are rotated after the bias: q.R(k + b) is not one constant per softmax row
        with pytest.raises(ValueError, match="key bias cannot be dropped.*rotated"):
            adapt_state_dict(state, model)
        for key in [k for k in state if k.endswith("qkv.bias")]:
            state[key] = state[key].clone()
            state[key][128:256] = 0  # no key bias: nothing to drop
    model.load_state_dict(adapt_state_dict(state, model))
    if pe == "ape":  # and through timm's path with the state dict itself in the overlay (and its 10 classes:
        # timm drops a head whose class count differs from the configuration's)
        via_timm = timm.create_model(
            "posgeom_vit_micro_patch8_64_ape",
            num_classes=10,
            pretrained=True,
            pretrained_cfg_overlay=dict(state_dict=state, num_classes=10),
        ).eval()
        with torch.no_grad():
            x = torch.randn(2, 3, 64, 64)
            torch.testing.assert_close(model(x), vit(x), rtol=0, atol=2e-5)
            torch.testing.assert_close(via_timm(x), vit(x), rtol=0, atol=2e-5)


def test_layer_scale_and_a_new_grid():
    """timm's layer-scale names (ls1.gamma) and a position table of another grid (resampled, as timm's filters do)."""
    vit = _perturbed_vit("vit_tiny_patch16_224", **dict(MICRO_VIT, init_values=0.1))
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10, init_values=0.1).eval()
    model.load_state_dict(checkpoint_filter_fn(vit.state_dict(), model))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), vit(x), rtol=0, atol=2e-5)
    larger = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10, img_size=96, init_values=0.1)
    adapted = checkpoint_filter_fn(vit.state_dict(), larger)
    assert adapted["pos_embed"].shape == (1, 1 + 12 * 12, 128)
    larger.load_state_dict(adapted)
