"""Hand-built study results that several test files use (a test file never imports another's helpers):

* :func:`paper_like` / :func:`paper_seeds`, wrapped by :func:`results_of`: a study where each of the paper's claims
  holds clearly, from runs made by :func:`claims_run` (tests/test_claims.py, tests/test_verdicts_script.py);
* :func:`one_run_study`: one APE run with every record filled (tests/test_records.py, tests/test_shift_size.py).
"""

from __future__ import annotations

import math

from timm_posgeom.app.records import (
    HistoryPoint,
    RunEval,
    RunSummary,
    SSDCSummary,
    StudyResults,
    StudyRun,
    SweepSummary,
)

ALPHAS = [1.0, 0.5, 0.0]


def claims_ssdc(plain: float, rpi: list[float]) -> SSDCSummary:
    return SSDCSummary(
        n_images=10,
        per_layer=[plain] * len(rpi),
        rise=0.0,
        rpi_per_layer=list(rpi),
        rpi_delta=rpi[1] - rpi[0],
        rpi_content_per_layer=[plain] * len(rpi),
    )


def claims_run(
    condition: str,
    seed: int,
    acc: float,
    fs: float,
    plain: float,
    rpi: list[float],
    sweep: tuple[list[float], list[float]] | None = None,
) -> StudyRun:
    summary = RunSummary(
        model="m", steps=1, epochs=1.0, train_images=1, val_images=1, processes=1, time_s=1.0, val_top1=acc
    )
    sw = None
    if sweep is not None:
        sw = SweepSummary(
            alphas=ALPHAS,
            delta_ssdc=sweep[0],
            fs={"jpeg:5": sweep[1]},
            clean_accuracy=[acc] * 3,
            rpi_per_layer=[rpi] * 3,
        )
    ev = RunEval(
        clean_accuracy=acc,
        fs={"jpeg:5": fs},
        fs_interval={"jpeg:5": [fs - 0.01, fs + 0.01]},
        num_images=1000,
        ssdc=claims_ssdc(plain, rpi),
        alpha_sweep=sw,
    )
    return StudyRun(
        condition=condition,
        seed=seed,
        run_dir="r",
        train=summary,
        eval=ev,
        history=[],
        untrained=claims_ssdc(0.1, [0.0] * len(rpi)),
    )


def results_of(runs: list[StudyRun], classes: int = 10) -> StudyResults:
    return StudyResults(
        config={},
        plan=[],
        versions={},
        runs=runs,
        eval_data={"source": "x", "split": "validation", "images": 1000, "classes": classes},
    )


def paper_like(seed: int, jitter: float = 0.0, nope_acc: float = 0.6) -> list[StudyRun]:
    """A study where every claim holds clearly."""
    j = jitter * (1 if seed % 2 else -1)
    return [
        claims_run("nope", seed, nope_acc, 0.60 + j, 0.5 + j, [0.01, 0.0, 0.02, 0.01]),
        claims_run(
            "ape", seed, 0.7, 0.40 + j, 0.6, [0.5 + j, 0.4, 0.3, 0.2], sweep=([0.5 + j, 0.2, 0.0], [0.3, 0.4, 0.5 + j])
        ),
        claims_run("sincos", seed, 0.7, 0.41 + j, 0.6, [0.45, 0.35 + j, 0.3, 0.2]),
        claims_run("rope", seed, 0.72, 0.30 + j, 0.6, [0.1 + j, 0.2, 0.3, 0.4]),
        claims_run("rpt", seed, 0.6, 0.62 + j, 0.5, [0.0, 0.02 + j, 0.01, 0.0]),
    ]


def paper_seeds(n: int, jitter: float = 0.005, nope_acc: float = 0.6) -> list[StudyRun]:
    """``n`` seeds of :func:`paper_like`."""
    return [r for seed in range(n) for r in paper_like(seed, jitter, nope_acc)]


def record_ssdc(nan: bool = False) -> SSDCSummary:
    return SSDCSummary(
        n_images=8,
        per_layer=[0.5, math.nan if nan else 0.4],
        rise=-0.1,
        rpi_per_layer=[0.1, 0.2],
        rpi_delta=0.1,
        rpi_content_per_layer=[0.5, 0.4],
        per_image_mean=[0.4, 0.3],
        per_image_std=[0.1, 0.1],
    )


def one_run_study() -> StudyResults:
    summary = RunSummary(
        model="posgeom_vit_micro_patch8_64_ape",
        steps=10,
        epochs=1.0,
        train_images=64,
        val_images=16,
        processes=1,
        time_s=3.5,
        val_top1=0.25,
    )
    sweep = SweepSummary(
        alphas=[1.0, 0.0],
        delta_ssdc=[0.2, 0.0],
        fs={"jpeg:5": [0.1, 0.3]},
        clean_accuracy=[0.5, 0.4],
        rpi_per_layer=[[0.1, 0.3], [0.1, 0.1]],
    )
    run = StudyRun(
        condition="ape",
        seed=0,
        run_dir="runs/ape_s0",
        train=summary,
        eval=RunEval(clean_accuracy=0.5, fs={"jpeg:5": 0.1}, ssdc=record_ssdc(), alpha_sweep=sweep),
        history=[HistoryPoint(step=10, epoch=1.0, val_top1=0.25, rpi_ssdc=[0.1, 0.2])],
        untrained=record_ssdc(),
    )
    return StudyResults(
        config={"preset": "demo"},
        plan=[{"condition": "ape"}],
        versions={"timm": "x"},
        runs=[run],
        elapsed_s=4.0,
        complete=True,
    )
