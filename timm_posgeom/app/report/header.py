"""The top of a study's report (:mod:`.report`): its title (what the study varied: grid, width, depth, init),
the paragraph under it, the table of what the study varied, and the versions line the provenance repeats."""

from __future__ import annotations

from typing import Any

from ..provenance import describe_versions
from ..records import StudyResults, StudyRun
from .claims import LABELS
from .runs import by_condition

__all__ = ["report_header", "report_intro", "versions_text"]

_NA = "not recorded"


def versions_text(results: StudyResults) -> str:
    """The versions every run was trained and measured with (summary.json, eval.json), against this
    results.json's invocation; runs recorded before per-run versions were kept are named as such."""

    def sets(run: StudyRun) -> list[dict[str, str] | None]:  # None: a part measured before versions were kept
        return [run.train.versions, *(run.eval.versions if run.eval.versions is not None else [None])]

    return describe_versions(
        results.versions,
        [(f"{r.condition} s{r.seed}", sets(r)) for r in results.runs],
        label="the study's last invocation",
    )


def _architecture(recipe: dict[str, Any]) -> dict[str, Any]:
    """Width, depth, heads, patch and grid of a recipe's model, read off the model built on the meta device
    (no weights, no memory); what the recipe itself says when the model cannot be built that way."""
    kwargs = dict(recipe.get("model_kwargs") or {})
    if recipe.get("img_size"):
        kwargs["img_size"] = recipe["img_size"]
    out: dict[str, Any] = {
        "width": kwargs.get("embed_dim"),
        "depth": kwargs.get("depth"),
        "heads": kwargs.get("num_heads"),
        "img_size": recipe.get("img_size"),
    }
    try:
        import timm
        import torch

        from ... import models  # noqa: F401  (registers the package's models with timm)

        with torch.device("meta"):
            model: Any = timm.create_model(recipe["model"], **kwargs)  # a timm ViT, read by timm's attribute names
        grid = tuple(model.patch_embed.grid_size)
        out.update(
            width=model.embed_dim,
            depth=len(model.blocks),
            heads=model.blocks[0].attn.num_heads,
            patch=tuple(model.patch_embed.patch_size),
            grid=grid,
        )
    except (AttributeError, KeyError, RuntimeError, TypeError, ValueError, NotImplementedError):
        pass  # not a ViT timm can build here: the recipe's values (or "not recorded") stand
    return out


def _one_or_each(values: dict[str, Any], fmt=str) -> str:
    """One value when every condition shares it, else each condition's."""
    distinct = {fmt(v) for v in values.values()}
    if len(distinct) == 1:
        return distinct.pop()
    return "; ".join(f"{LABELS.get(c, c)} {fmt(v)}" for c, v in values.items())


def _grid_text(arch: dict[str, Any]) -> str:
    grid = arch.get("grid")
    if not grid:
        return "not recorded"
    size = f"{arch['img_size']} px, " if arch.get("img_size") else ""
    patch = f"patch {arch['patch'][0]}" if arch.get("patch") else ""
    return f"{grid[0]} x {grid[1]} ({size}{patch})"


def _model_values(recipes: dict[str, dict[str, Any]], archs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """What the header says of the models, each one value or each condition's ("not recorded" when no recipe
    gave an architecture): width, depth, heads, grid (long and short), epochs, batch size, model name."""
    if not archs:
        return dict.fromkeys(("width", "depth", "heads", "grid", "short_grid", "epochs", "batch", "models"), _NA)
    na = _NA
    return {
        "width": _one_or_each({c: a.get("width") or na for c, a in archs.items()}),
        "depth": _one_or_each({c: a.get("depth") or na for c, a in archs.items()}),
        "heads": _one_or_each({c: a.get("heads") or na for c, a in archs.items()}),
        "grid": _one_or_each({c: _grid_text(a) for c, a in archs.items()}),
        "short_grid": _one_or_each(
            {c: "x".join(map(str, a["grid"])) if a.get("grid") else na for c, a in archs.items()}
        ),
        "epochs": _one_or_each({c: r.get("epochs", na) for c, r in recipes.items() if r}),
        "batch": _one_or_each({c: r.get("batch_size", na) for c, r in recipes.items() if r}),
        "models": _one_or_each({c: f"`{r.get('model', na)}`" for c, r in recipes.items() if r}),
    }


def _title(cfg: dict[str, Any], v: dict[str, str], init: str) -> str:
    """The report's title: what the study varied (grid, width, depth, init) where recorded, and the preset."""
    known = [
        part
        for part, value in (
            (f"{v['short_grid']} grid", v["short_grid"]),
            (f"width {v['width']}", v["width"]),
            (f"depth {v['depth']}", v["depth"]),
            (f"{init} init", init),
        )
        if value != _NA
    ]
    return (
        f"PE geometry study: {', '.join(known)} (preset `{cfg['preset']}`)"
        if known
        else f"PE geometry study: preset `{cfg['preset']}`"
    )


def _varied_rows(
    results: StudyResults, by: dict[str, list[StudyRun]], v: dict[str, str], init: str
) -> list[tuple[str, str]]:
    """(what, value) rows of the table under the title: preset, conditions, model, init, width / depth / heads,
    grid, overrides, seeds, training, data identity, what was measured."""
    cfg = results.config
    na = _NA
    overrides = cfg.get("train_overrides") or []
    seeds_run = "; ".join(f"{LABELS.get(c, c)} {', '.join(str(r.seed) for r in runs)}" for c, runs in by.items())
    data = results.eval_data or {}
    identity = data.get("identity") or {}
    ident = ", ".join(f"{k} `{identity[k]}`" for k in ("labels", "pixels") if identity.get(k))
    alphas = cfg.get("alphas")
    return [
        (
            "preset",
            f"`{cfg['preset']}`"
            + (f" (recipes `{cfg['recipe_prefix']}_<condition>`)" if cfg.get("recipe_prefix") else ""),
        ),
        ("conditions", ", ".join(LABELS.get(c, c) for c in cfg.get("conditions", by))),
        ("model", v["models"]),
        ("initialisation", f"{init}" + (" (`--init`, every run)" if cfg.get("init") else " (each recipe's own)")),
        ("width / depth / heads", f"{v['width']} / {v['depth']} / {v['heads']}"),
        ("grid", v["grid"]),
        ("overrides", ", ".join(f"`{o}`" for o in overrides) if overrides else "none (the preset's recipes)"),
        ("seeds", f"{cfg.get('seeds', na)} per condition; measured: {seeds_run}"),
        ("training", f"{v['epochs']} epochs, batch {v['batch']}"),
        (
            "data",
            f"`{data.get('source', na)}`, {data.get('split', na)} split, {data.get('images', na)} images, "
            f"{data.get('classes', na)} classes" + (f"; identity: {ident}" if ident else ""),
        ),
        (
            "measured",
            f"fragility under {', '.join(cfg.get('shifts') or []) or 'no shift'}; SSDC on "
            f"{cfg.get('probe_images')} images (normal and under RPI)"
            + (f"; alpha sweep at {', '.join(f'{a:g}' for a in sorted(alphas))}" if alphas else ""),
        ),
    ]


def report_header(results: StudyResults) -> tuple[str, list[str]]:
    """The report's title (what the study varied: grid, width, depth, init) and the table under it: preset,
    init, model, width, depth, grid, overrides, seeds, training, data identity, what was measured."""
    cfg = results.config
    by = by_condition(results)
    recipes = {c: results.recipes.get(c) or {} for c in cfg.get("conditions", by)}
    archs = {c: _architecture(r) for c, r in recipes.items() if r}
    inits = {c: (r.get("model_kwargs") or {}).get("init", "timm") for c, r in recipes.items() if r}
    init = cfg.get("init") or _one_or_each(inits) if inits else cfg.get("init") or "not recorded"
    values = _model_values(recipes, archs)
    rows = _varied_rows(results, by, values, init)
    table = ["## What this study varied", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return _title(cfg, values, init), table


def report_intro(results: StudyResults, title: str) -> list[str]:
    """The title and the paragraph under it: data, conditions, seeds, images probed, state, time, versions."""
    cfg = results.config
    probed = sorted({r.eval.ssdc.n_images for r in results.runs if r.eval.ssdc is not None})
    probed_text = "no" if not probed else f"{probed[0]}" if len(probed) == 1 else f"{probed[0]}-{probed[-1]}"
    return [
        f"# {title}",
        "",
        f"Data: `{results.eval_data['source']}` ({results.eval_data['split']}, "
        f"{results.eval_data['images']} images); conditions {', '.join(cfg['conditions'])}; "
        f"{cfg['seeds']} seed(s); SSDC on {probed_text} images; "
        f"{'complete' if results.complete else 'INCOMPLETE (resume with --resume)'}; "
        f"{results.elapsed_s:.0f} s (all invocations). Versions: {versions_text(results)}.",
        "",
        "The paper's numbers are ViT-S/16 on ImageNet-100 at 224 px (docs/method.md in the timm-posgeom repository); this run's scale "
        "may differ, so compare orderings and shapes rather than values.",
        "",
    ]
