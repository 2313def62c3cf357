"""``init="paper"``: the initialisation of the paper's code (PyTorch's defaults), and ``init="timm"`` unchanged.

The paper's code (github.com/mahmoud-mannes/vit-encoding-paper, ``code/src/main/model.py``) sets no
initialisation of its own; every tensor gets PyTorch's default:

    self.conv = nn.Conv2d(in_channels=config.C, out_channels=config.D, kernel_size=config.patch_size, ...)
    self.cls_token = nn.Parameter(torch.randn(1, 1, config.D))
    self.pos_embedding = nn.Embedding(config.num_patches + 1, config.D)      # every condition, class row included
    self.qkv = nn.Linear(config.D, 3 * config.D)                             # fused, with bias
    self.proj = nn.Linear(config.D, config.D)
    nn.Sequential(nn.Linear(config.D, 4*config.D), nn.GELU(), self.dropout_MLP, nn.Linear(4*config.D, config.D))
    self.final_feed_forward = nn.Linear(config.D, config.num_classes)

(``nn.LayerNorm`` everywhere else; the sincos table and RoPE are computed, nothing learned.)
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace

import pytest
import timm
import torch
import torch.nn as nn
from timm.models.eva import Eva

from timm_posgeom import PosGeomViT
from timm_posgeom.app import study as study_mod
from timm_posgeom.app.hub import export_for_hub, render_card
from timm_posgeom.app.recipe import load_recipe
from timm_posgeom.app.study import StudyError, dry_run, preset_config, run_study, write_plan
from timm_posgeom.cli import main as cli_main

VARIANTS = ("nope", "ape", "sincos", "rope", "ape_rpt")
PE = {"nope": "none", "ape": "ape", "sincos": "sincos", "rope": "rope", "ape_rpt": "ape"}
SIGMAS = 5.0  # every statistical bound below: 5 standard errors for the number of elements tested

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a shared CPU


def _micro(variant: str, seed: int = 0, **kwargs) -> PosGeomViT:
    torch.manual_seed(seed)
    return timm.create_model(f"posgeom_vit_micro_patch8_64_{variant}", num_classes=10, **kwargs)


@functools.cache
def _built(variant: str, init: str) -> PosGeomViT:
    """A micro model built after ``torch.manual_seed(0)``, shared by the tests that only read it."""
    return _micro(variant, init=init).eval()


@functools.cache
def _eva(ape: bool) -> Eva:
    torch.manual_seed(0)
    return Eva(
        img_size=64,
        patch_size=8,
        embed_dim=128,
        depth=4,
        num_heads=4,
        num_classes=10,
        global_pool="token",
        use_abs_pos_emb=ape,
        use_rot_pos_emb=False,
    ).eval()


def _equal_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _assert_standard_normal(t: torch.Tensor, what: str) -> None:
    n = t.numel()
    mean, std = t.double().mean().item(), t.double().std().item()
    assert abs(mean) < SIGMAS / math.sqrt(n), f"{what}: mean {mean} (n={n})"
    assert abs(std - 1.0) < SIGMAS / math.sqrt(2 * n), f"{what}: std {std} (n={n})"


def _assert_uniform(t: torch.Tensor, bound: float, what: str) -> None:
    """Inside [-bound, bound] and uniform: mean 0, variance bound^2/3, half of the mass inside bound/2."""
    x = t.detach().double().flatten()
    n = x.numel()
    assert x.abs().max().item() <= bound * (1 + 1e-6), f"{what}: outside +-{bound}"
    if n < 64:  # a head bias of 10 classes: only the bound and "not all zero"
        assert x.abs().max().item() > 0, what
        return
    assert abs(x.mean().item()) < SIGMAS * bound / math.sqrt(3 * n), f"{what}: mean {x.mean().item()}"
    var = x.pow(2).mean().item()
    assert abs(var / (bound**2 / 3) - 1) < SIGMAS * math.sqrt(0.8 / n), (
        f"{what}: std {math.sqrt(var)} vs {bound / math.sqrt(3)}"
    )
    inner = (x.abs() < bound / 2).double().mean().item()  # 0.5 for a uniform; 0.69 for a normal of that std
    assert abs(inner - 0.5) < SIGMAS * 0.5 / math.sqrt(n), f"{what}: not uniform ({inner:.3f} inside bound/2)"


def _fan_in(weight: torch.Tensor) -> int:
    return weight.shape[1] * (weight[0][0].numel() if weight.dim() > 2 else 1)


# --------------------------------------------------------------------------------------------
# the argument
# --------------------------------------------------------------------------------------------
def test_bad_init_value_raises_naming_the_allowed_values():
    with pytest.raises(ValueError, match="unknown init 'xavier'; expected one of timm, paper"):
        timm.create_model("posgeom_vit_micro_patch8_64_ape", init="xavier")
    with pytest.raises(ValueError, match="timm, paper"):
        PosGeomViT(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, init="Paper")


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_accepts_paper_init_with_the_same_weights_count(variant):
    timm_model, paper = _built(variant, "timm"), _built(variant, "paper")
    assert paper.init == "paper" and timm_model.init == "timm" and "init='paper'" in repr(paper)
    assert "init=" not in repr(timm_model)
    assert {k: v.shape for k, v in paper.state_dict().items()} == {
        k: v.shape for k, v in timm_model.state_dict().items()
    }
    assert (
        (paper.pe, paper.token_shuffle)
        == (timm_model.pe, timm_model.token_shuffle)
        == (PE[variant], "train" if variant == "ape_rpt" else "none")
    )


def test_paper_init_on_a_vit_small_and_on_the_meta_device():
    with torch.device("meta"):  # what the trainer does to read the data config: no memory, no RNG rewind
        m = timm.create_model("posgeom_vit_small_patch16_224_rope", num_heads=8, init="paper")
    assert m.init == "paper" and m.embed_dim == 384


# --------------------------------------------------------------------------------------------
# init="timm": unchanged
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_default_init_is_timms_bit_for_bit(variant):
    """The default is init='timm', and that is exactly timm's Eva init for the seed (nothing added, no RNG used)."""
    default = _micro(variant)
    assert default.init == "timm" and _equal_state(default, _built(variant, "timm"))
    assert _equal_state(default, _eva(PE[variant] == "ape"))


def test_timm_init_statistics():
    m = _built("ape", "timm")
    assert abs(m.pos_embed.std().item() - 0.02) < 0.002 and m.pos_embed.abs().max().item() < 0.1
    assert m.cls_token.abs().max().item() < 0.1
    assert abs(m.blocks[0].mlp.fc1.weight.std().item() - 0.02) < 0.002
    assert m.blocks[0].attn.q_bias.abs().max().item() == 0 and m.blocks[0].mlp.fc1.bias.abs().max().item() == 0
    assert m.head.weight.abs().max().item() < 1e-3  # timm's head_init_scale 0.001


# --------------------------------------------------------------------------------------------
# init="paper": the paper's definitions
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_paper_init_statistics(variant):
    m = _built(variant, "paper")
    _assert_standard_normal(m.cls_token, "cls_token")
    assert m.cls_token.shape == (1, 1, 128)
    if PE[variant] == "ape":
        assert m.pos_embed.shape == (1, 65, 128)  # 8x8 patches + the class-token row, as nn.Embedding(N + 1, D)
        _assert_standard_normal(m.pos_embed, "pos_embed")
        for i, row in enumerate(m.pos_embed[0]):
            _assert_standard_normal(row, f"pos_embed row {i}")
    else:
        assert m.pos_embed is None
    layers = [(name, mod) for name, mod in m.named_modules() if isinstance(mod, (nn.Linear, nn.Conv2d))]
    assert len(layers) == 1 + 4 * 4 + 1  # patch conv, (qkv, proj, fc1, fc2) x depth, head
    for name, mod in layers:
        bound = 1 / math.sqrt(_fan_in(mod.weight))
        _assert_uniform(mod.weight, bound, f"{name}.weight")  # no depth rescale of proj/fc2, no head scale
        if mod.bias is not None:
            _assert_uniform(mod.bias, bound, f"{name}.bias")
    norms = [mod for mod in m.modules() if isinstance(mod, nn.LayerNorm)]
    assert len(norms) == 2 * 4 + 1
    for mod in norms:
        assert torch.equal(mod.weight, torch.ones_like(mod.weight)) and torch.equal(
            mod.bias, torch.zeros_like(mod.bias)
        )


def test_paper_init_sets_the_q_and_v_biases_that_live_outside_the_qkv_linear():
    """Eva's fused qkv Linear has no bias; q and v biases are separate parameters and the k bias a fixed
    zero buffer. The paper's ``nn.Linear(D, 3 * D)`` has a bias U(+-1/sqrt(D)): resetting the Linear
    modules alone would leave q and v biases at zero. (A key bias adds q.b to every logit of a query,
    which the softmax cancels: Eva's zero k bias is equivalent.)"""
    m = _micro("ape", init="paper")  # its own: k_bias is changed below
    bound = 1 / math.sqrt(128)
    for i, blk in enumerate(m.blocks):
        assert blk.attn.qkv.bias is None
        _assert_uniform(blk.attn.q_bias, bound, f"blocks.{i}.attn.q_bias")
        _assert_uniform(blk.attn.v_bias, bound, f"blocks.{i}.attn.v_bias")
        assert blk.attn.k_bias.abs().max().item() == 0
    torch.manual_seed(3)
    x = torch.randn(2, 3, 64, 64)
    m.eval()
    ref = m(x)
    m.blocks[0].attn.k_bias.uniform_(-bound, bound)  # a key bias changes no output
    torch.testing.assert_close(m(x), ref, rtol=1e-5, atol=1e-5)


def test_paper_init_is_deterministic_per_seed():
    assert _equal_state(_micro("ape", seed=0, init="paper"), _built("ape", "paper"))
    assert not torch.equal(_micro("ape", seed=1, init="paper").pos_embed, _built("ape", "paper").pos_embed)


def test_paper_init_survives_timms_init_path():
    """timm's own init (Eva.init_weights, e.g. after to_empty()) re-initialises with the model's init."""
    m = _micro("ape", init="paper")
    m.init_weights()
    _assert_standard_normal(m.pos_embed, "pos_embed after init_weights()")
    _assert_uniform(m.head.weight, 1 / math.sqrt(128), "head.weight after init_weights()")
    t = _micro("ape")
    t.init_weights()
    assert t.pos_embed.std().item() < 0.03


# --- the paper's own constructor, module for module (code/src/main/model.py) -------------------
class _PaperViT(nn.Module):
    """The parameters of the paper's ``VisionTransformer(config, condition)``, created in its order
    (its forward and dropouts create no parameter and draw nothing at construction)."""

    def __init__(self, D=128, n_heads=4, layers=4, patch=8, size=64, C=3, num_classes=10):
        super().__init__()
        num_patches = (size // patch) ** 2
        self.conv = nn.Conv2d(in_channels=C, out_channels=D, kernel_size=patch, stride=patch, padding_mode="zeros")
        self.cls_token = nn.Parameter(torch.randn(1, 1, D))
        self.pos_embedding = nn.Embedding(num_patches + 1, D)  # created in every condition
        self.attn = nn.ModuleList(
            [nn.ModuleList([nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.Linear(D, D)]) for _ in range(layers)]
        )
        self.mlp = nn.ModuleList(
            [nn.ModuleList([nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)]) for _ in range(layers)]
        )
        self.final_feed_forward = nn.Linear(D, num_classes)


@pytest.mark.parametrize("variant", VARIANTS)
def test_paper_init_reproduces_the_papers_initial_weights(variant):
    """Built on the CPU after the same seed, our paper-init model holds the paper's initial weights exactly
    (every condition: the paper also draws its APE table when it does not use it)."""
    torch.manual_seed(0)
    paper = _PaperViT()
    if variant in ("ape", "nope"):  # the same draws, no more, no fewer: the generator ends where the paper's does
        after_paper = torch.random.get_rng_state()
        _micro(variant, seed=0, init="paper")
        assert torch.equal(torch.random.get_rng_state(), after_paper)
    ours = _built(variant, "paper")
    D = 128
    assert torch.equal(ours.patch_embed.proj.weight, paper.conv.weight)
    assert torch.equal(ours.patch_embed.proj.bias, paper.conv.bias)
    assert torch.equal(ours.cls_token, paper.cls_token)
    if ours.pos_embed is not None:
        assert torch.equal(ours.pos_embed[0], paper.pos_embedding.weight)
    for blk, (_, qkv, proj), (_, fc1, fc2) in zip(ours.blocks, paper.attn, paper.mlp):
        assert torch.equal(blk.attn.qkv.weight, qkv.weight)
        assert torch.equal(blk.attn.q_bias, qkv.bias[:D]) and torch.equal(blk.attn.v_bias, qkv.bias[2 * D :])
        for a, b in ((blk.attn.proj, proj), (blk.mlp.fc1, fc1), (blk.mlp.fc2, fc2)):
            assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert torch.equal(ours.head.weight, paper.final_feed_forward.weight)
    assert torch.equal(ours.head.bias, paper.final_feed_forward.bias)


# --------------------------------------------------------------------------------------------
# export: the config says which init a run began with
# --------------------------------------------------------------------------------------------
def test_export_records_init_and_local_dir_rebuilds_it(tmp_path):
    from timm_posgeom.models.factory import create_model

    m = _built("ape", "paper")
    export_for_hub(m, tmp_path / "run" / "export")
    config = json.loads((tmp_path / "run" / "export" / "config.json").read_text())
    assert config["model_args"]["init"] == "paper"
    loaded = create_model(f"local-dir:{tmp_path / 'run' / 'export'}").eval()
    assert loaded.init == "paper" and _equal_state(loaded, m)
    card = render_card(tmp_path / "run")
    assert "init-paper" in card and "Initialised as in the paper's code" in card
    # a timm-init export, and one written before `init` existed (no model_args.init): timm, no paper text
    export_for_hub(_built("ape", "timm"), tmp_path / "old" / "export")
    path = tmp_path / "old" / "export" / "config.json"
    config = json.loads(path.read_text())
    assert config["model_args"]["init"] == "timm"
    assert "paper's code" not in render_card(tmp_path / "old")
    del config["model_args"]["init"]
    path.write_text(json.dumps(config))
    assert (
        "paper's code" not in render_card(tmp_path / "old") and create_model(f"local-dir:{path.parent}").init == "timm"
    )


# --------------------------------------------------------------------------------------------
# recipes and the study
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("condition", study_mod.CONDITIONS)
def test_in100_paper_recipes_use_the_paper_init(condition):
    recipe = load_recipe(f"in100_paper_{condition}")
    assert recipe.model_kwargs["init"] == "paper"
    with torch.device("meta"):
        model = timm.create_model(recipe.model, num_classes=100, img_size=recipe.img_size, **recipe.model_kwargs)
    assert model.init == "paper"


def test_study_init_option_in_the_dry_run(tmp_path, capsys):
    assert {p["init"] for p in dry_run(preset_config("in100"), tmp_path)} == {"paper"}  # the recipes say so
    data = str(tmp_path)  # any existing folder: the dry run checks the path, not its contents
    assert {p["init"] for p in dry_run(preset_config("imagenette-cpu", data=data), tmp_path)} == {"timm"}
    plan = dry_run(preset_config("imagenette-cpu", data=data, init="paper"), tmp_path)
    assert {p["init"] for p in plan} == {"paper"} and all("--set model_kwargs.init=paper" in p["command"] for p in plan)
    # the demo preset trains with the paper's init (a model learns its layout classes in its 300 steps only so)
    assert {p["init"] for p in dry_run(preset_config("demo"), tmp_path)} == {"paper"}
    assert {p["init"] for p in dry_run(preset_config("demo", init="timm"), tmp_path)} == {"timm"}
    # --init wins over a --set of the same kwarg, and overrides what a recipe says
    config = preset_config("in100", init="timm")
    config.train_overrides = ["model_kwargs.init=paper"]
    assert {p["init"] for p in dry_run(config, tmp_path)} == {"timm"}
    assert cli_main(["study", "--preset", "in100", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("paper init") == 5 and "every recipe valid" in out
    assert (
        cli_main(
            [
                "study",
                "--preset",
                "demo",
                "--dry-run",
                "--init",
                "paper",
                "--conditions",
                "nope,ape",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("paper init") == 2 and out.count("--set model_kwargs.init=paper") == 2
    with pytest.raises(ValueError, match="unknown init 'xavier'"):
        preset_config("demo", init="xavier")
    config = preset_config("imagenette-cpu", data=data)  # (the demo's own init would win over the recipe's)
    config.train_overrides = ["model_kwargs.init=xavier"]
    with pytest.raises(ValueError, match="unknown init 'xavier'"):
        dry_run(config, tmp_path)
    with pytest.raises(SystemExit):
        cli_main(["study", "--dry-run", "--init", "xavier", "--out", str(tmp_path)])


class _PastTheCheck(Exception):
    pass


def test_study_resume_with_another_init_is_refused(tmp_path, monkeypatch, capsys):
    out = tmp_path / "study"
    out.mkdir()
    paper = preset_config("demo", init="paper", conditions=("nope", "ape"))
    write_plan(paper, out)  # what run_study records before anything runs
    assert json.loads((out / "plan.json").read_text())["config"]["init"] == "paper"

    def past_the_check(*args, **kwargs):  # run_study loads the data right after the settings check
        raise _PastTheCheck

    monkeypatch.setattr("timm_posgeom.data.load_split", past_the_check)
    for other in ("timm", None):
        with pytest.raises(StudyError, match=f"init: 'paper' -> {other!r}.*--allow-changes"):
            run_study(replace(paper, init=other), out, resume=True, progress=False)
    with pytest.raises(_PastTheCheck):  # the same init resumes
        run_study(paper, out, resume=True, progress=False)
    write_plan(paper, out)
    with pytest.raises(_PastTheCheck):  # accepted when asked: what it affects is recomputed
        run_study(replace(paper, init="timm"), out, resume=True, progress=False, allow_changes=True)
    write_plan(paper, out)
    with pytest.raises(SystemExit) as exc:
        cli_main(
            ["study", "--preset", "demo", "--conditions", "nope,ape", "--resume", "--init", "timm", "--out", str(out)]
        )
    assert exc.value.code == 2 and "init: 'paper' -> 'timm'" in capsys.readouterr().err
