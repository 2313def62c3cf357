"""One fingerprint (issue 49, item 3): every identity the package derives is `results.fingerprints.fingerprint`, one hash
(SHA-1) and one length (16 hex digits); a file's own checksum (`weights_sha1`) is the file's whole SHA-1. What a
resume looks for under a fingerprint cut shorter by 0.1.0 is still found (tests/test_protocol.py: a zoo and a
committed study)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
from PIL import Image

from timm_posgeom.results.fingerprints import FINGERPRINT_DIGITS, fingerprint

HEX16 = re.compile(r"[0-9a-f]{16}")


def _tree(root: Path) -> Path:
    """An ImageFolder tree: validation/<class>/*.png, 3 classes of 4 images."""
    rng = np.random.default_rng(0)
    for c in ("a", "b", "c"):
        (root / "validation" / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(
                root / "validation" / c / f"{i}.png"
            )
    return root


def test_the_fingerprint_is_sha1_cut_to_16_digits_of_its_parts_joined():
    assert FINGERPRINT_DIGITS == 16
    assert fingerprint("abc") == fingerprint(b"abc") == hashlib.sha1(b"abc").hexdigest()[:16]
    assert fingerprint(iter(["a", b"b", "c"])) == fingerprint("abc")  # parts as if joined, read one at a time
    assert fingerprint([]) == hashlib.sha1().hexdigest()[:16]


def test_every_identity_of_a_split_has_the_one_length(tmp_path):
    from timm_posgeom.data import carve_heldout, check_images, content_fingerprint, data_identity, load_split
    from timm_posgeom.data.splits import SubsetSplit

    folder = load_split(_tree(tmp_path / "data"), "validation")
    synthetic = load_split("synthetic", "validation", synthetic_size=6, img_size=16)
    for split in (folder, synthetic):
        identity = data_identity(split, content=True)
        assert all(HEX16.fullmatch(identity[k]) for k in ("labels", "pixels", "content")), identity
        assert identity["content"] == content_fingerprint(split)
    assert HEX16.fullmatch(folder.fingerprint.split("-")[1]), folder.fingerprint  # folder-<its files>-<count>
    assert HEX16.fullmatch(SubsetSplit(folder, [0, 2]).fingerprint.rsplit("-", 1)[-1])
    assert HEX16.fullmatch(carve_heldout(folder, 0.5)[2]["indices_sha1"])
    assert check_images(folder) is folder  # nothing left out: the split (and its fingerprint) as it was


def test_the_decoded_cache_and_the_zoos_names_and_keys_have_the_one_length(tmp_path):
    from timm_posgeom.app.zoo import safe_name, weights_key
    from timm_posgeom.data import cache_uint8, load_split

    split = load_split("synthetic", "validation", synthetic_size=4, img_size=16)
    cache_uint8(split, 16, cache_dir=tmp_path / "cache")
    (file,) = (tmp_path / "cache").iterdir()
    assert HEX16.fullmatch(file.stem.rsplit("-", 1)[-1]), file.name
    assert safe_name("vit_tiny_patch16_224.augreg_in21k") == "vit_tiny_patch16_224.augreg_in21k"  # timm's: as is
    for name in ("hf-hub:org/name", "local-dir:/a/b"):
        assert HEX16.fullmatch(safe_name(name).rsplit("-", 1)[-1]) and safe_name(name).endswith(fingerprint(name))
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "model.safetensors").write_bytes(b"x")
    key = weights_key(f"local-dir:{tmp_path / 'weights'}", "loaded")
    assert key is not None and HEX16.fullmatch(key.rsplit("|", 1)[-1]), key


def test_the_untrained_records_key_has_the_one_length(tmp_path):
    from timm_posgeom.app.study import measure as M

    class Run:
        condition, seed = "ape", 0

        class recipe:  # noqa: N801
            @staticmethod
            def to_dict() -> dict[str, str]:
                return {"model": "m"}

    m = M.Measuring(config=None, val=None, settings={"max_images": 8}, versions={}, log=print)  # type: ignore[arg-type]
    path = M.untrained_path(Run(), m, tmp_path)  # type: ignore[arg-type]
    assert path.parent == tmp_path / "untrained" and HEX16.fullmatch(path.stem.removeprefix("ape_s0-")), path.name


def test_the_weights_checksum_is_the_files_whole_sha1(tmp_path):
    """Not a fingerprint cut short: the checksum `sha1sum` prints, which the records and the manifest name."""
    from timm_posgeom.models.pretrained import weights_sha1

    blob = bytes(range(256)) * 5000  # over one read of 1 MiB: read in parts
    (tmp_path / "model.safetensors").write_bytes(blob)
    assert weights_sha1(tmp_path / "model.safetensors") == hashlib.sha1(blob).hexdigest()


def test_no_module_hashes_its_own_fingerprint():
    """Hashes are taken in one module (`fingerprints`), besides the weights file's checksum (`models.pretrained`),
    git's blob hash and SHA-256 of a weights file (`app.weights`, git's and the Hub cache's formats) and the
    synthetic set's seeds (`synthetic`: BLAKE2 seeds a random generator, it names nothing); no other module cuts a
    digest to a length of its own. (Modules by file name: the check survives a move to another folder.)"""
    import timm_posgeom

    root = Path(timm_posgeom.__file__).parent
    allowed = {"fingerprints.py", "pretrained.py", "weights.py", "synthetic.py"}
    for path in root.rglob("*.py"):
        text, name = path.read_text(), path.relative_to(root).as_posix()
        if path.name not in allowed:
            assert "hashlib" not in text, f"{name} hashes on its own: use fingerprint()"
            assert not re.search(r"hexdigest\(\)\[", text), f"{name} cuts a digest: use fingerprint()"
