"""The report's table of fragility with the shifts at a fixed size (``eval.json``'s ``fragility_at_size``), beside
the model-input numbers of the accuracy table (docs/method.md#fragility-score-and-shifts)."""

from __future__ import annotations

from ..records import StudyResults
from .claims import LABELS
from .runs import by_condition
from .verdicts import spread

__all__ = ["fragility_at_size_lines"]


def fragility_at_size_lines(results: StudyResults) -> list[str]:
    """Per condition, FS of each shift at the model's input and at the study's ``shift_size`` (mean ± std [95%
    interval] over seeds); [] when no run measured it."""
    sizes = sorted({r.eval.fragility_at_size.shift_size for r in results.runs if r.eval.fragility_at_size})
    if not sizes:
        return []
    shifts = list(
        dict.fromkeys(s for r in results.runs if r.eval.fragility_at_size for s in r.eval.fragility_at_size.fs)
    )
    inputs = sorted(
        {int(x) for r in results.runs for x in [(results.recipes.get(r.condition) or {}).get("img_size")] if x}
    )
    at = " / ".join(f"{s} px" for s in sizes)
    size_text = " / ".join(f"{s} px" for s in inputs) or "the model's input"
    lines = [
        "",
        f"Fragility with each shift applied at {at}, before the resize to the model's input ({size_text}), "
        "beside the same shift applied at the model's input (the table above; docs/method.md). "
        "Clean top-1 is the same images through the same two resizes, unshifted.",
        "",
        "| condition | clean top-1 (at "
        + at
        + ") | "
        + " | ".join(f"{s} FS at {size_text} | {s} FS at {at}" for s in shifts)
        + " |",
        "|---|---|" + "---|---|" * len(shifts),
    ]
    for c, runs in by_condition(results).items():
        sized = [r.eval.fragility_at_size for r in runs]
        cells = [spread([f.clean_accuracy if f else None for f in sized]).text()]
        for s in shifts:
            cells.append(spread([(r.eval.fs or {}).get(s) for r in runs]).text())
            cells.append(spread([f.fs.get(s) if f else None for f in sized]).text())
        lines.append(f"| {LABELS.get(c, c)} | " + " | ".join(cells) + " |")
    return lines
