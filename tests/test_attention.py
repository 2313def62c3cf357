"""Attention measures: weights exact against the modules' own unfused path and against the qkv weights,
the model's outputs untouched, the measures against a direct computation, RPI, distributed-style sums, CLI."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from scipy.stats import spearmanr

import timm_posgeom
from timm_posgeom.probes import UnsupportedModelError, find_sites
from timm_posgeom.probes.attention import capture_attention
from timm_posgeom.probes.attention_measures import AttentionMeasure, attention_measures


def smooth_images(n: int, size: int = 64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=gen), size=size, mode="bicubic", align_corners=False)


def make_local(model: torch.nn.Module, gain: float) -> torch.nn.Module:
    """q = k = gain * (norm1 output), v = identity, in every block: each token attends to the tokens most like
    itself. With a PE in the tokens that is position; without, content (random init hides both)."""
    with torch.no_grad():
        for block in model.blocks:
            qkv = block.attn.qkv
            c = qkv.weight.shape[1]
            eye = torch.eye(c)
            qkv.weight.copy_(torch.cat([gain * eye, gain * eye, eye]))
            if qkv.bias is not None:
                qkv.bias.zero_()
            for name in ("q_bias", "v_bias"):
                if getattr(block.attn, name, None) is not None:
                    getattr(block.attn, name).zero_()
    return model


@pytest.fixture(scope="module")
def images():
    return smooth_images(5)


def _captured(model, images, layers=None):
    sites = find_sites(model)
    layers = list(range(len(sites.blocks))) if layers is None else layers
    maps: dict[int, torch.Tensor] = {}
    with torch.no_grad(), capture_attention(sites, layers, lambda layer, a: maps.__setitem__(layer, a)):
        out = model(images)
    return maps, out


def _unfused_reference(model, images):
    """The modules' own weights: fused attention off, the softmax output read at attn_drop (eval: identity)."""
    maps = []
    hooks = []
    for block in model.blocks:
        block.attn.fused_attn = False
        hooks.append(block.attn.attn_drop.register_forward_hook(lambda m, a, out: maps.append(out)))
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in hooks:
            h.remove()
        for block in model.blocks:
            block.attn.fused_attn = True
    return maps


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("posgeom_vit_micro_patch8_64_rope", {}),
        ("posgeom_vit_micro_patch8_64_ape", {}),
        ("vit_tiny_patch16_224", {"img_size": 64, "depth": 2}),
        ("eva02_tiny_patch14_224", {"img_size": 56, "depth": 2}),  # eva with RoPE (timm's own)
    ],
)
def test_weights_equal_the_modules_unfused_softmax_and_outputs_are_untouched(name, kwargs, images, one_thread):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=0, **kwargs).eval()
    x = images if kwargs.get("img_size", 64) == 64 else F.interpolate(images, size=kwargs["img_size"])
    assert all(b.attn.fused_attn for b in model.blocks)  # the probe must see through SDPA
    with torch.no_grad():
        plain = model(x)
    maps, probed = _captured(model, x)
    assert torch.equal(plain, probed)  # bit for bit: the hooks only read
    reference = _unfused_reference(model, x)
    assert len(maps) == len(reference) == len(model.blocks)
    for layer, ref in enumerate(reference):
        assert maps[layer].shape == ref.shape
        torch.testing.assert_close(maps[layer], ref, rtol=0, atol=1e-6)
        torch.testing.assert_close(maps[layer].sum(-1), torch.ones(ref.shape[:-1]), rtol=0, atol=1e-5)


def test_weights_equal_softmax_of_qkv_weights_in_float64(images, one_thread):
    torch.manual_seed(1)
    model = timm.create_model("vit_tiny_patch16_224", img_size=64, depth=2, num_classes=0).eval()
    inputs = []
    hook = model.blocks[1].norm1.register_forward_hook(lambda m, a, out: inputs.append(out))
    maps, _ = _captured(model, images, layers=[1])
    hook.remove()
    attn = model.blocks[1].attn
    x = inputs[0].double()
    qkv = x @ attn.qkv.weight.double().T + attn.qkv.bias.double()
    B, T, _ = x.shape
    q, k, _ = qkv.reshape(B, T, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    ref = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
    assert list(maps) == [1]
    torch.testing.assert_close(maps[1].double(), ref, rtol=0, atol=2e-6)


def _direct(maps: list[torch.Tensor], grid: tuple[int, int], prefix: int) -> dict[str, np.ndarray]:
    """The definitions of docs/attention.md in numpy/scipy, from maps (n, h, T, T) of every image."""
    H, W = grid
    r, c = np.divmod(np.arange(H * W), W)
    dist = np.hypot(r[:, None] - r[None], c[:, None] - c[None])
    manhattan = np.abs(r[:, None] - r[None]) + np.abs(c[:, None] - c[None])
    iu = np.triu_indices(H * W, 1)
    out = {k: [] for k in ("mean_distance", "mean_distance_unnormalised", "prefix_attention", "entropy", "ssdc")}
    for a in maps:
        a = a.double().numpy()
        pp = a[:, :, prefix:, prefix:]
        mass = pp.sum(-1)
        weighted = (pp * dist).sum(-1)
        out["mean_distance"].append((weighted / mass).mean(-1).mean(0))
        out["mean_distance_unnormalised"].append(weighted.mean(-1).mean(0))
        out["prefix_attention"].append((1 - mass).mean(-1).mean(0))
        rows = a[:, :, prefix:, :]
        out["entropy"].append((-(rows * np.log(rows)).sum(-1)).mean(-1).mean(0))
        mean = pp.mean(0)
        sym = (mean + mean.transpose(0, 2, 1)) / 2
        out["ssdc"].append([spearmanr(s[iu], -manhattan[iu]).statistic for s in sym])
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("rpi", [False, True])
def test_measures_match_direct_computation_streamed_over_batches(rpi, one_thread):
    torch.manual_seed(0)
    model = make_local(timm.create_model("posgeom_vit_micro_patch8_64_sincos", num_classes=0), 1.0).eval()
    x = smooth_images(7, seed=3)
    # batches 3 + 3 + 1; under RPI 3 shared permutations (seeds 5, 6, 7), two stacked per forward
    result = attention_measures(
        model, x, rpi=rpi, seed=5, batch_size=3, progress=False, rpi_permutations=3, forward_size=6
    )
    perm = result.permutation
    assert (perm is not None) == rpi
    # reference: the whole set in one forward, under each permutation (applied after the patch embedding)
    directs = []
    with torch.no_grad():
        for k in range(3 if rpi else 1):
            if rpi:
                with timm_posgeom.token_permutation(model, seed=5 + k, per="call") as handle:
                    maps = _unfused_reference(model, x)
                if k == 0:
                    assert torch.equal(handle.permutation.cpu(), perm)
            else:
                maps = _unfused_reference(model, x)
            directs.append(_direct(maps, (8, 8), 1))
    assert result.metadata["n_images"] == 7 and result.metadata["num_heads"] == 4
    for name in directs[0]:
        got = getattr(result, name)
        assert got.shape == (4, 4)
        want = np.mean([d[name] for d in directs], axis=0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
        if rpi:  # each permutation's own values, and the interval over them around their mean
            for k, d in enumerate(directs):
                np.testing.assert_allclose(result.replicates[name][k], d[name], rtol=1e-5, atol=1e-6)
            low, high = result.intervals[name]
            stack = np.stack([d[name] for d in directs])
            half = 4.302652729911275 * stack.std(0, ddof=1) / np.sqrt(3)  # t(0.975, 2 df)
            np.testing.assert_allclose(low, want - half, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(high, want + half, rtol=1e-5, atol=1e-6)
        else:
            assert result.intervals == {}
    assert (result.ssdc > 0.3).all()  # the sincos PE makes attention local: the measure is not vacuous
    assert result.mean_distance.max() < 3.5  # uniform attention over the 8 x 8 grid: 4.1
    json.loads(result.to_json())


def test_rpi_removes_content_locality_but_not_pe_locality(one_thread):
    """Attention that follows content (no PE) is local in the image and loses it on the index grid under RPI;
    attention that follows the PE (constant images) keeps it."""
    x = smooth_images(6, seed=1)
    torch.manual_seed(0)
    nope = make_local(timm.create_model("posgeom_vit_micro_patch8_64_nope", num_classes=0), 1.0).eval()
    plain = attention_measures(nope, x, progress=False, layers=[0])
    shuffled = attention_measures(nope, x, rpi=True, progress=False, layers=[0])
    assert plain.ssdc.min() > 0.25
    assert np.abs(shuffled.ssdc).max() < 0.05
    assert (shuffled.mean_distance > plain.mean_distance + 0.5).all()
    # without a PE the model is permutation-equivariant: each query's row is permuted, its entropy the same
    np.testing.assert_allclose(shuffled.entropy, plain.entropy, rtol=1e-5)
    torch.manual_seed(0)
    ape = make_local(timm.create_model("posgeom_vit_micro_patch8_64_sincos", num_classes=0), 1.0).eval()
    flat = torch.zeros(4, 3, 64, 64)
    kept = attention_measures(ape, flat, rpi=True, progress=False, layers=[0])
    assert kept.ssdc.min() > 0.3
    np.testing.assert_allclose(kept.ssdc, attention_measures(ape, flat, progress=False, layers=[0]).ssdc, atol=1e-9)
    # alpha 0 removes the PE: every patch token alike, attention uniform over the patches (SSDC undefined)
    gone = attention_measures(ape, flat, alpha=0.0, progress=False, layers=[0])
    assert np.isnan(gone.ssdc).all()
    assert gone.metadata["alpha"] == 0.0


def test_custom_measure_and_public_api(images, one_thread):
    class MaxWeight(AttentionMeasure):
        names = ("max_weight",)

        def update(self, attn, view):
            self.add("max", view.layer, attn.amax(dim=(2, 3)).double().sum(0))

        def finish(self, layers, n_images, grid):
            return {"max_weight": np.stack([self.sums[("max", k)].numpy() for k in layers]) / n_images}

    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape").eval()
    assert "attention_measures" in timm_posgeom.__all__ and "AttentionResult" in timm_posgeom.__all__
    result = timm_posgeom.attention_measures(model, images, measures=[MaxWeight()], layers=[-1], progress=False)
    maps, _ = _captured(model, images, layers=[3])
    np.testing.assert_allclose(result.max_weight, maps[3].amax(dim=(2, 3)).double().mean(0)[None].numpy(), rtol=1e-6)
    assert result.layers == [3] and set(result.values) == {"max_weight"}


def test_unsupported_attention_is_refused_before_reading_data(one_thread):
    model = timm.create_model("beit_base_patch16_224", img_size=32, embed_dim=32, depth=1, num_heads=2).eval()

    def no_data():
        raise AssertionError("data read")
        yield

    with pytest.raises(UnsupportedModelError, match="Attention"):
        attention_measures(model, no_data(), progress=False)


def test_cli_writes_json_and_figure(tmp_path, one_thread):
    from timm_posgeom.cli.main import main

    out = tmp_path / "attn"
    rc = main(
        [
            "attention",
            "posgeom_vit_micro_patch8_64_rope",
            "--data",
            "synthetic",
            "--max-images",
            "4",
            "--batch-size",
            "2",
            "--rpi",
            "--alpha",
            "0.5",
            "--out",
            str(out),
            "--no-progress",
            "--device",
            "cpu",
            "--num-workers",
            "0",
        ]
    )
    assert rc == 0
    record = json.loads((out / "attention.json").read_text())
    assert record["metadata"]["n_images"] == 4 and record["metadata"]["rpi"] is True
    assert record["metadata"]["alpha"] == 0.5
    assert np.asarray(record["mean_distance"]).shape == (4, 4)
    assert (out / "attention.png").stat().st_size > 1000


LAUNCHED = textwrap.dedent("""
    import json
    import sys

    import timm
    import torch
    import torch.nn.functional as F

    import timm_posgeom  # noqa: F401
    from timm_posgeom.measuring import distributed
    from timm_posgeom.probes import attention_measures


    def measure():
        torch.manual_seed(0)
        model = timm.create_model("posgeom_vit_micro_patch8_64_rope", num_classes=0).eval()
        gen = torch.Generator().manual_seed(0)
        x = F.interpolate(torch.randn(9, 3, 4, 4, generator=gen), size=64, mode="bicubic", align_corners=False)
        out = {}
        # 9 images in batches of 4: process 0 gets batches 0 and 2 (5 images), process 1 batch 1 (4)
        out["rpi"] = attention_measures(model, x, rpi=True, seed=3, batch_size=4, progress=False).to_dict()
        # 3 images, one batch: process 1 has none and adds zeros
        out["few"] = attention_measures(model, x[:3], batch_size=4, progress=False).to_dict()
        out["world"] = distributed.world_size() if distributed.is_initialized() else 1
        return out


    if __name__ == "__main__":
        result = measure()
        with open(f"{sys.argv[1]}.{distributed.rank()}.json", "w") as f:
            json.dump(result, f)
""")


@pytest.mark.slow
@pytest.mark.xdist_group("launch")  # one launch at a time (ports, cores)
def test_two_launched_processes_equal_one(tmp_path):
    from conftest import accelerate_launch_argv, assert_json_close, launch_env, run_launched

    script = tmp_path / "measure.py"
    script.write_text(LAUNCHED)
    cmd = accelerate_launch_argv(str(script), str(tmp_path / "launched"))
    run = run_launched(cmd, env=launch_env(), timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    rank0 = json.loads((tmp_path / "launched.0.json").read_text())
    rank1 = json.loads((tmp_path / "launched.1.json").read_text())
    assert rank0 == rank1 and rank0.pop("world") == 2
    namespace: dict = {"__name__": "measure"}
    exec(compile(LAUNCHED, str(script), "exec"), namespace)
    single = json.loads(json.dumps(namespace["measure"]()))
    assert single.pop("world") == 1
    assert rank0["rpi"]["metadata"]["n_images"] == 9 and rank0["few"]["metadata"]["n_images"] == 3
    assert rank0["rpi"]["permutation"] == single["rpi"]["permutation"]
    assert_json_close(rank0, single, 1e-9)  # float64 sums added in another order


def test_token_and_attention_measures_in_one_pass(images, one_thread):
    """run_measures: a measure of the tokens at a probe site beside an attention measure, in one pass; the
    forward runs up to the last event any of them needs (the last block's output)."""
    from timm_posgeom.probes import Measure, run_measures
    from timm_posgeom.probes.attention_measures import AttentionEntropy

    class PatchNorm(Measure):
        source = "block_output"
        names = ("patch_norm",)

        def update(self, tokens, view):
            self.add("norm", view.layer, tokens[:, view.prefix :].double().norm(dim=-1).mean(-1).sum(0))

        def finish(self, layers, n_images, grid):
            return {"patch_norm": self.stacked("norm", layers, n_images)}

    torch.manual_seed(0)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape").eval()
    outputs = []
    hooks = [b.register_forward_hook(lambda m, a, out: outputs.append(out)) for b in model.blocks]
    with torch.no_grad():
        model(images)
    for h in hooks:
        h.remove()
    result = run_measures(model, images, [PatchNorm(), AttentionEntropy()], layers=[1, 3], batch_size=2, progress=False)
    want = np.array([outputs[k][:, 1:].double().norm(dim=-1).mean(-1).mean(0).item() for k in (1, 3)])
    np.testing.assert_allclose(result.patch_norm, want, rtol=1e-6)
    assert result.entropy.shape == (2, 4) and result.metadata["num_heads"] == 4
    assert type(result).__name__ == "MeasureResult" and "patch_norm" in json.loads(result.to_json())
