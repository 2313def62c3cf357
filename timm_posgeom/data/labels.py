"""The data's labels against the model's classes: checked before anything is scored, mapped on request.

An accuracy counted with labels that do not index the model's classes is a silent wrong number: an
ImageNet-1k model scored on Imagenette would read labels 0-9 as ImageNet classes 0-9 (tench ... the
first ten ImageNet classes, not Imagenette's). Every public function that scores labels
(:func:`~timm_posgeom.robustness.fragility`, :func:`~timm_posgeom.robustness.alpha_sweep`, the
ImageNet-C functions) calls :func:`match_labels` with its ``labels`` parameter:

* ``"check"`` (the default): refuse a model and data whose classes differ (their number, the model's
  recorded class names, or an ImageNet head's WordNet order), naming the remedy;
* ``"by-name"``: map the data's classes onto the model's by name (:func:`map_by_name`: the model's
  recorded class names, or an ImageNet head's WordNet ids and class names);
* ``"as-is"``: use the indices unchecked (the caller knows they match).
"""

from __future__ import annotations

import re
from typing import Any

from ..defaults import LABEL_POLICIES
from ..errors import PosgeomError, SettingError

__all__ = ["LABEL_POLICIES", "LabelMismatchError", "match_labels", "map_by_name", "model_class_names"]

_WNID = re.compile(r"n\d{8}")
_REMEDY = (
    "labels='by-name' maps them onto the model's classes by name or WordNet id; labels='as-is' uses the "
    "indices unchecked"
)


class LabelMismatchError(PosgeomError, ValueError):
    """The data's labels do not index the model's classes (and no mapping was chosen, or none exists)."""


def model_class_names(model: Any) -> list[str]:
    """The class names the model records (``pretrained_cfg["label_names"]``, as exports of ``posgeom
    train`` do), or [] when it records none."""
    return [str(n) for n in ((getattr(model, "pretrained_cfg", None) or {}).get("label_names") or [])]


def _imagenet(model: Any) -> tuple[str, list[str], list[str]] | None:
    """(subset, WordNet ids, descriptions) when the head is an ImageNet head by timm's rule, else None."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset(model)
    if subset is None:
        return None
    info = ImageNetInfo(subset)
    return subset, list(info.label_names()), list(info.label_descriptions())


def map_by_name(model: Any, data: Any) -> tuple[Any | None, str]:
    """``(data relabelled so that its labels index the model's outputs, how)``, or ``(None, why not)``.

    In order:

    1. the model records its class names (:func:`model_class_names`): the data's class names are looked
       up there (the same list: the data as is);
    2. its head is an ImageNet head by timm's rule (``timm.data.infer_imagenet_subset``: 1000 outputs
       are ImageNet-1k, ...): each of the data's classes is matched to the one ImageNet class whose
       WordNet id it is (``n01440764``) or, failing that, to the one class that has it among its names
       (``"tench"`` in ``"tench, Tinca tinca"``); a name shared by two ImageNet classes matches none;
    3. otherwise the outputs' meaning is unknown: no match.

    A class of the data that cannot be matched leaves the whole data unmatched: an accuracy counted
    with a wrong label mapping would be a wrong number, not an approximate one.
    """
    classes = [str(c) for c in (getattr(data, "classes", None) or [])]
    outputs = int(getattr(model, "num_classes", 0) or 0)
    if outputs < 1:
        return None, "the model has no classifier head"
    if not classes:
        return None, "the data has no class names"
    names = model_class_names(model)
    if names:
        return _map_onto_recorded_names(data, classes, names, outputs)
    imagenet = _imagenet(model)
    if imagenet is None:
        return None, f"the model's {outputs} outputs have no recorded class names and are not an ImageNet head"
    return _map_onto_imagenet(data, classes, outputs, *imagenet)


def _map_onto_recorded_names(data: Any, classes: list[str], names: list[str], outputs: int) -> tuple[Any | None, str]:
    """:func:`map_by_name`, step 1: the data's ``classes`` looked up in the model's recorded class ``names``."""
    from . import relabel_by_name

    if len(names) != outputs:
        return None, f"the model records {len(names)} class names for {outputs} outputs"
    if names == classes:
        return data, "the model's recorded class names (the data's, in the same order)"
    missing = [c for c in classes if c not in names]
    if missing:
        return None, (
            f"the model's recorded classes lack {len(missing)} of the data's "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
        )
    return relabel_by_name(data, names), "by name onto the model's recorded class names"


def _imagenet_matches(classes: list[str], wnids: list[str], descriptions: list[str]) -> tuple[list[int], list[str]]:
    """(the ImageNet class index of each of ``classes``, the classes that match none or several): by WordNet
    id, else by one of the comma-separated names of a class's description (case and spaces ignored)."""
    by_wnid = {w: i for i, w in enumerate(wnids)}
    by_name: dict[str, set[int]] = {}
    for i, description in enumerate(descriptions):
        for synonym in description.split(","):
            by_name.setdefault(synonym.strip().lower(), set()).add(i)
    mapping, missing = [], []
    for c in classes:
        hits = {by_wnid[c]} if c in by_wnid else by_name.get(c.strip().lower(), set())
        if len(hits) == 1:
            mapping.append(next(iter(hits)))
        else:
            missing.append(c + (" (ambiguous)" if hits else ""))
    return mapping, missing


def _map_onto_imagenet(
    data: Any, classes: list[str], outputs: int, subset: str, wnids: list[str], descriptions: list[str]
) -> tuple[Any | None, str]:
    """:func:`map_by_name`, step 2: the data's ``classes`` matched to an ImageNet head's classes."""
    from . import RelabeledSplit

    mapping, missing = _imagenet_matches(classes, wnids, descriptions)
    if missing:
        return None, (
            f"an {subset} head ({outputs} outputs), but {len(missing)} of the data's classes are neither "
            f"WordNet ids nor names of one {subset} class ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''})"
        )
    if mapping == list(range(len(wnids))):
        return data, f"{subset} head: the data's classes are its WordNet ids, in its order"
    if not hasattr(data, "labels"):
        return None, "the data has no label list to map (load it with timm_posgeom.load_split)"
    return RelabeledSplit(data, wnids, mapping), f"{subset} head: the data's classes matched by WordNet id or name"


def match_labels(model: Any, data: Any, labels: str = "check") -> Any:
    """The data whose labels index the model's classes, under the policy ``labels`` (module docstring).

    ``"check"`` returns ``data`` itself when its classes agree with the model's (or when either side does
    not say: data without ``classes``, a model without ``num_classes``; each label is still checked to be
    in range as it is scored) and raises :class:`LabelMismatchError` (one line, with the remedy) when they
    differ. ``"by-name"`` returns the mapped data or raises why it cannot be mapped. ``"as-is"`` returns
    ``data`` unchecked.
    """
    if labels not in LABEL_POLICIES:
        raise SettingError(f"labels must be one of {', '.join(LABEL_POLICIES)}, got {labels!r}")
    if labels == "as-is":
        return data
    if labels == "by-name":
        mapped, how = map_by_name(model, data)
        if mapped is None:
            raise LabelMismatchError(f"the data's classes cannot be mapped onto the model's: {how}")
        return mapped
    data_names = [str(c) for c in (getattr(data, "classes", None) or [])]
    outputs = int(getattr(model, "num_classes", 0) or 0)
    if not data_names or outputs < 1:
        return data
    if outputs != len(data_names):
        mapped, how = map_by_name(model, data)
        hint = "" if mapped is not None else f" (here by name cannot: {how})"
        raise LabelMismatchError(
            f"the model has {outputs} classes but the data has {len(data_names)}: accuracy and FS would count the "
            f"data's labels as the model's first classes; {_REMEDY}{hint}"
        )
    names = model_class_names(model)
    if names:
        if names == data_names:
            return data
        same_set = sorted(names) == sorted(data_names)
        raise LabelMismatchError(
            f"the model's class names differ from the data's ({', '.join(names[:3])}, ... vs "
            f"{', '.join(data_names[:3])}, ...){': the same classes in another order' if same_set else ''}; " + _REMEDY
        )
    if all(_WNID.fullmatch(c) for c in data_names):  # WordNet ids on an ImageNet head: also in its order?
        imagenet = _imagenet(model)
        if imagenet is not None and imagenet[1] != data_names:
            raise LabelMismatchError(
                f"the data's classes are WordNet ids in another order than the model's {imagenet[0]} classes; {_REMEDY}"
            )
    return data
