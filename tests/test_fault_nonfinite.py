"""Bad-input suite, class "non-finite numbers" (issue 40, item 1): NaN or inf in the logits, tokens or attention
weights gives NaN (with a one-line warning) or a refusal, never a number: an arg-max of NaN logits is class 0
(top-1 became the share of class-0 images, FS 0.000 [0.000, 0.000]); a 0 / 0 of CKA is NaN, decided on the
features, not by the sign of a rounding error (constant or identical images gave -1, 2.1 or inf).

The generator crosses the measures with the sources of non-finite numbers: a PE scaled by 1e30 (every token
NaN after the first LayerNorm), a NaN weight in block 1 of 3 (layers 0 and 1 intact, layer 2 and the logits
NaN), one NaN logit (the head's bias of class 0), an image of inf. A right outcome is NaN exactly where the
numbers are not finite, the clean model's number elsewhere, and a warning that says so."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import timm
import torch
from faultsuite import cli, judge, library, refused, right
from PIL import Image

APE = "posgeom_vit_micro_patch8_64_ape"
N = 6


def _model(source: str = "clean", depth: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(APE, img_size=32, depth=depth, num_classes=3, embed_dim=32, num_heads=2).eval()
    with torch.no_grad():
        model.pos_embed.normal_(0, 1)
        if source == "block":  # block 1's MLP: layer 2's input and the logits NaN, layers 0 and 1 intact
            model.blocks[1].mlp.fc2.bias[0] = math.nan
        elif source == "logit":  # one NaN logit: argmax reads class 0 for every image
            model.head.bias[0] = math.nan
    return model


def _images(n: int = N) -> list[tuple[Image.Image, int]]:
    rng = np.random.default_rng(0)
    return [(Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)), i % 3) for i in range(n)]


def _batch(source: str) -> torch.Tensor:
    x = torch.randn(N, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    if source == "inf":
        x[2, :, :4, :4] = math.inf
    return x


def _warned(caught) -> bool:
    return any("not finite" in str(w.message) for w in caught)


def _nan(values) -> bool:
    return bool(np.isnan(np.asarray(values, dtype=float)).all())


def _call(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, error, trace = library(fn)
    return value, error, trace, caught


def _alpha(source: str) -> float | None:
    return 1e30 if source == "alpha" else None


# --------------------------------------------------------------------------------------------
# the generator: measure x source -> (the call, the check of its value against the clean model's)
# --------------------------------------------------------------------------------------------
def _fragility(source, rpi=False):
    from timm_posgeom import fragility

    res = fragility(
        _model(source), _images(), ["jpeg:50"], rpi=rpi, alpha=_alpha(source), num_workers=0, progress=False, seed=0
    )
    return _nan([res.clean_accuracy, res.fs["jpeg:50"], *res.fs_interval["jpeg:50"], *res.clean_interval])


def _imagenet_c(source):
    from timm_posgeom.robustness.imagenet_c import imagenet_c_fragility

    res = imagenet_c_fragility(
        _model(source), _images(), ["gaussian_noise"], [1], alpha=_alpha(source), num_workers=0, progress=False, seed=0
    )
    return _nan([res.clean_accuracy, res.mean_fs])


def _sweep(source):
    from timm_posgeom import alpha_sweep

    kw = dict(num_workers=0, progress=False, probe_images=N, rpi_permutations=2, seed=0, batch_size=3)
    both = alpha_sweep(_model(source), _images(), alphas=(1.0, 1e30), **kw)
    alone = alpha_sweep(_model(source), _images(), alphas=(1.0,), **kw)
    second = both.rows[1]
    return (
        _nan([second.delta_ssdc, second.clean_accuracy, second.fs["jpeg:5"], *second.delta_ssdc_ci])
        and both.rows[0].delta_ssdc == alone.rows[0].delta_ssdc
    )


def _probe(source, rpi=False):
    from timm_posgeom import probe_ssdc

    def run(model):
        return probe_ssdc(
            model,
            _batch(source),
            rpi=rpi,
            rpi_permutations=2,
            reduction="both",
            alpha=_alpha(source),
            progress=False,
            seed=0,
            batch_size=3,
        )

    res = run(_model(source))
    if source in ("alpha", "inf"):
        return _nan(res.per_layer) and _nan([s.mean for s in res.per_image])
    clean = run(_model("clean"))
    return (
        res.per_layer[:2] == clean.per_layer[:2]
        and _nan([res.per_layer[2], *res.per_layer_ci[2]])
        and math.isnan(res.per_image[2].mean)
        and res.per_image[1].mean == clean.per_image[1].mean
    )


def _attention(source, rpi=False):
    from timm_posgeom.probes import attention_measures

    def run(model):
        return attention_measures(
            model,
            _batch(source),
            rpi=rpi,
            rpi_permutations=2,
            alpha=_alpha(source),
            progress=False,
            seed=0,
            batch_size=3,
        )

    res = run(_model(source))
    if source in ("alpha", "inf"):
        return _nan(res.mean_distance) and _nan(res.entropy)
    clean = run(_model("clean"))
    return (
        np.array_equal(res.mean_distance[:2], clean.mean_distance[:2])
        and _nan(res.mean_distance[2])
        and _nan(res.entropy[2])
    )


def _position(source, rpi=False):
    from timm_posgeom import pe_scale
    from timm_posgeom.probes import position_probe

    def run(model):
        x = _batch(source)
        if source == "alpha":
            with pe_scale(model, 1e30):
                return position_probe(model, x[:3], x[3:], rpi=rpi, progress=False, batch_size=3)
        return position_probe(model, x[:3], x[3:], rpi=rpi, progress=False, batch_size=3)

    res = run(_model(source))
    if source in ("alpha", "inf"):
        return _nan(res.accuracy)
    clean = run(_model("clean"))
    return np.array_equal(res.accuracy[:2], clean.accuracy[:2]) and _nan(res.accuracy[2])


def _cka(source):
    from timm_posgeom.probes import cka

    model = _model("block" if source == "block" else "clean")
    x = {
        "constant": torch.zeros(8, 3, 32, 32),
        "identical": torch.randn(1, 3, 32, 32).repeat(8, 1, 1, 1),
        "block": torch.randn(8, 3, 32, 32),
    }[source]
    res = cka(model, model, x, batch_size=4, progress=False)
    if source == "block":  # layer 2's tokens NaN: its row and column; layers 0 and 1 a number
        return _nan(res.matrix[2, :]) and _nan(res.matrix[:, 2]) and np.isfinite(res.matrix[:2, :2]).all()
    return _nan(res.matrix)


LIBRARY = [
    *((f"fragility/{s}", lambda s=s: _fragility(s)) for s in ("alpha", "block", "logit")),
    *((f"fragility rpi/{s}", lambda s=s: _fragility(s, rpi=True)) for s in ("alpha", "logit")),
    *((f"imagenet-c/{s}", lambda s=s: _imagenet_c(s)) for s in ("alpha", "logit")),
    ("sweep/alpha 1e30", lambda: _sweep("clean")),
    *((f"probe/{s}", lambda s=s: _probe(s)) for s in ("alpha", "block", "inf")),
    *((f"probe rpi/{s}", lambda s=s: _probe(s, rpi=True)) for s in ("alpha", "block")),
    *((f"attention/{s}", lambda s=s: _attention(s)) for s in ("alpha", "block", "inf")),
    ("attention rpi/block", lambda: _attention("block", rpi=True)),
    *((f"position/{s}", lambda s=s: _position(s)) for s in ("alpha", "block", "inf")),
    ("position rpi/block", lambda: _position("block", rpi=True)),
]
CKA = ["constant", "identical", "block"]


@pytest.mark.parametrize("check", [c for _, c in LIBRARY], ids=[i for i, _ in LIBRARY])
def test_non_finite_numbers_give_nan_with_a_warning_never_a_number(check, one_thread):
    ok, error, trace, caught = _call(check)
    outcome = "traceback" if error is not None else ("right" if ok and _warned(caught) else "silent_wrong")
    judge("nonfinite", outcome, "right", trace or [str(w.message) for w in caught])


@pytest.mark.parametrize("source", CKA)
def test_cka_of_a_representation_without_variance_is_nan_decided_exactly(source, one_thread):
    """0 / 0 for constant or identical images: NaN, said; never -1, 2.1 or inf from the sign of a rounding error."""
    ok, error, trace, caught = _call(lambda: _cka(source))
    said = any("not finite" in str(w.message) or "no variance" in str(w.message) for w in caught)
    outcome = "traceback" if error is not None else ("right" if ok and said else "silent_wrong")
    judge("nonfinite", outcome, "right", trace)


def test_cka_of_distinct_images_is_still_a_number(one_thread):
    from timm_posgeom.probes import cka

    model = _model(depth=2)
    res = cka(model, model, torch.randn(8, 3, 32, 32), batch_size=4, progress=False)
    assert np.isfinite(res.matrix).all() and np.allclose(np.diag(res.matrix), 1.0)


# --------------------------------------------------------------------------------------------
# the command line: one warning line and NaN written (null), or one refusal line
# --------------------------------------------------------------------------------------------
def _folder(root):
    for i, (image, label) in enumerate(_images()):
        (root / "validation" / f"c{label}").mkdir(parents=True, exist_ok=True)
        image.save(root / "validation" / f"c{label}" / f"{i}.png")
    return root


COMMON = ["--img-size", "32", "--num-workers", "0", "--no-progress", "--num-classes", "3", "--labels", "as-is"]
CLI = [  # (id, argv after MODEL --data D --out O, the JSON file, its numbers that must be null)
    (
        "fragility --alpha 1e30",
        ["fragility", "--alpha", "1e30", "--shift", "jpeg:5", *COMMON],
        "fragility.json",
        lambda d: [d["clean_accuracy"], d["fs"]["jpeg:5"], *d["fs_interval"]["jpeg:5"]],
    ),
    (
        "fragility --rpi --alpha 1e30",
        ["fragility", "--rpi", "--alpha", "1e30", "--shift", "jpeg:5", *COMMON],
        "fragility.json",
        lambda d: [d["clean_accuracy"], d["fs"]["jpeg:5"]],
    ),
    ("probe --alpha 1e30", ["probe", "--alpha", "1e30", *COMMON[:5]], "ssdc.json", lambda d: d["per_layer"]),
    (
        "sweep --alphas 1,1e30",
        ["sweep", "--alphas", "1,1e30", "--rpi-permutations", "2", *COMMON],
        "sweep.json",
        lambda d: [d["rows"][1]["delta_ssdc"], d["rows"][1]["clean_accuracy"], d["rows"][1]["fs"]["jpeg:5"]],
    ),
    (
        "attention --alpha 1e30",
        ["attention", "--alpha", "1e30", *COMMON[:5]],
        "attention.json",
        lambda d: [v for row in d["mean_distance"] for v in row],
    ),
]


@pytest.mark.parametrize("argv,name,nulls", [c[1:] for c in CLI], ids=[c[0] for c in CLI])
def test_the_command_line_writes_null_and_says_why_in_one_line(tmp_path, argv, name, nulls, one_thread):
    data, out = _folder(tmp_path / "data"), tmp_path / "out"
    run = cli([argv[0], APE, "--data", data, "--out", out, *argv[1:]])
    said = [line for line in run.lines if "warning:" in line and "not finite" in line]
    ok = False
    if run.code == 0:
        values = nulls(json.loads((out / name).read_text()))
        ok = all(v is None for v in values) and len(said) >= 1 and all("\n" not in s for s in said)
    judge("nonfinite", right(run, ok), "right", run.err or run.trace)


@pytest.mark.parametrize(
    "command,model",
    [
        ("fragility", APE),
        ("probe", "posgeom_vit_micro_patch8_64_rope"),
        ("probe", "vit_tiny_patch16_224"),
        ("sweep", APE),
    ],
)
def test_an_alpha_that_overflows_the_pe_is_refused_in_one_line(tmp_path, command, model, one_thread):
    data = _folder(tmp_path / "data")
    extra = (
        ["--alphas", "1,1e39", "--rpi-permutations", "2", *COMMON]
        if command == "sweep"
        else ["--alpha", "1e39", *(COMMON if command == "fragility" else COMMON[:5])]
    )
    if model.startswith("vit_"):
        extra += ["--img-size", "32"]
    run = cli([command, model, "--data", data, "--out", tmp_path / "out", *extra])
    judge("nonfinite", refused(run, "overflows the positional encoding"), "refused", run.err or run.trace)
    assert not (tmp_path / "out").exists()


def test_a_zoo_row_of_a_model_with_nan_weights_is_empty_with_a_note(tmp_path, one_thread):
    """A NaN weight (a diverged export): top-1, FS and SSDC of the layers after it are empty, noted; the layers
    before it keep their numbers."""
    from timm_posgeom.app.hub import export_for_hub
    from timm_posgeom.app.records import ZooModel

    model = _model("block")
    export = export_for_hub(
        model, tmp_path / "export", dict(img_size=32, depth=3, num_classes=3, embed_dim=32, num_heads=2)
    )
    data = _folder(tmp_path / "data")
    run = cli(
        [
            "zoo",
            f"local-dir:{export}",
            "--data",
            data,
            "--out",
            tmp_path / "zoo",
            "--no-progress",
            "--num-workers",
            "0",
            "--rpi-permutations",
            "2",
            "--extras",
            "none",
        ]
    )
    ok = False
    if run.code == 0:
        record = ZooModel.read(next((tmp_path / "zoo" / "models").glob("*.json")))
        ok = (
            record.clean_accuracy is None
            and record.ssdc[2] is None
            and record.ssdc[0] is not None
            and any("not finite" in n for n in record.notes)
        )
    judge("nonfinite", right(run, ok), "right", run.err or run.trace)
