"""Model cards, export and push of trained variants in timm's Hugging Face Hub format.

A run directory (what ``posgeom train`` writes) holds ``export/`` (``config.json`` +
``model.safetensors``, timm's Hub layout), ``recipe.yaml`` and ``summary.json``; a study adds
``eval.json`` (clean accuracy, fragility scores, SSDC) and figures. Cards are rendered from those
files only: a number that no run recorded never appears on a card.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import PosgeomError
from ..models.pretrained import weights_sha1
from ..results.jsonio import replacing, write_errors
from .records import RunEval, RunSummary
from .rundir import RunFileError, check_fields, read_json_file

__all__ = [
    "render_card",
    "push_run",
    "upload_plan",
    "export_for_hub",
    "architecture_args",
    "HubExportError",
    "check_safetensors",
    "card_template",
]

UPLOAD_FILES = ("config.json", "model.safetensors", "README.md")

_PE_TEXT = {
    "none": (
        "no positional encoding",
        "the patch tokens carry no position information, so the model is "
        "equivariant to permutations of its patch tokens; any spatial structure it builds comes from content.",
    ),
    "ape": (
        "a learned absolute position table",
        "one learned vector per token index (class-token row "
        "included, as in the paper) is added after the patch embedding.",
    ),
    "sincos": (
        "a fixed 2-D sine-cosine table",
        "a fixed table of sines and cosines of the row and column "
        "index is added to the patch tokens; it is rebuilt (not interpolated) for other grids.",
    ),
    "rope": (
        "2-D axial rotary position embedding (RoPE)",
        "queries and keys of the patch tokens are rotated "
        "by angles proportional to their row and column index (base 10000); prefix tokens are not rotated.",
    ),
}


def card_template() -> Path:
    """The model-card template shipped in the package (``timm_posgeom.hub_cards/model_card.md``)."""
    from importlib.resources import files

    from .recipe import packaged_path

    return packaged_path(files("timm_posgeom.hub_cards") / "model_card.md")


class HubExportError(PosgeomError, ValueError):
    """A run directory that cannot be carded or pushed (missing weights, config or records)."""


def architecture_args(model) -> dict[str, Any]:
    """Every argument that defines a ``PosGeomViT``'s architecture and PE, for config.json's ``model_args``.

    timm records only the kwargs given to ``create_model``; this adds what the registered name
    implies (PE type, alpha, token shuffle, width, depth, heads, patch and image size), so a config
    rebuilds the exact model even if a registered default changes later. ``init`` (``timm`` or
    ``paper``) is recorded too: loaded weights do not depend on it, but a config says how the run began.
    ``layout`` (``timm`` or ``paper``) must be: the two layouts hold different parameters.
    """
    from ..models import PosGeomViT

    if not isinstance(model, PosGeomViT):
        return {}
    patch, img = model.patch_embed.patch_size, model.patch_embed.img_size
    blocks: Any = model.blocks  # timm's blocks, read by timm's attribute names
    return dict(
        pe=model.pe,
        alpha=model.alpha,
        token_shuffle=model.token_shuffle,
        embed_dim=model.embed_dim,
        depth=len(model.blocks),
        num_heads=blocks[0].attn.num_heads,
        patch_size=int(patch[0]) if patch[0] == patch[1] else list(patch),
        img_size=int(img[0]) if img[0] == img[1] else list(img),
        num_classes=model.num_classes,
        global_pool=model.global_pool,
        init=getattr(model, "init", "timm"),
        layout=getattr(model, "layout", "timm"),
    )


def export_for_hub(
    model,
    directory: str | os.PathLike,
    model_args: dict[str, Any] | None = None,
    pretrained_cfg: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` in timm's Hub layout (config.json + model.safetensors, no pickle) into
    ``directory``, atomically: a temporary folder renamed into place, so a kill never leaves a
    half-written export. ``model_args`` extend :func:`architecture_args`."""
    from timm.models import save_for_hf

    directory = Path(directory)
    if pretrained_cfg:
        model.pretrained_cfg = dict(getattr(model, "pretrained_cfg", {}) or {}, **pretrained_cfg)
    args = dict(architecture_args(model), **(model_args or {}))
    with replacing(directory) as tmp, write_errors(directory):  # a full disk: one line
        save_for_hf(model, str(tmp), model_args=args, safe_serialization=True)
    return directory


def _weights_dir(run_dir: Path, weights: str) -> Path:
    d = run_dir / weights
    if not (d / "model.safetensors").is_file() or not (d / "config.json").is_file():
        raise HubExportError(
            f"{run_dir} has no exported weights: expected {d}/config.json and {d}/model.safetensors "
            "(written by `posgeom train` at the end of a run; an interrupted run resumes with --resume; a "
            f"committed run's weights live outside git: `posgeom weights restore {run_dir}`)"
        )
    return d


_EXPORT_HINT = "export the run again (posgeom train writes it at the end of a run)"


def _read_json(path: Path) -> dict[str, Any]:
    """An export's ``config.json`` (``{}`` when absent); RunFileError in one line when it is damaged, or its
    ``model_args`` or ``pretrained_cfg`` is not a mapping."""
    if not path.is_file():
        return {}
    config = read_json_file(path, _EXPORT_HINT)
    check_fields(path, config, {"architecture": str, "model_args": dict, "pretrained_cfg": dict}, _EXPORT_HINT)
    return config


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def _results_rows(summary: RunSummary | None, evals: RunEval | None, sha1: str) -> list[tuple[str, str]]:
    """(what, value) rows of the card's results table: only numbers whose record names, by SHA-1, the weights
    the card is for (their file hashes to ``sha1``). The study's measurements (``eval.json``: ``weights_sha1``),
    the training's validation top-1 and the position table's SSDC (``summary.json``: ``export_sha1``) and the
    EMA weights' top-1 (``export_ema_sha1``); a record without the hash (written before it was kept) or with
    another is not shown, and a row says so."""
    rows = []
    if evals is not None and evals.weights_sha1 != sha1:
        rows.append(
            (
                "robustness eval (eval.json)",
                "made on other weights than these: not shown"
                if evals.weights_sha1 is not None
                else "recorded without the weights' hash: not shown",
            )
        )
        evals = None
    raw = ema = False
    if summary is not None:
        raw, ema = summary.export_sha1 == sha1, summary.export_ema_sha1 == sha1
        recorded = any(v is not None for v in (summary.val_top1, summary.ema_val_top1, summary.pe_ssdc))
        if recorded and not (raw or ema):
            hashed = summary.export_sha1 is not None or summary.export_ema_sha1 is not None
            rows.append(
                (
                    "training results (summary.json)",
                    "measured on other weights than these: not shown"
                    if hashed
                    else "recorded without the weights' hash: not shown",
                )
            )
        if raw and summary.val_top1 is not None:
            rows.append(("validation top-1 (training run)", _fmt(summary.val_top1)))
        if ema and summary.ema_val_top1 is not None:
            rows.append(("validation top-1, EMA weights", _fmt(summary.ema_val_top1)))
    if evals is not None and evals.clean_accuracy is not None:
        rows.append(("clean accuracy (robustness eval)", _fmt(evals.clean_accuracy)))
    for shift, fs in ((evals.fs if evals is not None else None) or {}).items():
        rows.append((f"fragility score FS, {shift}", _fmt(fs)))
    ssdc = evals.ssdc if evals is not None else None
    if ssdc is not None:
        rows.append(("SSDC per layer", ", ".join(_fmt3(v) for v in ssdc.per_layer)))
        rows.append(("SSDC per layer under RPI", ", ".join(_fmt3(v) for v in ssdc.rpi_per_layer)))
        if ssdc.rpi_delta is not None:
            rows.append(("delta SSDC under RPI (layer 1 - layer 0)", _fmt(ssdc.rpi_delta)))
    if raw and summary is not None and summary.pe_ssdc is not None:
        rows.append(("SSDC of the learned position table", _fmt(summary.pe_ssdc)))
    return rows


def check_safetensors(path: str | os.PathLike) -> None:
    """Refuse a ``model.safetensors`` that is not one whole safetensors file (truncated, empty, foreign):
    :class:`HubExportError` in one line. Its header (8-byte length, JSON) must parse and the file must be as
    long as the header's last tensor says; no tensor is read."""
    path = Path(path)
    size = path.stat().st_size
    why = None
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n <= 0 or 8 + n > size:
                why = "no safetensors header"
            else:
                header = json.loads(f.read(n))
                ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
                if 8 + n + max(ends, default=0) != size:
                    why = f"{size:,} bytes where its header needs {8 + n + max(ends, default=0):,}"
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:  # not JSON, not the layout
        why = f"an unreadable header ({type(e).__name__})"
    if why is not None:
        raise HubExportError(
            f"{path} is not a whole safetensors file ({why}): truncated or damaged; export the "
            "run again (posgeom train writes it at the end of a run)"
        )


def _fmt3(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _recipe_text(path: Path) -> str:
    """The run's recipe as the card shows it; a recipe that is not text is said in one line."""
    if not path.is_file():
        return "(no recipe recorded)"
    try:
        return path.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise RunFileError(
            f"{path} is not text (damaged?): restore the run's recipe, or remove it (the card then says no "
            "recipe was recorded)"
        ) from None


def _recipe_data(path: Path) -> str | None:
    """The recipe's ``data`` entry (a Hub id or a path), or None."""
    import yaml

    if not path.is_file():
        return None
    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError):  # shown as it is in the card (_recipe_text), its data unnamed
        return None
    data = recipe.get("data") if isinstance(recipe, dict) else None
    return data if isinstance(data, str) else None


_CARD_ARGS = (
    "pe",
    "alpha",
    "token_shuffle",
    "embed_dim",
    "depth",
    "num_heads",
    "img_size",
    "patch_size",
    "num_classes",
    "init",
)
# card args an export may lack: exports made before the argument existed, with its value then
_CARD_ARG_DEFAULTS = {"init": "timm", "layout": "timm"}

_INIT_TEXT = {
    "timm": "",
    "paper": (
        " Initialised as in the paper's code: PyTorch's defaults (Linear and Conv weights and biases "
        "U(+-1/sqrt(fan_in)), position table and class token N(0, 1), LayerNorm 1 / 0)."
    ),
}


_LAYOUT_TEXT = {
    "timm": "",
    "paper": (
        " Layers as in the paper's code: no final LayerNorm (the class token goes straight to the linear "
        "head), dropout only on the embedding, inside attention and after the MLP's GELU."
    ),
}


def _card_args(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The architecture arguments a card shows, from config.json's ``model_args`` (written by
    :func:`export_for_hub` for every timm-posgeom model); a clear error for any other export."""
    args = dict(_CARD_ARG_DEFAULTS, **(config.get("model_args") or {}))
    missing = [k for k in _CARD_ARGS if k not in args]
    if (
        missing
        or not all(isinstance(args.get(k), str) for k in ("pe", "init", "layout"))  # hashable, to look up
        or args.get("pe") not in _PE_TEXT
        or args.get("init") not in _INIT_TEXT
        or args.get("layout") not in _LAYOUT_TEXT
    ):
        raise HubExportError(
            f"{path}: model_args lacks {', '.join(missing) or 'a known pe or init'}: not an export of a "
            "timm-posgeom model (posgeom train writes them)"
        )
    return args


def _side(size: Any) -> Any:
    """One number for a square size (``224`` or ``[224, 224]``), else the pair."""
    return size[0] if isinstance(size, (list, tuple)) and len(set(size)) == 1 else size


def _num_params(path: Path) -> int:
    """Parameter count of a safetensors file, from its header (no tensor is read)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def _made_with(trained: RunSummary | None) -> str:
    """The card's "timm-posgeom" row: the release that trained the weights (the run's recorded versions), and
    the one rendering the card where it differs or the training's was not recorded."""
    from ..version import __version__

    ran = (trained.versions or {}).get("timm_posgeom") if trained is not None else None
    if ran is None:
        return f"{__version__} (this card; the training's version was not recorded)"
    return ran if ran == __version__ else f"{ran} (training); {__version__} (this card)"


def render_card(run_dir: str | os.PathLike, repo_id: str = "ORG/NAME", weights: str = "export") -> str:
    """Render the model card (README.md text) of a run from its recorded files.

    Raises :class:`HubExportError` when the run has no exported weights.
    """
    from huggingface_hub import ModelCard

    run = Path(run_dir)
    wdir = _weights_dir(run, weights)
    check_safetensors(wdir / "model.safetensors")
    sha1 = weights_sha1(wdir / "model.safetensors")
    config = _read_json(wdir / "config.json")
    summary = RunSummary.read(run / "summary.json") if (run / "summary.json").is_file() else None
    evals = RunEval.read(run / "eval.json") if (run / "eval.json").is_file() else None
    recipe_text = _recipe_text(run / "recipe.yaml")
    arch = config.get("architecture", "unknown")
    args = _card_args(wdir / "config.json", config)
    pe, token_shuffle = args["pe"], args["token_shuffle"]
    dataset = _recipe_data(run / "recipe.yaml")
    card_data = _card_data(args, dataset)
    pe_title, pe_description = _pe_text(args)
    figures = sorted(p.name for p in run.glob("*.png"))
    # the training's own numbers (steps, epochs, time) describe these weights only if the run exported them
    trained = summary if summary is not None and sha1 in (summary.export_sha1, summary.export_ema_sha1) else None
    card = ModelCard.from_template(
        card_data,
        template_path=str(card_template()),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        architecture=arch,
        pe=pe,
        pe_title=pe_title,
        pe_description=pe_description,
        alpha=args["alpha"],
        token_shuffle=token_shuffle,
        init=args["init"],
        embed_dim=args["embed_dim"],
        depth=args["depth"],
        num_heads=args["num_heads"],
        img_size=_side(args["img_size"]),
        patch_size=_side(args["patch_size"]),
        num_classes=args["num_classes"],
        num_params=f"{_num_params(wdir / 'model.safetensors') / 1e6:.2f}M",
        dataset=dataset,
        steps=trained.steps if trained else "?",
        epochs=_fmt(trained.epochs) if trained else "?",
        time_s=trained.time_s if trained else "?",
        processes=trained.processes if trained else "?",
        recipe_yaml=recipe_text,
        figures=figures,
        results=_results_rows(summary, evals, sha1),
        posgeom_version=_made_with(trained),
    )
    return str(card)


def _card_data(args: dict[str, Any], dataset: str | None) -> Any:
    """The card's metadata (``huggingface_hub.ModelCardData``): library, license, tags (the PE, RPT, a
    non-timm init or layout) and the dataset when it is a Hub id."""
    from huggingface_hub import ModelCardData

    tags = [
        "image-classification",
        "timm",
        "timm-posgeom",
        "vision-transformer",
        "positional-encoding",
        f"pe-{args['pe']}",
    ]
    if args["token_shuffle"] == "train":
        tags.append("random-permutation-training")
    for key in ("init", "layout"):
        if args[key] != "timm":
            tags.append(f"{key}-{args[key]}")
    return ModelCardData(
        library_name="timm",
        license="apache-2.0",
        tags=tags,
        pipeline_tag="image-classification",
        # a Hub dataset id (ORG/NAME) goes into the metadata; local paths do not
        datasets=[dataset] if dataset and "/" in dataset and not dataset.startswith((".", "/", "~")) else None,
        metrics=["accuracy"],
    )


def _pe_text(args: dict[str, Any]) -> tuple[str, str]:
    """The card's PE title and description: the PE, RPT when trained with it, then the init and layout."""
    pe_title, pe_description = _PE_TEXT[args["pe"]]
    if args["token_shuffle"] == "train":
        pe_title += ", trained with random token permutation (RPT)"
        pe_description += " During training the patch tokens were randomly permuted before the PE at every step."
    pe_description += _INIT_TEXT[args["init"]] + _LAYOUT_TEXT[args["layout"]]
    return pe_title, pe_description


def upload_plan(run_dir: str | os.PathLike, weights: str = "export") -> list[str]:
    """The exact files a push uploads: config.json, model.safetensors (never pickle weights), README.md."""
    check_safetensors(_weights_dir(Path(run_dir), weights) / "model.safetensors")
    return list(UPLOAD_FILES)


def push_run(
    run_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    dry_run: bool = False,
    weights: str = "export",
    token: str | None = None,
) -> list[str]:
    """Upload a run's weights and its rendered card to ``repo_id`` on the Hub.

    Returns the uploaded file names. With ``dry_run`` nothing is sent: the staged files are
    checked and their names returned.
    """
    if "/" not in repo_id:
        raise HubExportError(f"repo_id must look like ORG/NAME, got {repo_id!r}")
    run = Path(run_dir)
    wdir = _weights_dir(run, weights)
    card = render_card(run, repo_id=repo_id, weights=weights)
    files = upload_plan(run, weights)
    if dry_run:
        return files
    from huggingface_hub import HfApi

    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        shutil.copy2(wdir / "config.json", stage / "config.json")
        shutil.copy2(wdir / "model.safetensors", stage / "model.safetensors")
        (stage / "README.md").write_text(card)
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            api.upload_folder(repo_id=repo_id, folder_path=str(stage), commit_message="Add timm-posgeom model")
        except Exception as e:  # network, auth and Hub errors differ across huggingface_hub versions: one line
            raise HubExportError(
                f"could not push to the Hub repo {repo_id}: {type(e).__name__}: {e} "
                "(nothing or only part was uploaded; check the network and `hf auth login`, "
                "then push again)"
            ) from e
    return files
