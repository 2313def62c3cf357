"""What this package can measure on a timm model, found by running it: one :class:`SupportRow` per model.

:func:`check_support` tries, on a few smooth random images at the model's input size:

* **probe**: ``probe_ssdc`` with ``site="auto"`` (every SSDC finite, or NaN only where a grid has
  fewer than 2 tokens), or the one-line reason it was refused;
* **rpi**: the same under a random token permutation, or the reason it is refused;
* **equivariance**: where the model is flat and its positional encodings can all be removed
  (``pe_scale(model, 0)``, or none to remove), whether its blocks are then exactly permutation-
  equivariant (float64): the permuted run's last block output equals the unpermuted one with its
  patch tokens reordered by the permutation. True for global attention (to float32 rounding where
  the model computes its norms in float32 whatever its dtype: deepseek_vit); False where the
  architecture itself knows positions (convolutions, windows, token-mixing MLPs);
* **pe_scale**: what ``pe_scale(model, 0.5)`` scales, or why it refuses; and that every parameter
  and buffer is bit-identical afterwards.

``docs/support.md`` is this table over one small model of every timm family with a spatial grid,
written by ``scripts/support_matrix.py`` and checked against a fresh run by ``tests/test_support.py``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..interventions import PEEntry, PEScaleError, pe_inventory, pe_scale, token_permutation
from . import probe_ssdc
from .sites import find_sites

__all__ = ["SupportRow", "check_support", "smooth_images"]


@dataclass
class SupportRow:
    """One model's support, as measured (see the module docstring); strings are table-ready."""

    model: str
    family: str
    probe: str
    rpi: str
    equivariance: str
    pe_scale: str
    restored: bool

    def to_dict(self) -> dict:
        return asdict(self)


def smooth_images(n: int, size: tuple[int, int], seed: int = 0) -> torch.Tensor:
    """(n, 3, H, W) images with spatial structure (upsampled 4 x 4 noise): nearby patches look alike."""
    gen = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=gen), size=size, mode="bicubic", align_corners=False)


def _reason(error: Exception) -> str:
    """The first sentence of an error, table-ready (no pipes, no newlines); the usual refusals in short."""
    message = str(error)
    if "has no `patch_embed`" in message:
        return "refused: no patch embedding (`patch_embed`) to permute the tokens after"
    if "branches (a multi-branch model" in message:
        return "refused: a multi-branch patch embedding (one `patch_embed` per branch)"
    text = message.split(". ")[0].replace("|", "/").replace("\n", " ")
    return f"refused ({type(error).__name__}): {text if len(text) <= 200 else text[:197] + '...'}"


def _probe(model: nn.Module, images: torch.Tensor, rpi: bool) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = probe_ssdc(model, images, rpi=rpi, progress=False)
    except (TypeError, ValueError, RuntimeError) as e:
        return _reason(e)
    grids = [tuple(g) for g in result.settings["grid_sizes"]]
    # NaN is right where a random-init model's tokens are all alike at a layer (levit's 2 x 2 stage at 64 px)
    constant = set(result.settings.get("constant_layers") or [])
    finite = [
        math.isfinite(v) or g[0] * g[1] < 2 or layer in constant
        for layer, v, g in zip(result.layers, result.per_layer, grids)
    ]
    if not all(finite):
        raise AssertionError(f"probe_ssdc gave a non-finite SSDC on a grid of 2 or more tokens: {result.per_layer}")
    if rpi:
        return "yes"
    unit = "blocks" if result.settings["granularity"] == "block" else "feature maps"
    sizes = sorted(set(grids), reverse=True)
    shown = (sizes, ", ") if len(sizes) <= 3 else ([sizes[0], sizes[-1]], "..")  # all grids, or the range
    return (
        f"{result.settings['site']}: {len(grids)} {unit}, grid {shown[1].join('x'.join(map(str, g)) for g in shown[0])}"
    )


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def _same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = model.state_dict(keep_vars=True)
    return after.keys() == before.keys() and all(torch.equal(after[k].detach(), v) for k, v in before.items())


def _kinds(entries: list[PEEntry]) -> str:
    """'kind (count), ...' of inventory entries, each kind cut before its explanation."""
    counts: dict[str, int] = {}
    for e in entries:
        short = e.kind.split(" (")[0]
        counts[short] = counts.get(short, 0) + 1
    return ", ".join(f"{k} (x{n})" if n > 1 else k for k, n in counts.items())


def _pe_scale(model: nn.Module, images: torch.Tensor) -> tuple[str, bool]:
    """(what pe_scale(0.5) scaled, or why it refused; whether the state is bit-identical after it)."""
    before = _state(model)
    inventory = pe_inventory(model)
    scalable = [e for e in inventory if e.scalable]
    fixed = [e for e in inventory if not e.scalable]
    try:
        with torch.no_grad(), pe_scale(model, 0.5):
            model(images)
        text = f"scales {_kinds(scalable)}"
    except PEScaleError as e:
        if scalable and fixed:
            text = f"refused (strict): scales {_kinds(scalable)}; cannot scale {_kinds(fixed)}"
        elif fixed:
            text = f"refused: cannot scale {_kinds(fixed)}"
        elif "found no positional encoding" in str(e):
            text = "refused: no positional encoding found"
        else:
            text = _reason(e)
    return text, _same_state(model, before)


def _equivariance(model: nn.Module, images: torch.Tensor) -> str:
    """Exact permutation equivariance of the blocks with every PE removed, in float64 (see module doc)."""
    try:
        find_sites(model)
    except TypeError:
        return "n/a (probed per stage)"
    m = copy.deepcopy(model).double().eval()
    outputs = []
    hook = (
        find_sites(m)
        .blocks[-1]
        .register_forward_hook(lambda mod, a, out: outputs.append(out[0] if isinstance(out, tuple) else out))
    )
    try:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(pe_scale(m, 0.0))
            except PEScaleError as e:
                if "no positional encoding" not in str(e):
                    return "n/a: a PE cannot be removed"
            with torch.no_grad():
                m(images.double())
                with token_permutation(m, seed=0) as handle:
                    m(images.double())
    except (TypeError, ValueError, RuntimeError) as e:
        return _reason(e)
    finally:
        hook.remove()
    plain, permuted = (o.reshape(o.shape[0], -1, o.shape[-1]) for o in outputs)
    assert handle.permutation is not None  # drawn by the permuted forward above
    n = handle.permutation.numel()
    plain, permuted = plain[:, plain.shape[1] - n :], permuted[:, permuted.shape[1] - n :]
    expected = plain[:, handle.permutation]
    if torch.allclose(permuted, expected, rtol=0, atol=1e-9):
        return "exact"
    # modules that compute in float32 whatever the model's dtype (deepseek_vit's RmsNormFp32) round the float64
    # run to float32: equivariant up to that rounding, far below any position effect
    fp32 = any(type(mod).__name__.endswith("Fp32") for mod in m.modules())
    if fp32 and torch.allclose(permuted, expected, rtol=0, atol=1e-5 * float(expected.abs().max())):
        return "exact to float32 rounding (float32 norms)"
    return "no (the architecture knows positions)"


def check_support(
    model: nn.Module,
    name: str | None = None,
    img_size: tuple[int, int] | None = None,
    num_images: int = 2,
    family: str | None = None,
) -> SupportRow:
    """Measure what :mod:`timm_posgeom` supports on ``model`` (see the module docstring).

    Args:
        model: any timm model (random weights are fine).
        name: the name to show (default: its pretrained config's architecture).
        img_size: (H, W) of the test images (default: the model's input size).
        num_images: test images.
        family: the family to show (default: the module of the model's class).
    """
    model.eval()
    cfg = getattr(model, "pretrained_cfg", None) or {}
    name = name or str(cfg.get("architecture") or type(model).__name__)
    if img_size is None:
        from ..data.transforms import resolve_config

        img_size = tuple(resolve_config(model)["input_size"][1:])
    images = smooth_images(num_images, img_size)
    family = family or type(model).__module__.split(".")[-1]
    scale_text, restored = _pe_scale(model, images)
    return SupportRow(
        model=name,
        family=family,
        probe=_probe(model, images, False),
        rpi=_probe(model, images, True),
        equivariance=_equivariance(model, images),
        pe_scale=scale_text,
        restored=restored,
    )


_COLUMNS = ("family", "model", "probe", "rpi", "equivariance", "pe_scale", "restored")
_HEAD = (
    "timm family",
    "model (random weights, test size)",
    "probe_ssdc (site auto)",
    "RPI",
    "no-PE blocks permutation-equivariant",
    "pe_scale(model, 0.5)",
    "state restored bit for bit",
)


def support_table(rows: list[SupportRow], sizes: dict[str, str] | None = None) -> str:
    """A markdown table of ``rows`` (``sizes``: model -> its test configuration, shown after the name)."""
    lines = ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    for row in rows:
        cells = asdict(row)
        name = f"`{row.model}`" + (f" {sizes[row.model]}" if sizes and row.model in sizes else "")
        cells["model"] = name
        cells["restored"] = "yes" if row.restored else "NO"
        lines.append("| " + " | ".join(str(cells[c]).replace("|", "/") for c in _COLUMNS) + " |")
    return "\n".join(lines)


def parse_support_table(text: str) -> dict[str, dict[str, str]]:
    """The rows of a :func:`support_table` in ``text``, keyed by model name (cells as written)."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != len(_COLUMNS) or not cells[1].startswith("`"):
            continue
        row = dict(zip(_COLUMNS, cells))
        rows[cells[1].split("`")[1]] = row
    return rows


@dataclass(frozen=True)
class MatrixEntry:
    """One row of the support matrix: a timm ``family`` (its module), one of its models, the test image
    side and constructor keywords that keep it small (``kwargs``: (name, value) pairs)."""

    family: str
    model: str
    img_size: int = 64
    kwargs: tuple = ()

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.kwargs)
        return f"({self.img_size} px{', ' + extra if extra else ''})"


# One small model per timm family (the module that registers it), at a small test size; kwargs shrink the
# deepest ones. Chosen as each family's smallest model by parameter count that runs at this size.
MATRIX: tuple[MatrixEntry, ...] = (
    MatrixEntry("beit", "beit_base_patch16_224", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("byoanet", "botnet26t_256", 64, (("img_size", 64),)),
    MatrixEntry("byobnet", "test_byobnet", 64, (("img_size", 64),)),
    MatrixEntry("cait", "cait_xxs24_224", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("coat", "coat_tiny", 64, (("img_size", 64),)),
    MatrixEntry("convit", "convit_tiny", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("convmixer", "convmixer_768_32", 64),
    MatrixEntry("convnext", "test_convnext", 64),
    MatrixEntry("cpubone", "cpubone_nano", 64),
    MatrixEntry("crossvit", "crossvit_tiny_240", 64),
    MatrixEntry("csatv2", "csatv2", 64),
    MatrixEntry("cspnet", "cs3darknet_focus_s", 64),
    MatrixEntry("cspnext", "cspnext_tiny", 64),
    MatrixEntry("davit", "davit_tiny", 64),
    MatrixEntry("deepseek_vit", "deepseek_vit_412m", 126, (("depth", 2),)),
    MatrixEntry("deit", "deit_tiny_patch16_224", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("densenet", "densenet121", 64),
    MatrixEntry("dla", "dla46x_c", 64),
    MatrixEntry("dpn", "dpn48b", 64),
    MatrixEntry("edgenext", "edgenext_xx_small", 64),
    MatrixEntry("efficientformer", "efficientformer_l1", 224),
    MatrixEntry("efficientformer_v2", "efficientformerv2_s0", 64, (("img_size", 64),)),
    MatrixEntry("efficientnet", "test_efficientnet", 64),
    MatrixEntry("efficientvim", "efficientvim_m1", 64),
    MatrixEntry("efficientvit_mit", "efficientvit_b0", 64),
    MatrixEntry("efficientvit_msra", "efficientvit_m0", 64, (("img_size", 64),)),
    MatrixEntry("eva", "vit_tiny_patch16_dinov3_qkvb", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("fasternet", "fasternet_t0", 64),
    MatrixEntry("fastvit", "fastvit_t8", 64),
    MatrixEntry("focalnet", "focalnet_tiny_srf", 64),
    MatrixEntry("gcvit", "gcvit_xxtiny", 64, (("img_size", 64),)),
    MatrixEntry("gemma4_vit", "gemma4_vit_167m", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("ghostnet", "ghostnet_050", 64),
    MatrixEntry("hardcorenas", "hardcorenas_b", 64),
    MatrixEntry("hgnet", "hgnetv2_b0", 64),
    MatrixEntry("hiera", "hiera_tiny_224", 64, (("img_size", 64),)),
    MatrixEntry("hieradet_sam2", "sam2_hiera_tiny", 64),
    MatrixEntry("hrnet", "hrnet_w18_small", 64),
    MatrixEntry("iformer", "iformer_t", 64),
    MatrixEntry("inception_next", "inception_next_atto", 64),
    MatrixEntry("inception_resnet_v2", "inception_resnet_v2", 96),
    MatrixEntry("inception_v3", "inception_v3", 96),
    MatrixEntry("inception_v4", "inception_v4", 96),
    MatrixEntry("lcnetv2", "lcnetv2_small", 64),
    MatrixEntry("levit", "levit_128s", 64, (("img_size", 64),)),
    MatrixEntry("lowformer", "lowformer_b0", 64),
    MatrixEntry("mambaout", "test_mambaout", 64),
    MatrixEntry("maxxvit", "test_coatnet", 64, (("img_size", 64),)),
    MatrixEntry("metaformer", "poolformerv2_s12", 64),
    MatrixEntry("mlp_mixer", "gmlp_ti16_224", 64, (("img_size", 64),)),
    MatrixEntry("mobilenetv3", "mobilenetv3_small_050", 64),
    MatrixEntry("mobilenetv5", "mobilenetv5_base", 64),
    MatrixEntry("mobilevit", "mobilevit_xxs", 64, (("img_size", 64),)),
    MatrixEntry("mvitv2", "mvitv2_tiny", 64, (("img_size", 64),)),
    MatrixEntry("naflexvit", "naflexvit_base_patch16_parfac_gap", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("nasnet", "nasnetalarge", 64),
    MatrixEntry("nest", "nest_tiny", 64, (("img_size", 64),)),
    MatrixEntry("nextvit", "nextvit_small", 64),
    MatrixEntry("nfnet", "test_nfnet", 64),
    MatrixEntry("pit", "pit_ti_224", 64, (("img_size", 64),)),
    MatrixEntry("pnasnet", "pnasnet5large", 64),
    MatrixEntry("pvt_v2", "pvt_v2_b0", 64),
    MatrixEntry("qwen3_vit", "qwen3_vit_88m", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("rdnet", "rdnet_tiny", 64),
    MatrixEntry("regnet", "regnetx_002", 64),
    MatrixEntry("repghost", "repghostnet_050", 64),
    MatrixEntry("repvit", "repvit_m1", 64, (("img_size", 64),)),
    MatrixEntry("res2net", "res2next50", 64),
    MatrixEntry("resnest", "resnest14d", 64),
    MatrixEntry("resnet", "test_resnet", 64),
    MatrixEntry("resnetv2", "resnetv2_18", 64),
    MatrixEntry("rexnet", "rexnet_100", 64),
    MatrixEntry("selecsls", "selecsls42", 64),
    MatrixEntry("senet", "legacy_seresnet18", 64),
    MatrixEntry("sequencer", "sequencer2d_s", 64, (("img_size", 64), ("layers", (1, 1, 1, 1)))),
    MatrixEntry("shvit", "shvit_s1", 64),
    MatrixEntry("sknet", "skresnet18", 64),
    MatrixEntry("starnet", "starnet_s050", 64),
    MatrixEntry("swiftformer", "swiftformer_xs", 64, (("img_size", 64),)),
    MatrixEntry("swin_transformer", "swin_tiny_patch4_window7_224", 64, (("depths", (1, 1, 1, 1)), ("img_size", 64))),
    MatrixEntry("swin_transformer_v2", "swinv2_tiny_window16_256", 64, (("depths", (1, 1, 1, 1)), ("img_size", 64))),
    MatrixEntry("swin_transformer_v2_cr", "swinv2_cr_tiny_224", 64, (("depths", (1, 1, 1, 1)), ("img_size", 64))),
    MatrixEntry("tiny_vit", "tiny_vit_5m_224", 64),
    MatrixEntry("tnt", "tnt_s_legacy_patch16_224", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry("tresnet", "tresnet_m", 64),
    MatrixEntry("twins", "twins_svt_small", 64, (("img_size", 64),)),
    MatrixEntry("vgg", "vgg11", 64),
    MatrixEntry("visformer", "visformer_tiny", 64, (("img_size", 64),)),
    MatrixEntry("vision_transformer", "test_vit", 64, (("img_size", 64),)),
    MatrixEntry("vision_transformer_hybrid", "vit_tiny_r_s16_p8_224", 64, (("img_size", 64),)),
    MatrixEntry("vision_transformer_relpos", "test_vit_relpos", 64, (("depth", 2), ("img_size", 64))),
    MatrixEntry(
        "vision_transformer_sam",
        "samvit_base_patch16_224",
        64,
        (("depth", 2), ("global_attn_indexes", (1,)), ("img_size", 64), ("window_size", 2)),
    ),
    MatrixEntry("vitamin", "vitamin_small_224", 64, (("img_size", 64),)),
    MatrixEntry("volo", "volo_d1_224", 64, (("img_size", 64),)),
    MatrixEntry("vovnet", "ese_vovnet19b_slim", 64),
    MatrixEntry("xception", "legacy_xception", 96),
    MatrixEntry("xception_aligned", "xception41", 96),
    MatrixEntry("xcit", "xcit_nano_12_p16_224", 64, (("depth", 2), ("img_size", 64))),
)


def build_matrix_model(entry: MatrixEntry) -> nn.Module:
    """The entry's model with random weights (seed 0), in eval mode."""
    import timm

    torch.manual_seed(0)
    return timm.create_model(entry.model, pretrained=False, **dict(entry.kwargs)).eval()


def support_page(
    rows: list[SupportRow], timm_version: str, package_version: str, entries: tuple[MatrixEntry, ...] | None = None
) -> str:
    """``docs/support.md``: the table of ``rows`` with what its columns mean and how it was made."""
    entries = MATRIX if entries is None else entries
    sizes = {e.model: e.describe() for e in entries}
    flat = sum(r.probe.startswith(("attn_input", "block_output")) for r in rows)
    staged = sum(r.probe.startswith("stage_output") for r in rows)
    return "\n".join(
        [
            "# What timm-posgeom measures on every timm family",
            "",
            f"One small model of each of {len(rows)} timm model families (timm {timm_version}, timm-posgeom "
            f"{package_version}), random weights, a few smooth random images at the size shown. Every cell is "
            "measured, not declared: `python scripts/support_matrix.py` writes this page from "
            "`timm_posgeom.probes.support.check_support`, and `tests/test_support.py` runs the same rows in CI and fails "
            "when a cell differs.",
            "",
            f"{flat} models are probed per block (flat ViTs, at the paper's `attn_input`), {staged} per stage "
            "(each feature map of timm's `forward_intermediates` on its own grid).",
            "",
            '- **probe_ssdc**: the site `site="auto"` chose, how many maps, their grids; every SSDC is finite '
            "(NaN only on a grid of fewer than 2 tokens).",
            "- **RPI**: `probe_ssdc(..., rpi=True)` ran (`yes`), or the reason it is refused.",
            "- **no-PE blocks permutation-equivariant**: for flat models, with every PE removed (`pe_scale(model, 0)`) "
            "in float64, whether the last block's output under a token permutation equals the plain output with "
            "its patch tokens permuted (to 1e-9). `exact` for global attention (`exact to float32 rounding` where "
            "the model computes its norms in float32 whatever its dtype: to 1e-5 of the largest output); `no` where "
            "the architecture itself knows positions (convolutions, windows, token-mixing MLPs).",
            "- **pe_scale(model, 0.5)**: what it scales (`pe_inventory`), or why it refuses.",
            "- **state restored**: every parameter and buffer bit-identical after `pe_scale` (always `yes`, or the "
            "test fails).",
            "",
            support_table(rows, sizes),
            "",
        ]
    )
