"""The result of an ImageNet-C run (:class:`ImageNetCResult`): accuracy and FS per corruption and severity,
their means (``FS_c``, ``mean FS``, mCE's average of fragility scores), FS normalised by a reference's like mCE
(``rFS``), and the result as JSON and as a markdown table. The definitions are in :mod:`.imagenet_c` and
docs/method.md#imagenet-c; :func:`~timm_posgeom.robustness.imagenet_c.imagenet_c_fragility` and
:func:`~timm_posgeom.robustness.imagenet_c.imagenet_c_released` measure it."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.shifts import IMAGENET_C_CORRUPTIONS
from ..errors import DataError, ResultFileError
from ..results.jsonio import dump_json, nan_if_none, tagged, to_jsonable
from .imagenet_c_tree import SEVERITIES
from .scores import FragilityResult

__all__ = ["ImageNetCResult"]


def imagenet_c_spec(name: str, severity: int) -> str:
    return f"imagenet-c:{name}:{severity}"


def _nanmean(values: Sequence[float]) -> float:
    """The mean, NaN when any value is NaN (a missing number is not averaged away)."""
    values = list(values)
    return float(np.mean(values)) if values and not any(math.isnan(v) for v in values) else math.nan


# --------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------
@dataclass
class ImageNetCResult:
    """Accuracy and fragility score per ImageNet-C corruption and severity, and their means.

    Attributes:
        corruptions: corruption names, in order.
        severities: severities, in order (1-5).
        num_images: n, the number of clean images.
        clean_accuracy: A_clean on the clean images.
        accuracy: corruption -> severity -> ``A[c][s]``.
        fs: corruption -> severity -> ``FS[c][s] = 1 - A[c][s] / A_clean`` (NaN when A_clean = 0).
        counts: ``"clean"`` and corruption -> severity -> ``{"correct": k, "total": n}``.
        source: ``"generated"`` (corrupted on the fly) or ``"released"`` (read from a tree).
        fragility: the underlying :class:`~timm_posgeom.robustness.FragilityResult` of a generated run
            (intervals, per-image correctness, shifts keyed ``imagenet-c:NAME:SEVERITY``); None when
            released (its images are not paired with the clean ones, so there is no paired interval).
        settings: how the numbers were made (model, resize, seed, root, ...).
    """

    corruptions: list[str]
    severities: list[int]
    num_images: int
    clean_accuracy: float
    accuracy: dict[str, dict[int, float]]
    fs: dict[str, dict[int, float]]
    counts: dict[str, Any]
    source: str
    fragility: FragilityResult | None = field(default=None, repr=False)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def corruption_fs(self) -> dict[str, float]:
        """corruption -> FS_c, the mean of ``FS[c][s]`` over the severities."""
        return {c: _nanmean([self.fs[c][s] for s in self.severities]) for c in self.corruptions}

    @property
    def corruption_accuracy(self) -> dict[str, float]:
        """corruption -> the mean of ``A[c][s]`` over the severities."""
        return {c: _nanmean([self.accuracy[c][s] for s in self.severities]) for c in self.corruptions}

    @property
    def mean_fs(self) -> float:
        """The mean over the corruptions of FS_c (mCE's average, of fragility scores)."""
        return _nanmean(list(self.corruption_fs.values()))

    @property
    def complete(self) -> bool:
        """True when the result covers ImageNet-C's 15 corruptions at severities 1-5 (what mCE averages)."""
        return sorted(self.corruptions) == sorted(IMAGENET_C_CORRUPTIONS) and sorted(self.severities) == list(
            SEVERITIES
        )

    def relative_fs(self, reference: ImageNetCResult | Mapping[str, Mapping[int, float]]) -> dict[str, float]:
        """corruption -> ``rFS_c = sum_s FS[c][s] / sum_s FS_ref[c][s]`` (normalised like mCE's CE_c).

        ``reference``: another result, or its ``fs`` table (corruption -> severity -> FS). It must hold
        every corruption and severity of this one (ValueError otherwise). NaN with a RuntimeWarning for a
        corruption whose reference sum is not positive (a model the corruption does not hurt cannot be a
        yardstick).
        """
        table = reference.fs if isinstance(reference, ImageNetCResult) else reference
        missing = [
            imagenet_c_spec(c, s)
            for c in self.corruptions
            for s in self.severities
            if c not in table or s not in table[c]
        ]
        if missing:
            raise DataError(
                f"the reference lacks {len(missing)} of this result's corruptions and severities "
                f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''})"
            )
        out = {}
        for c in self.corruptions:
            own = sum(self.fs[c][s] for s in self.severities)
            ref = sum(float(table[c][s]) for s in self.severities)
            if math.isnan(ref) or ref <= 0:
                warnings.warn(
                    f"the reference's FS of {c} sums to {ref:.4g} over the severities: rFS is undefined (NaN)",
                    RuntimeWarning,
                    stacklevel=2,
                )
                out[c] = math.nan
            else:
                out[c] = own / ref
        return out

    def mean_relative_fs(
        self, reference: ImageNetCResult | Mapping[str, Mapping[int, float]], defined_only: bool = False
    ) -> float:
        """The mean over the corruptions of :meth:`relative_fs` (mCE's normalised average).

        NaN when rFS is undefined for some corruption (the reference's FS sums to <= 0 there), unless
        ``defined_only``: then the mean over the corruptions where it is defined (NaN if none is); say
        which were left out when you report it (:meth:`to_markdown` does)."""
        values = list(self.relative_fs(reference).values())
        if defined_only:
            values = [v for v in values if not math.isnan(v)]
        return _nanmean(values)

    # ---------------------------------------------------------------------------------- output
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready numbers; severities become string keys. The underlying fragility result (generated
        runs) is included under ``"fragility"``."""

        def by_sev(table: Mapping[str, Mapping[int, Any]]) -> dict[str, dict[str, Any]]:
            return {c: {str(s): table[c][s] for s in self.severities} for c in self.corruptions}

        return {
            "source": self.source,
            "corruptions": list(self.corruptions),
            "severities": list(self.severities),
            "num_images": self.num_images,
            "clean_accuracy": self.clean_accuracy,
            "accuracy": by_sev(self.accuracy),
            "fs": by_sev(self.fs),
            "corruption_fs": self.corruption_fs,
            "mean_fs": self.mean_fs,
            "complete": self.complete,
            "counts": {
                "clean": dict(self.counts["clean"]),
                **{c: {str(s): dict(self.counts[c][s]) for s in self.severities} for c in self.corruptions},
            },
            "definitions": "FS[c][s] = 1 - A[c][s] / A_clean; FS_c = mean over severities; mean_fs = mean over "
            "corruptions of FS_c",
            "settings": to_jsonable(self.settings),
            "fragility": self.fragility.to_dict() if self.fragility is not None else None,
        }

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2) -> str:
        """The :meth:`to_dict` numbers as strict JSON (NaN written as null); also written to ``path`` if given (atomically)."""
        return dump_json(tagged("imagenet-c-result", self.to_dict()), path, indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ImageNetCResult:
        """The result :meth:`to_dict` (or :meth:`to_json`, tagged) wrote, without per-image arrays or the
        fragility result; for a reference. ValueError for another kind of file."""
        schema = d.get("schema") if isinstance(d, Mapping) else None
        if schema is not None and schema != "timm-posgeom/imagenet-c-result":
            raise ResultFileError(f"not an ImageNet-C result (imagenet_c.json): a {schema!r} file")
        try:
            severities = [int(s) for s in d["severities"]]
            corruptions = list(d["corruptions"])

            def table(t: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, float]]:
                return {c: {s: float(nan_if_none(t[c][str(s)])) for s in severities} for c in corruptions}

            counts = {
                "clean": dict(d["counts"]["clean"]),
                **{c: {s: dict(d["counts"][c][str(s)]) for s in severities} for c in corruptions},
            }
            clean = d["clean_accuracy"]
            return cls(
                corruptions=corruptions,
                severities=severities,
                num_images=int(d["num_images"]),
                clean_accuracy=float(nan_if_none(clean)),
                accuracy=table(d["accuracy"]),
                fs=table(d["fs"]),
                counts=counts,
                source=str(d["source"]),
                settings=dict(d.get("settings") or {}),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ResultFileError(f"not an ImageNet-C result (imagenet_c.json): missing or malformed {e}") from None

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> ImageNetCResult:
        """Read a result written by :meth:`to_json` (``imagenet_c.json``)."""
        import json

        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (ValueError, KeyError, TypeError) as e:  # not JSON, or not an imagenet_c.json
            raise ResultFileError(
                f"{path} is not an ImageNet-C result (imagenet_c.json): {type(e).__name__}: {e}"
            ) from None

    def to_markdown(self, digits: int = 3, reference: ImageNetCResult | None = None) -> str:
        """A table corruption x severity of FS, with FS_c and the mean top-1 per corruption, a row of means
        per severity, and lines for the clean accuracy and the mean FS (and the normalised mean with a
        ``reference``)."""
        f = f"{{:.{digits}f}}"

        def fmt(v: float) -> str:
            return "nan" if math.isnan(v) else f.format(v)

        head = ["corruption", *(f"FS s{s}" for s in self.severities), "FS_c (mean)", "top-1 (mean)"]
        relative = self.relative_fs(reference) if reference is not None else None
        if relative is not None:
            head.append("rFS_c")
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        cfs, cacc = self.corruption_fs, self.corruption_accuracy
        for c in self.corruptions:
            cells = [c, *(fmt(self.fs[c][s]) for s in self.severities), fmt(cfs[c]), fmt(cacc[c])]
            if relative is not None:
                cells.append(fmt(relative[c]))
            lines.append("| " + " | ".join(cells) + " |")
        means = [fmt(_nanmean([self.fs[c][s] for c in self.corruptions])) for s in self.severities]
        row = ["mean", *means, fmt(self.mean_fs), fmt(_nanmean(list(cacc.values())))]
        if relative is not None:
            row.append(fmt(_nanmean(list(relative.values()))))
        lines.append("| " + " | ".join(row) + " |")
        scope = (
            "ImageNet-C's 15 corruptions x severities 1-5"
            if self.complete
            else f"{len(self.corruptions)} corruption(s) x severities {','.join(map(str, self.severities))} "
            "(not all of ImageNet-C)"
        )
        lines += [
            "",
            f"clean top-1 {fmt(self.clean_accuracy)} on {self.num_images} images; {self.source} corruptions",
            f"mean FS over {scope}: {fmt(self.mean_fs)}",
        ]
        if relative is not None:
            lines.append(
                f"mean rFS (normalised by the reference's FS per corruption, like mCE): "
                f"{fmt(_nanmean(list(relative.values())))}"
            )
            undefined = [c for c, v in relative.items() if math.isnan(v)]
            defined = [v for v in relative.values() if not math.isnan(v)]
            if undefined and defined:
                lines.append(
                    f"mean rFS over the {len(defined)} corruption(s) where it is defined (left out, the "
                    f"reference's FS sums to <= 0: {', '.join(undefined)}): {fmt(_nanmean(defined))}"
                )
        return "\n".join(lines)
