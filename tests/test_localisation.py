"""Causal localisation (docs/method.md#causal-localisation): activation patching, the PE imprint, position-direction
ablation and the CKA of the encoding, checked against identities that wrong code breaks.

Random-init models hide PE effects, so the models here make theirs visible on purpose: the APE table is scaled up,
the RoPE model's queries and keys (its rotation then moves the attention) and its attention output; the head's
weights are of size 1 (the logits of a random-init head are ~1e-4)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import timm
import torch
from scipy.stats import spearmanr

from timm_posgeom.errors import NonFiniteWarning
from timm_posgeom.localisation import activation_patching, encoding_cka, pe_imprint, position_ablation
from timm_posgeom.localisation.ablation import ablation_edit
from timm_posgeom.localisation.patching import patch_edit
from timm_posgeom.localisation.tracing import EMBEDDING, traced_forward
from timm_posgeom.probes import ConstantMapWarning, cka, find_sites, fit_position_map
from timm_posgeom.probes.support import smooth_images

TINY = dict(img_size=32, embed_dim=32, depth=2, num_heads=2, num_classes=10)


def _model(pe: str) -> torch.nn.Module:
    """A tiny model (4 x 4 grid) in float64 whose PE changes its outputs visibly."""
    torch.manual_seed(0)
    model = timm.create_model(f"posgeom_vit_micro_patch8_64_{pe}", **TINY).eval().double()
    with torch.no_grad():
        model.head.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))  # logits of size 1, not 1e-4
        if pe == "ape":
            model.pos_embed.mul_(20.0)
        if pe == "rope":
            for block in model.blocks:
                block.attn.qkv.weight[: 2 * 32].mul_(20.0)  # queries and keys: sharper attention, rotated by RoPE
                block.attn.proj.weight.mul_(10.0)  # and an attention update that dominates the residual stream
    return model


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    return smooth_images(16, (32, 32), seed=1).double(), torch.randint(
        0, 10, (16,), generator=torch.Generator().manual_seed(0)
    )


def _patch(model, data, **kw):
    """Patching with the clean model's own predictions as labels: clean top-1 is 1, and RPI can only lower it."""
    images, _ = data
    with torch.no_grad():
        labels = model(images).argmax(-1)
    return activation_patching(model, images, labels=labels, rpi_permutations=3, batch_size=8, progress=False, **kw)


@pytest.mark.slow
def test_ape_patching_at_any_layer_restores_the_clean_run_exactly(data):
    """An additive table acts only where it is added: the clean stream of any layer, aligned by the permutation
    (slot i given the clean token of patch p[i]), makes the rest of the RPI run the clean run, so top-1 and SSDC
    come back exactly; a wrong alignment (argsort(p), or none) would not."""
    model, images = _model("ape"), data[0]
    sites, p = find_sites(model), torch.randperm(16, generator=torch.Generator().manual_seed(5))
    clean = traced_forward(model, sites, images, record={EMBEDDING, 0, 1})
    rpi_logits = traced_forward(model, sites, images, p).logits
    assert (rpi_logits - clean.logits).abs().max() > 1e-3  # RPI moves the logits: a visible PE
    for layer in (EMBEDDING, 0, 1):
        patched_logits = traced_forward(model, sites, images, p, edit=patch_edit(layer, clean, p, "residual")).logits
        torch.testing.assert_close(patched_logits, clean.logits, rtol=0, atol=1e-10)
    result = _patch(model, data)
    patched = result.replicates["top1_patched"]
    assert abs(result.ssdc_clean - result.ssdc_rpi) > 1e-3 and result.layers == [EMBEDDING, 0, 1]
    np.testing.assert_array_equal(patched, np.full_like(patched, result.top1_clean))
    np.testing.assert_allclose(result.replicates["ssdc_patched"], result.ssdc_clean, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result.ssdc_restored, 1.0, rtol=0, atol=1e-6)
    low, high = result.intervals["ssdc_restored"]
    assert np.all(low <= result.ssdc_restored + 1e-9) and np.all(high >= result.ssdc_restored - 1e-9)
    assert result.peak("ssdc_restored") in result.layers


@pytest.mark.slow
def test_rope_patching_the_embedding_restores_nothing_and_the_last_block_everything(data):
    """RoPE acts inside the attention: the embedding under RPI already is the clean one aligned (patching it
    changes nothing), while the last block's output patched is the clean run's (the logits and maps return)."""
    result = _patch(_model("rope"), data)
    rpi_top1, rpi_ssdc = result.replicates["top1_rpi"], result.replicates["ssdc_rpi"]
    assert abs(result.ssdc_clean - result.ssdc_rpi) > 1e-3
    np.testing.assert_array_equal(result.replicates["top1_patched"][:, 0], rpi_top1)
    np.testing.assert_allclose(result.replicates["ssdc_patched"][:, 0], rpi_ssdc, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(result.replicates["top1_patched"][:, -1], np.full(3, result.top1_clean))
    np.testing.assert_allclose(result.replicates["ssdc_patched"][:, -1], result.ssdc_clean, rtol=0, atol=1e-9)
    assert result.ssdc_restored[0] == pytest.approx(0.0, abs=1e-6) and result.ssdc_restored[-1] == pytest.approx(1.0)
    update = _patch(_model("rope"), data, patch="update", layers=[EMBEDDING, 1])
    np.testing.assert_allclose(update.replicates["ssdc_patched"][:, 0], rpi_ssdc, rtol=0, atol=1e-9)
    assert not np.allclose(update.replicates["ssdc_patched"][:, 1], result.ssdc_clean)  # one update, not the stream


@pytest.mark.slow
def test_patching_nothing_is_the_rpi_run_and_without_pe_rpi_changes_nothing(data):
    images = data[0]
    for pe in ("rope", "nope"):
        model = _model(pe)
        sites = find_sites(model)
        p = torch.randperm(16, generator=torch.Generator().manual_seed(3))
        plain = traced_forward(model, sites, images, record={1})
        permuted = traced_forward(model, sites, images, p, record={1})
        for layer in (EMBEDDING, 0, 1):  # an edit that gives the output back is no patch: the RPI run itself
            same = traced_forward(model, sites, images, p, edit=(layer, lambda block_input, out: out))
            torch.testing.assert_close(same.logits, permuted.logits, rtol=0, atol=0)
        if pe == "nope":  # permutation-equivariant: the class token and the logits do not move, the tokens do
            torch.testing.assert_close(permuted.logits, plain.logits, rtol=0, atol=1e-10)
            torch.testing.assert_close(permuted.outputs[1][:, 1:], plain.outputs[1][:, 1:][:, p], rtol=0, atol=1e-10)
    with pytest.warns(RuntimeWarning, match="unchanged"):
        result = _patch(_model("nope"), data)
    np.testing.assert_array_equal(result.replicates["top1_rpi"], np.full(3, result.top1_clean))
    assert np.all(np.isnan(result.top1_restored)) and np.all(np.isnan(result.ssdc_restored))


@pytest.mark.slow
def test_patching_refuses_bad_settings(data):
    model = _model("ape")
    with pytest.raises(ValueError, match="patch must be"):
        _patch(model, data, patch="everything")
    with pytest.raises(ValueError, match="layers must lie"):
        _patch(model, data, layers=[2])
    images, _ = data
    with pytest.warns(RuntimeWarning, match="no labels"):
        result = activation_patching(model, images, rpi_permutations=2, progress=False)
    assert math.isnan(result.top1_clean) and np.all(np.isnan(result.top1_restored))
    assert np.all(np.isfinite(result.ssdc_patched))
    with torch.no_grad():
        model.head.bias[0] = math.nan  # NaN logits: no prediction, a NaN top-1, never class 0 counted
    with pytest.warns(NonFiniteWarning, match="logits are not finite"):
        result = activation_patching(
            model, images, labels=torch.zeros(16, dtype=torch.long), rpi_permutations=2, progress=False
        )
    assert math.isnan(result.top1_clean) and np.all(np.isnan(result.top1_patched))


def test_imprint_is_the_ssdc_of_constant_images_and_nan_without_pe():
    model = _model("ape")
    result = pe_imprint(model, colours=3)
    sites = find_sites(model)
    got = []
    handles = sites.register("attn_input", [1], lambda layer, x: got.append(x[:, 1:].float()))
    with torch.no_grad():  # the same constant images, read directly; SSDC by scipy
        from timm_posgeom.localisation.imprint import constant_images

        model(constant_images(model, 3, 0).double())
    for h in handles:
        h.remove()
    unit = got[0] / got[0].norm(dim=-1, keepdim=True)
    sim = (unit @ unit.transpose(1, 2))[1].double().numpy()
    rows, cols = np.divmod(np.arange(16), 4)
    dist = np.abs(rows[:, None] - rows[None]) + np.abs(cols[:, None] - cols[None])
    iu = np.triu_indices(16, 1)
    assert result.replicates["ssdc"][1, 1] == pytest.approx(spearmanr(sim[iu], -dist[iu])[0], abs=1e-6)
    assert np.all(np.isfinite(result.ssdc)) and np.all(result.intervals["ssdc"][0] <= result.ssdc)
    with pytest.warns(ConstantMapWarning, match="alike"):
        none = pe_imprint(_model("nope"), colours=3)
    assert np.all(np.isnan(none.ssdc)) and np.all(none.alike == 1.0)
    with pytest.warns(ConstantMapWarning, match="block\\(s\\) 0"):
        rope = pe_imprint(_model("rope"), colours=3)
    assert math.isnan(rope.ssdc[0]) and np.isfinite(rope.ssdc[1])  # RoPE reaches the tokens in block 0's attention


def test_ablation_removes_the_probe_reading_and_reports_drops(data):
    model = _model("ape")
    images, labels = data
    fitted = fit_position_map(model, images, site="block_output", progress=False)
    basis, mean = fitted.directions(0), fitted.mean[0]
    assert basis.shape == (32, 6)  # 4 rows + 4 columns, each one-hot set summing to 1: rank 4 + 4 - 2
    tokens = torch.randn(5, 17, 32, dtype=torch.float64)
    ablated = ablation_edit(basis, mean, 16)(tokens, tokens)
    torch.testing.assert_close(ablated[:, 0], tokens[:, 0])  # the class token untouched
    readout = (ablated[:, 1:] - mean) @ basis
    torch.testing.assert_close(readout, torch.zeros_like(readout), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="block indices"):
        position_ablation(model, images, labels=labels, layers=[2], progress=False)
    result = position_ablation(model, images, labels=labels, batch_size=8, progress=False)
    assert result.layers == [0, 1] and list(result.rank) == [6.0, 6.0]
    for name in ("top1_drop", "ssdc_drop", "ssdc_drop_control"):
        assert result.values[name].shape == (2,) and np.all(np.isfinite(result.intervals[name][0]))
    assert result.ssdc_clean - result.ssdc_ablated[0] == pytest.approx(result.ssdc_drop[0])


def test_encoding_cka_is_one_without_pe_and_below_one_with_a_visible_one(data):
    images, _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        none = encoding_cka(_model("nope"), images, batch_size=4, progress=False)
    np.testing.assert_allclose(none.cka, 1.0, rtol=0, atol=1e-9)
    assert none.settings["pe"].startswith("none found")
    ape = encoding_cka(_model("ape"), images, batch_size=4, progress=False)
    assert ape.cka[0] < 0.99 and np.all(np.isfinite(ape.intervals["cka"][0]))
    plain = cka(_model("ape"), _model("ape"), images, batch_size=4, progress=False)
    low, high = plain.matrix_ci  # a jackknife over the 4 batches: the diagonal is 1 in every replicate
    np.testing.assert_allclose(np.diag(low), 1.0, atol=1e-9) and np.testing.assert_allclose(
        np.diag(high), 1.0, atol=1e-9
    )
    assert np.all(low <= plain.matrix + 1e-12) and np.all(high >= plain.matrix - 1e-12)


@pytest.mark.slow
def test_cli_writes_every_measure_and_refuses_in_one_line(tmp_path, capsys, one_thread):
    import json

    from timm_posgeom.cli.main import main

    out = tmp_path / "loc"
    common = ["--data", "synthetic", "--max-images", "8", "--batch-size", "4", "--num-classes", "10", "--no-progress"]
    args = ["localise", "posgeom_vit_micro_patch8_64_ape", *common, "--rpi-permutations", "2", "--colours", "2"]
    assert main([*args, "--img-size", "32", "--device", "cpu", "--num-workers", "0", "--out", str(out)]) == 0
    record = json.loads((out / "localisation.json").read_text())
    assert set(record) >= {"patching", "imprint", "ablation", "cka", "settings"}
    assert record["patching"]["layers"] == [-1, 0, 1, 2, 3] and record["settings"]["fit_split"] == "train"
    assert record["patching"]["settings"]["rpi_permutations"] == 2 and record["imprint"]["settings"]["colours"] == 2
    assert (out / "localisation.png").stat().st_size > 1000
    assert "ssdc_restored" in capsys.readouterr().out
    for bad, message in (
        (["--measures", "patching,vibes"], "--measures: choose among"),
        (["--colours", "0"], "--colours must be >= 1"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([*args, *bad, "--out", str(tmp_path / "bad")])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
