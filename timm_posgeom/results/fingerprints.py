"""The package's one fingerprint: what names a thing by its content, in one hash and one length.

Every identity the package derives is :func:`fingerprint` of what it is made of: a split's content, labels and
first pixels (``data.data_identity``), a folder's files, a held-out part's indices, the decoded-image cache's
key, a zoo model's file name, the weights key of a local folder, a study's untrained record. The first
:data:`FINGERPRINT_DIGITS` hex digits of SHA-1: 64 bits, enough that no two of the things a study or a zoo
holds share one, short enough for a file name.

A file's own checksum is another thing: :func:`timm_posgeom.models.pretrained.weights_sha1` is the whole SHA-1
of a weights file, as ``sha1sum`` prints it, so that anyone can check the file a record names.

Versions up to 0.1.0 cut some fingerprints to 8, 10, 12 or 20 digits; where one named a file that a resume looks
for (a zoo model's record, a study's untrained SSDC), the reader also finds the former name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["FINGERPRINT_DIGITS", "fingerprint"]

FINGERPRINT_DIGITS = 16


def fingerprint(data: str | bytes | Iterable[str | bytes]) -> str:
    """The first :data:`FINGERPRINT_DIGITS` hex digits of the SHA-1 of ``data``: text as UTF-8, bytes as they
    are, an iterable of them as if joined (read one part at a time, so a stream of images is never held
    whole). ``fingerprint("abc") == hashlib.sha1(b"abc").hexdigest()[:16]``."""
    digest = hashlib.sha1()
    for part in (data,) if isinstance(data, (str, bytes)) else data:
        digest.update(part.encode() if isinstance(part, str) else part)
    return digest.hexdigest()[:FINGERPRINT_DIGITS]
