"""The paper's five claims on each committed study, under today's verdict rule and the one before it (issue 39).

    python scripts/verdicts.py                       # every experiments/scaling/*/results.json
    python scripts/verdicts.py experiments/scaling/8x8-paper "8x8 timm=experiments/scaling/8x8-timm"
    python scripts/verdicts.py --evidence experiments/scaling/8x8-paper

Each argument is ``STUDY_DIR`` or ``LABEL=STUDY_DIR`` (a ``posgeom study`` output with ``results.json``; the
label defaults to the directory's name). Prints two markdown tables:

1. the current verdicts (rule 2026-12, docs/method.md#verdicts) per study and claim, with each study's seeds
   per condition;
2. side by side, per study and claim, the verdict under rule 2026-11 (each part at its own 95% interval,
   Welch-Satterthwaite degrees of freedom, a one-seed point value decides, claim 1 against a 0.1 threshold,
   "early" as first half against the rest), under 2026-11 with each of the five changes alone (Holm, df =
   seeds - 1, one seed never decides, claim 1 against the untrained start, "early" as the rise over block 1
   against the rest), and under 2026-12 (all five): which change moved which verdict.

With ``--evidence`` it prints, per study and claim, the evidence under both rules (what each report's claims
table shows). A verdict reads "held", "not held", "within noise", "one seed" (one seed: not decided),
"near chance", "undecided" (another reason, e.g. a NaN) or "-" (not measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from timm_posgeom.app.records import RecordError, StudyResults
from timm_posgeom.app.report.claims import CLAIMS, LABELS, evaluate_claims
from timm_posgeom.app.report.verdicts import RULES

ROOT = Path(__file__).resolve().parents[1]
SHORT = (
    "1. no PE builds, collapses under RPI",
    "2. PE keeps; APE/sincos early, RoPE accumulates",
    "3. RPT like no PE",
    "4. PE less fragile, RoPE least",
    "5. alpha down: delta falls, FS rises",
)
OLD, NEW = RULES["2026-11"], RULES["2026-12"]
# each change of issue 39 alone, on top of rule 2026-11
CHANGES = {
    "Holm": dataclasses.replace(OLD, name="holm", holm=True),
    "df = seeds - 1": dataclasses.replace(OLD, name="df", df="seeds"),
    "one seed never decides": dataclasses.replace(OLD, name="one-seed", one_seed_decides=False),
    "claim 1 vs untrained": dataclasses.replace(OLD, name="builds", builds="untrained"),
    "early = rise over block 1": dataclasses.replace(OLD, name="early", early="rise"),
}


def word(claim: dict) -> str:
    """A verdict in a word or two (see the module's docstring)."""
    status, reason = claim["status"], claim["reason"]
    if status in ("held", "not held"):
        return status
    if status == "not measured":
        return "-"
    for prefix, short in (("one seed", "one seed"), ("near chance", "near chance"), ("within noise", "within noise")):
        if reason.startswith(prefix):
            return short
    return "undecided"


def load(spec: str) -> tuple[str, StudyResults]:
    label, sep, where = spec.partition("=")
    if not sep:
        label, where = Path(spec).name, spec
    path = Path(where) / "results.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no results (a `posgeom study` output directory is expected)")
    try:
        return label, StudyResults.read(path)
    except RecordError as e:  # damaged or edited by hand: one line, exit 2, as the posgeom commands say it
        print(
            f"verdicts.py: error: {e} (restore it, or run `posgeom study ... --resume` to write it again)",
            file=sys.stderr,
        )
        raise SystemExit(2) from None


def seeds_text(results: StudyResults) -> str:
    counts: dict[str, int] = {}
    for run in results.runs:
        counts[run.condition] = counts.get(run.condition, 0) + 1
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values()))} ({', '.join(LABELS.get(c, c) for c in counts)})"
    return ", ".join(f"{LABELS.get(c, c)} {n}" for c, n in counts.items())


def current_table(studies: list[tuple[str, StudyResults]]) -> list[str]:
    rows = ["| study | seeds per condition | " + " | ".join(SHORT) + " |", "|---|---|" + "---|" * len(SHORT)]
    for label, results in studies:
        words = [word(c) for c in evaluate_claims(results, NEW)]
        rows.append(f"| {label} | {seeds_text(results)} | " + " | ".join(words) + " |")
    return rows


def side_by_side(studies: list[tuple[str, StudyResults]]) -> list[str]:
    """Per study and claim (claims no rule can measure left out): 2026-11, each change alone, 2026-12."""
    head = ["rule 2026-11", *(f"+ {name} alone" for name in CHANGES), "rule 2026-12"]
    rows = ["| study | claim | " + " | ".join(head) + " |", "|---|---|" + "---|" * len(head)]
    for label, results in studies:
        columns = [[word(c) for c in evaluate_claims(results, rule)] for rule in (OLD, *CHANGES.values(), NEW)]
        for i, short in enumerate(SHORT):
            cells = [col[i] for col in columns]
            if set(cells) == {"-"}:
                continue
            marked = [cells[0]] + [f"**{c}**" if c != cells[0] else c for c in cells[1:]]
            rows.append(f"| {label} | {short} | " + " | ".join(marked) + " |")
    return rows


def evidence(studies: list[tuple[str, StudyResults]]) -> list[str]:
    lines = []
    for label, results in studies:
        old, new = evaluate_claims(results, OLD), evaluate_claims(results, NEW)
        lines.append(f"### {label}")
        for (claim, _, _), o, n in zip(CLAIMS, old, new):
            lines += [
                "",
                f"**{claim}**",
                "",
                f"- 2026-11: {word(o)}. {o['evidence']}",
                f"- 2026-12: {n['reason'] or word(n)}. {n['evidence']}",
            ]
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "studies", nargs="*", help="STUDY_DIR or LABEL=STUDY_DIR (default: every committed experiments/scaling study)"
    )
    parser.add_argument("--evidence", action="store_true", help="print each claim's evidence under both rules")
    args = parser.parse_args(argv)
    specs = args.studies or [str(p.parent) for p in sorted((ROOT / "experiments" / "scaling").glob("*/results.json"))]
    studies = [load(s) for s in specs]
    if args.evidence:
        print("\n".join(evidence(studies)))
        return 0
    print("\n".join(current_table(studies) + [""] + side_by_side(studies)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
