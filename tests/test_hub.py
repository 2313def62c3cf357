"""Model cards, export, offline Hub loading, push dry runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import timm
import torch
import yaml
from huggingface_hub import ModelCard

from timm_posgeom.app.hub import (
    HubExportError,
    export_for_hub,
    push_run,
    render_card,
    upload_plan,
    weights_sha1,
)
from timm_posgeom.app.records import RecordError, RunEval, RunSummary, SSDCSummary
from timm_posgeom.cli import main as cli_main


def _run_dir(tmp_path: Path, name: str = "posgeom_vit_micro_patch8_64_rope", with_eval: bool = True, **kwargs) -> Path:
    run = tmp_path / "run"
    model = timm.create_model(name, num_classes=10, **kwargs).eval()
    export_for_hub(model, run / "export")
    (run / "recipe.yaml").write_text(yaml.safe_dump({"model": name, "data": "clane9/imagenet-100", "epochs": 3}))
    sha1 = weights_sha1(run / "export" / "model.safetensors")
    RunSummary(
        model=name,
        steps=120,
        epochs=3.0,
        train_images=5120,
        val_images=640,
        processes=1,
        time_s=42.5,
        val_top1=0.6125,
        export_sha1=sha1,
    ).write(run / "summary.json")
    if with_eval:
        ssdc = SSDCSummary(
            n_images=64,
            per_layer=[0.5, 0.4, 0.3, 0.2],
            rise=-0.1,
            rpi_per_layer=[0.1, 0.25, 0.2, 0.2],
            rpi_delta=0.15,
            rpi_content_per_layer=[0.5, 0.4, 0.3, 0.2],
        )
        RunEval(clean_accuracy=0.6, fs={"jpeg:5": 0.3125, "blur:2.5:5": 0.1875}, ssdc=ssdc, weights_sha1=sha1).write(
            run / "eval.json"
        )
    return run


def test_card_renders_with_valid_metadata_and_only_recorded_numbers(tmp_path):
    run = _run_dir(tmp_path)
    text = render_card(run, repo_id="me/vit-micro-rope")
    card = ModelCard(text)
    data = card.data.to_dict()
    assert data["library_name"] == "timm" and data["license"] == "apache-2.0"
    assert {"positional-encoding", "pe-rope", "timm"} <= set(data["tags"])
    assert data["datasets"] == ["clane9/imagenet-100"]
    body = card.text
    assert body.index("import timm_posgeom") < body.index("## Training")  # the import comes first
    assert "hf-hub:me/vit-micro-rope" in body and "posgeom_vit_micro_patch8_64_rope" in body
    for number in ("0.6125", "0.3125", "0.1875", "0.150", "0.500, 0.400, 0.300, 0.200"):
        assert number in body, number
    assert "arXiv:2606.00124" in body


def test_card_reads_config_json_not_the_package(tmp_path):
    """The card's architecture rows come from config.json and the safetensors header (no model is built)."""
    run = _run_dir(tmp_path, name="posgeom_vit_micro_patch8_64_ape", alpha=0.5)
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10)
    body = ModelCard(render_card(run)).text
    assert f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M" in body and "alpha 0.5" in body
    assert "| width / depth / heads | 128 / 4 / 4 |" in body and "64 px, patch 8" in body
    config = json.loads((run / "export" / "config.json").read_text())
    del config["model_args"]["pe"]
    (run / "export" / "config.json").write_text(json.dumps(config))
    with pytest.raises(HubExportError, match="not an export of a timm-posgeom model"):
        render_card(run)


def test_card_refuses_a_summary_of_another_schema(tmp_path):
    run = _run_dir(tmp_path)
    (run / "summary.json").write_text(json.dumps({"steps": 120, "val_top1": 0.6125}))  # an old, untagged file
    with pytest.raises(RecordError, match="summary.json: not a timm-posgeom run-summary record"):
        render_card(run)


def test_card_without_eval_has_no_invented_results(tmp_path):
    run = _run_dir(tmp_path, name="posgeom_vit_micro_patch8_64_ape_rpt", with_eval=False)
    card = ModelCard(render_card(run))
    assert "random-permutation-training" in card.data.tags
    assert "fragility" not in card.text and "0.3125" not in card.text


def test_card_for_other_weights_does_not_show_the_eval_of_these(tmp_path):
    """`--weights export_ema` showed the study's measurements (made on export/) and the raw weights' table
    SSDC as the EMA weights'. eval.json now names the weights it measured (their SHA-1)."""
    from timm_posgeom.models.pretrained import weights_sha1

    run = _run_dir(tmp_path, name="posgeom_vit_micro_patch8_64_ape")
    summary = RunSummary.read(run / "summary.json")
    summary.pe_ssdc = 0.4321
    summary.write(run / "summary.json")
    torch.manual_seed(5)
    export_for_hub(timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10), run / "export_ema")
    evals = RunEval.read(run / "eval.json")
    evals.weights_sha1 = weights_sha1(run / "export" / "model.safetensors")
    evals.write(run / "eval.json")
    raw = ModelCard(render_card(run)).text
    assert "0.3125" in raw and "0.4321" in raw
    ema = ModelCard(render_card(run, weights="export_ema")).text
    assert "0.3125" not in ema and "0.4321" not in ema and "made on other weights than these" in ema
    evals.weights_sha1 = "0" * 40  # export/ re-exported since the eval: not shown for export either
    evals.write(run / "eval.json")
    assert "0.3125" not in ModelCard(render_card(run)).text


def test_card_names_the_release_that_trained_the_weights(tmp_path):
    """The card names the timm-posgeom release: the training's (its summary.json's versions), and this one's where
    it differs or was not recorded."""
    from timm_posgeom import __version__

    run = _run_dir(tmp_path)
    assert (
        f"| timm-posgeom | {__version__} (this card; the training's version was not recorded) |"
        in ModelCard(render_card(run)).text
    )
    summary = RunSummary.read(run / "summary.json")
    summary.versions = {"timm_posgeom": __version__, "timm": timm.__version__}
    summary.write(run / "summary.json")
    assert f"| timm-posgeom | {__version__} |" in ModelCard(render_card(run)).text
    summary.versions["timm_posgeom"] = "0.0.9"
    summary.write(run / "summary.json")
    assert f"| timm-posgeom | 0.0.9 (training); {__version__} (this card) |" in ModelCard(render_card(run)).text


def test_push_dry_run_lists_the_exact_files_and_sends_nothing(tmp_path, capsys, monkeypatch):
    run = _run_dir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert push_run(run, "me/model", dry_run=True) == ["config.json", "model.safetensors", "README.md"]
    assert upload_plan(run) == ["config.json", "model.safetensors", "README.md"]
    assert cli_main(["push", str(run), "--repo-id", "me/model", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would upload to me/model" in out and "model.safetensors" in out and ".bin" not in out
    assert not any(p.suffix in (".bin", ".pth", ".pt") for p in (run / "export").iterdir())


def test_push_without_weights_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(HubExportError, match="no exported weights"):
        push_run(tmp_path / "empty", "me/model", dry_run=True)
    with pytest.raises(HubExportError, match="ORG/NAME"):
        push_run(tmp_path / "empty", "model", dry_run=True)
    with pytest.raises(SystemExit):
        cli_main(["push", str(tmp_path / "empty"), "--repo-id", "me/model", "--dry-run"])


@pytest.mark.slow  # a subprocess that imports the application and meets no Hub
def test_push_without_network_is_one_line(tmp_path):
    """Issue 14, item 7: a push with no reachable Hub printed a connection traceback."""
    run = _run_dir(tmp_path)
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_TOKEN="hf_not_a_token", HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run(
        [sys.executable, "-m", "timm_posgeom.cli", "push", str(run), "--repo-id", "me/model"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "could not push to the Hub repo me/model" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_card_command_writes_a_file(tmp_path):
    run = _run_dir(tmp_path)
    assert cli_main(["card", str(run), "--repo-id", "me/m", "--out", str(tmp_path / "README.md")]) == 0
    assert ModelCard.load(tmp_path / "README.md").data.library_name == "timm"


def _to_local_hub_cache(export_dir: Path, repo_id: str, cache: Path) -> None:
    """Lay out an export in a Hugging Face Hub cache as a download would have left it."""
    commit = "1" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        (snapshot / f).write_bytes((export_dir / f).read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("posgeom_vit_micro_patch8_64_nope", {}),
        ("posgeom_vit_micro_patch8_64_ape", {"alpha": 0.5}),
        ("posgeom_vit_micro_patch8_64_sincos", {"alpha": 0.75}),
        ("posgeom_vit_micro_patch8_64_rope", {"alpha": 0.5}),
        ("posgeom_vit_micro_patch8_64_ape_rpt", {}),
        ("posgeom_vit_small_patch16_224_ape", {"num_heads": 8, "img_size": 64, "depth": 2}),  # the paper's heads
    ],
)
def test_export_to_hub_cache_and_load_offline_gives_identical_outputs(tmp_path, name, kwargs):
    model = timm.create_model(name, num_classes=10, **kwargs).eval()
    export_for_hub(model, tmp_path / "export")
    _to_local_hub_cache(tmp_path / "export", "posgeom-test/model", tmp_path / "cache")
    size = model.patch_embed.img_size
    x = torch.randn(2, 3, *size)
    torch.save({"x": x, "y": model(x)}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import torch, timm, timm_posgeom
        io = torch.load({str(tmp_path / "io.pt")!r})
        m = timm.create_model("hf-hub:posgeom-test/model", pretrained=True).eval()
        assert (m.pe, m.alpha, m.token_shuffle) == {(model.pe, model.alpha, model.token_shuffle)!r}
        assert m.blocks[0].attn.num_heads == {model.blocks[0].attn.num_heads} and len(m.blocks) == {len(model.blocks)}
        torch.testing.assert_close(m(io["x"]), io["y"], rtol=0, atol=0)
        print("ok")
    """)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "home"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_without_the_plugin_timm_names_the_unknown_architecture(tmp_path):
    """What a user sees when they forget `import timm_posgeom` (the card says to import it)."""
    model = timm.create_model("posgeom_vit_micro_patch8_64_ape", num_classes=10)
    export_for_hub(model, tmp_path / "export")
    script = f"import timm; timm.create_model('local-dir:{tmp_path / 'export'}', pretrained=True)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode != 0 and "Unknown model (posgeom_vit_micro_patch8_64_ape)" in out.stderr
