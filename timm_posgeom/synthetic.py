"""An embedded, procedural image-classification set: textured shapes on 1/f-noise backgrounds.

What it is, and what it is not: a stand-in for natural images when no data is given (tests,
smoke runs, offline machines). It is not a benchmark and says nothing about ImageNet accuracy.

Every image is drawn from its own seed, ``(seed, split, index)``, so the set needs no storage, is
identical on every machine and in every DataLoader worker, and renders at any resolution (all
geometry is in fractions of the image side). Its spatial statistics are roughly natural: the
background and the shapes' texture are 1/f ("pink") noise, whose power spectrum falls like natural
images'; shapes have anti-aliased edges, random colours, sizes and positions.

Ten classes that depend on content (disc vs square) *and* layout:

====  ===========================  ==========================================================
  0   ``disc_top``                 one disc in the upper half
  1   ``disc_bottom``              one disc in the lower half
  2   ``square_top``               one square in the upper half
  3   ``square_bottom``            one square in the lower half
  4   ``two_discs_side_by_side``   two discs, left and right
  5   ``two_discs_stacked``        two discs, above and below
  6   ``disc_left_of_square``      a disc and a square, the disc on the left
  7   ``square_left_of_disc``      the same contents, the square on the left
  8   ``disc_above_square``        a disc and a square, the disc on top
  9   ``square_above_disc``        the same contents, the square on top
====  ===========================  ==========================================================

Pairs (0, 1), (2, 3), (6, 7) and (8, 9) contain the same things and differ only in where they
are, so a model must use position to tell them apart: a permutation-equivariant model (a ViT
without positional encoding) can separate them only through what a patch happens to see of a
shape's edge, while one with a PE can read the layout.
"""
from __future__ import annotations

import hashlib
import math

import torch
from PIL import Image

__all__ = ["SYNTHETIC_CLASSES", "SyntheticShapes", "pink_noise", "render_synthetic", "seed32"]

SYNTHETIC_CLASSES: tuple[str, ...] = (
    "disc_top", "disc_bottom", "square_top", "square_bottom",
    "two_discs_side_by_side", "two_discs_stacked",
    "disc_left_of_square", "square_left_of_disc",
    "disc_above_square", "square_above_disc",
)
_SPLIT_IDS = {"train": 0, "validation": 1, "val": 1, "test": 2}


def seed32(*parts: int) -> int:
    """A 32-bit seed mixing ``parts`` (torch's and numpy's CPU generators keep only 32 bits of a seed)."""
    digest = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def pink_noise(size: int, channels: int, generator: torch.Generator, exponent: float = 1.0) -> torch.Tensor:
    """(channels, size, size) noise with amplitude spectrum 1/f**exponent, zero mean, unit std."""
    white = torch.randn(channels, size, size, generator=generator)
    fy = torch.fft.fftfreq(size).abs()[:, None]
    fx = torch.fft.rfftfreq(size)[None, :]
    freq = torch.sqrt(fy ** 2 + fx ** 2)
    freq[0, 0] = 1.0
    spectrum = torch.fft.rfft2(white) / freq ** exponent
    spectrum[..., 0, 0] = 0.0
    noise = torch.fft.irfft2(spectrum, s=(size, size))
    return noise / noise.flatten(1).std(dim=1).clamp_min(1e-8)[:, None, None]


def _uniform(generator: torch.Generator, low: float, high: float) -> float:
    return low + (high - low) * torch.rand((), generator=generator).item()


def _shape_mask(kind: str, cx: float, cy: float, r: float, size: int) -> torch.Tensor:
    """(size, size) coverage in [0, 1] of a disc or an equal-area square (1-pixel anti-aliased edge)."""
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    y, x = coords[:, None], coords[None, :]
    if kind == "disc":
        dist = torch.sqrt((x - cx) ** 2 + (y - cy) ** 2) - r
    else:  # square of the disc's area: half side r * sqrt(pi) / 2
        dist = torch.maximum((x - cx).abs(), (y - cy).abs()) - r * math.sqrt(math.pi) / 2
    return (0.5 - dist).clamp(0.0, 1.0)


def _layout(label: int, g: torch.Generator) -> list[tuple[str, float, float]]:
    """The shapes of class ``label`` as (kind, cx, cy), centres in fractions of the side."""
    u = _uniform
    if label < 4:
        kind = "disc" if label < 2 else "square"
        cy = u(g, 0.18, 0.36) if label % 2 == 0 else u(g, 0.64, 0.82)
        return [(kind, u(g, 0.2, 0.8), cy)]
    near, far = u(g, 0.18, 0.36), u(g, 0.64, 0.82)
    across = u(g, 0.25, 0.75)
    first, second = {4: ("disc", "disc"), 5: ("disc", "disc"), 6: ("disc", "square"),
                     7: ("square", "disc"), 8: ("disc", "square"), 9: ("square", "disc")}[label]
    jitter = u(g, -0.06, 0.06)
    if label in (4, 6, 7):  # side by side: first on the left
        return [(first, near, across), (second, far, across + jitter)]
    return [(first, across, near), (second, across + jitter, far)]  # stacked: first on top


def render_synthetic(label: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Draw one image of class ``label`` at ``size`` x ``size``: a (3, size, size) uint8 tensor."""
    g = generator
    # background: a luminance pink-noise field plus weaker per-channel colour fields
    base_colour = torch.rand(3, 1, 1, generator=g) * 0.6 + 0.2
    noise = pink_noise(size, 6, g)  # luminance, 3 colour fields, 2 shape textures: one FFT
    image = base_colour + 0.12 * noise[:1] + 0.05 * noise[1:4]
    r = _uniform(g, 0.10, 0.16) * size
    for shape, (kind, cx, cy) in enumerate(_layout(label, g)):
        mask = _shape_mask(kind, cx * size, cy * size, r, size)
        colour = torch.rand(3, 1, 1, generator=g)
        colour = torch.where((colour - base_colour).abs().mean() < 0.25, 1.0 - colour, colour)
        texture = colour + 0.08 * noise[4 + shape]
        image = image * (1 - mask) + texture * mask
    image = image + 0.02 * torch.randn(3, size, size, generator=g)
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


class SyntheticShapes(torch.utils.data.Dataset):
    """The procedural set described in this module's docstring, as a map-style dataset.

    ``dataset[i]`` is ``(PIL.Image RGB, label)``; :meth:`render` gives the uint8 tensor directly.
    Labels are balanced (``i % 10`` after a seeded shuffle of the label sequence).

    Args:
        num_samples: number of images.
        img_size: side of the (square) images, any value >= 8.
        seed: dataset seed; with ``split`` and the index it determines every pixel.
        split: ``train``, ``validation`` (alias ``val``) or ``test``: disjoint seeds.
    """

    classes: tuple[str, ...] = SYNTHETIC_CLASSES

    def __init__(self, num_samples: int = 5000, img_size: int = 64, seed: int = 0, split: str = "train"):
        if split not in _SPLIT_IDS:
            raise ValueError(f"unknown synthetic split {split!r}; expected one of {', '.join(_SPLIT_IDS)}")
        if img_size < 8:
            raise ValueError(f"img_size must be >= 8, got {img_size}")
        self.num_samples = int(num_samples)
        self.img_size = int(img_size)
        self.seed = int(seed)
        self.split = split
        order = torch.Generator().manual_seed(self._key(-1))
        self.labels: list[int] = (torch.arange(self.num_samples) % len(self.classes))[
            torch.randperm(self.num_samples, generator=order)].tolist()

    def _key(self, index: int) -> int:
        return seed32(self.seed, _SPLIT_IDS[self.split], index)

    def __len__(self) -> int:
        return self.num_samples

    def render(self, index: int) -> torch.Tensor:
        """The (3, img_size, img_size) uint8 image at ``index``."""
        if not 0 <= index < self.num_samples:
            raise IndexError(index)
        g = torch.Generator().manual_seed(self._key(index))
        return render_synthetic(self.labels[index], self.img_size, g)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        array = self.render(index).permute(1, 2, 0).numpy()
        return Image.fromarray(array, mode="RGB"), self.labels[index]

    @property
    def fingerprint(self) -> str:
        """A string that changes whenever any pixel of the set would."""
        return f"synthetic-v1-{self.split}-{self.seed}-{self.num_samples}-{self.img_size}"
