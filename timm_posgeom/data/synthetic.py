"""An embedded, procedural image-classification set: coloured shapes on 1/f-noise backgrounds.

What it is, and what it is not: a stand-in for natural images when no data is given (tests,
smoke runs, offline machines, the demo study). It is not a benchmark and says nothing about
ImageNet accuracy.

Every image is drawn from its own seed, ``(seed, split, index)``, and rendered on one thread (an FFT
rounds differently on several), so the set needs no storage, is identical on every machine, at any
torch thread count and in every DataLoader worker, and renders at any resolution (all
geometry is in fractions of the image side). Its spatial statistics are roughly natural: the
background and the shapes' texture are 1/f**1.5 noise, whose spectrum falls like natural images';
shapes have anti-aliased edges, random sizes and positions.

Ten classes that depend on content (disc vs square) *and* layout:

====  ===========================  ==========================================================
  0   ``disc_top``                 one disc in the upper half
  1   ``disc_bottom``              one disc in the lower half
  2   ``square_top``               one square in the upper half
  3   ``square_bottom``            one square in the lower half
  4   ``two_discs_side_by_side``   two discs, left and right
  5   ``two_discs_stacked``        two discs, above and below
  6   ``disc_and_square_top``      a disc and a square side by side in the upper half
  7   ``disc_and_square_bottom``   the same contents side by side in the lower half
  8   ``disc_above_square``        a disc and a square, the disc on top
  9   ``square_above_disc``        the same contents, the square on top
====  ===========================  ==========================================================

Pairs (0, 1), (2, 3), (4, 5), (6, 7) and (8, 9) contain the same things and differ only in where
they are, so a model must know where its tokens are to tell them apart. A ViT with a positional
encoding reads that from its PE. A ViT without one is permutation-invariant over its patch tokens and
can read it only from what the pixels themselves say about position: on this set, a fine colour grating
laid over the whole image, horizontal lines in the upper half and vertical lines in the lower half
(like the textures of sky and ground, a trace of position in content). The grating alternates every
pixel along one axis and changes colour, not luminance, so JPEG's 2 x 2 chroma subsampling averages it
away at any quality (``jpeg:5`` included), and so does a blur. Without it a PE-blind model reaches at
most 0.4 top-1 (it can tell one disc, one square, two discs and a disc with a square apart, and must
guess within each pair): layout known from content is fragile, layout known from a PE is not, which is
what the demo study's fragility claim can then show (or fail to show).

Content is made easy to see on purpose, so that a model learns it in a few hundred steps on a CPU
and what is left to learn is layout: discs are warm (red to orange), squares cool (blue to cyan), on
a low-saturation background. Every label is unchanged by a horizontal flip (no class depends on
left vs right), so the training recipes' flip augmentation never swaps labels. Version 3 of the set
(``fingerprint`` says which); version 2 had no grating (a PE-blind model was held at 0.4 and JPEG q5 cost
no model more than 3% of its accuracy); version 1 had random shape colours and left/right classes 6 and 7,
which a flip swapped.
"""

from __future__ import annotations

import hashlib
import math

import torch
from PIL import Image

from ..errors import SettingError

__all__ = ["SYNTHETIC_CLASSES", "SyntheticShapes", "grating", "pink_noise", "render_synthetic", "seed32"]

SYNTHETIC_CLASSES: tuple[str, ...] = (
    "disc_top",
    "disc_bottom",
    "square_top",
    "square_bottom",
    "two_discs_side_by_side",
    "two_discs_stacked",
    "disc_and_square_top",
    "disc_and_square_bottom",
    "disc_above_square",
    "square_above_disc",
)
_SPLIT_IDS = {"train": 0, "validation": 1, "val": 1, "test": 2}
MAX_SYNTHETIC = 10_000_000  # images a synthetic split may hold (ImageNet's training split has 1.28 million)


def seed32(*parts: int) -> int:
    """A 32-bit seed mixing ``parts`` (torch's and numpy's CPU generators keep only 32 bits of a seed)."""
    digest = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def pink_noise(size: int, channels: int, generator: torch.Generator, exponent: float = 1.0) -> torch.Tensor:
    """(channels, size, size) noise with amplitude spectrum 1/f**exponent, zero mean, unit std."""
    white = torch.randn(channels, size, size, generator=generator)
    fy = torch.fft.fftfreq(size).abs()[:, None]
    fx = torch.fft.rfftfreq(size)[None, :]
    freq = torch.sqrt(fy**2 + fx**2)
    freq[0, 0] = 1.0
    spectrum = torch.fft.rfft2(white) / freq**exponent
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


def class_layout(label: int, g: torch.Generator) -> list[tuple[str, float, float]]:
    """The shapes of class ``label`` as (kind, cx, cy), centres in fractions of the side."""
    u = _uniform
    if label < 4:
        kind = "disc" if label < 2 else "square"
        cy = u(g, 0.18, 0.36) if label % 2 == 0 else u(g, 0.64, 0.82)
        return [(kind, u(g, 0.2, 0.8), cy)]
    near, far = u(g, 0.18, 0.36), u(g, 0.64, 0.82)
    jitter = u(g, -0.06, 0.06)
    if label in (4, 5):  # two discs: side by side (4) or stacked (5), anywhere across
        across = u(g, 0.25, 0.75)
        if label == 4:
            return [("disc", near, across), ("disc", far, across + jitter)]
        return [("disc", across, near), ("disc", across + jitter, far)]
    if label in (6, 7):  # a disc and a square side by side (either on the left), in the upper / lower half
        row = u(g, 0.18, 0.36) if label == 6 else u(g, 0.64, 0.82)
        left, right = ("disc", "square") if torch.rand((), generator=g).item() < 0.5 else ("square", "disc")
        return [(left, near, row), (right, far, row + jitter)]
    across = u(g, 0.25, 0.75)  # stacked: disc on top (8) or square on top (9)
    first, second = ("disc", "square") if label == 8 else ("square", "disc")
    return [(first, across, near), (second, across + jitter, far)]


# Amplitude of the grating (in [0, 1] pixel units, along _CHROMA). At 0.2 a no-PE micro ViT learnt to read it
# in the demo's 300 steps (top-1 0.79) but an RPT one did not (0.38); at 0.3 both did (0.89 and 0.47).
GRATING_AMPLITUDE = 0.3
_CHROMA = (1.0, -0.51, 0.0)  # red against green at constant luminance: 0.299 R + 0.587 G = 0


def grating(size: int) -> torch.Tensor:
    """(3, size, size): the set's position grating, +-1 along ``_CHROMA`` with period 2 px: horizontal lines
    (rows alternate) in the upper half of the image, vertical lines (columns alternate) in the lower half.
    Every 2 x 2 block of it sums to zero in each channel."""
    parity = (torch.arange(size) % 2 * 2 - 1).float()
    rows, cols = parity[:, None].expand(size, size), parity[None, :].expand(size, size)
    upper = (torch.arange(size) + 0.5 < size / 2)[:, None].expand(size, size)
    return torch.tensor(_CHROMA)[:, None, None] * torch.where(upper, rows, cols)


_WARM, _COOL = (0.9, 0.3, 0.12), (0.12, 0.4, 0.9)  # mean RGB of a disc's colour and a square's


def render_synthetic(label: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Draw one image of class ``label`` at ``size`` x ``size``: a (3, size, size) uint8 tensor."""
    g = generator
    # background: a luminance pink-noise field around a grey level, plus weak per-channel colour fields
    base = torch.rand((), generator=g).item() * 0.3 + 0.35
    # luminance, 3 colour fields, 2 shape textures: one FFT. Amplitude 1/f**1.5 at these strengths gives an
    # untrained ViT an SSDC of about 0.5 on the set (0.25 -> 0.11 across depth at 1/f, 0.12, 0.04), near
    # what untrained ViTs show on natural images (0.57-0.64)
    noise = pink_noise(size, 6, g, exponent=1.5)
    image = base + 0.18 * noise[:1] + 0.06 * noise[1:4]
    r = _uniform(g, 0.12, 0.17) * size
    for shape, (kind, cx, cy) in enumerate(class_layout(label, g)):
        mask = _shape_mask(kind, cx * size, cy * size, r, size)
        mean = torch.tensor(_WARM if kind == "disc" else _COOL)
        colour = (mean + 0.1 * torch.randn(3, generator=g)).clamp(0, 1)[:, None, None]
        texture = colour + 0.06 * noise[4 + shape]
        image = image * (1 - mask) + texture * mask
    image = image + GRATING_AMPLITUDE * grating(size) + 0.02 * torch.randn(3, size, size, generator=g)
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
            raise SettingError(f"unknown synthetic split {split!r}; expected one of {', '.join(_SPLIT_IDS)}")
        if img_size < 8:
            raise SettingError(f"img_size must be >= 8, got {img_size}")
        if not 0 <= num_samples <= MAX_SYNTHETIC:  # every label is drawn up front (8 bytes each, and a permutation)
            raise SettingError(f"a synthetic split holds from 0 to {MAX_SYNTHETIC:,} images, got {num_samples:,}")
        self.num_samples = int(num_samples)
        self.img_size = int(img_size)
        self.seed = int(seed)
        self.split = split
        order = torch.Generator().manual_seed(self._key(-1))
        self.labels: list[int] = (torch.arange(self.num_samples) % len(self.classes))[
            torch.randperm(self.num_samples, generator=order)
        ].tolist()

    def _key(self, index: int) -> int:
        return seed32(self.seed, _SPLIT_IDS[self.split], index)

    def __len__(self) -> int:
        return self.num_samples

    def render(self, index: int) -> torch.Tensor:
        """The (3, img_size, img_size) uint8 image at ``index``."""
        if not 0 <= index < self.num_samples:
            raise IndexError(index)
        g = torch.Generator().manual_seed(self._key(index))
        # one image is a few dozen small ops: on 1 thread they are faster than on several (3.8 against 60 ms
        # an image at 64 px measured on 2 busy cores), and the pixels are the same
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return render_synthetic(self.labels[index], self.img_size, g)
        finally:
            torch.set_num_threads(threads)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        array = self.render(index).permute(1, 2, 0).numpy()
        return Image.fromarray(array, mode="RGB"), self.labels[index]

    @property
    def fingerprint(self) -> str:
        """A string that changes whenever any pixel of the set would."""
        return f"synthetic-v3-{self.split}-{self.seed}-{self.num_samples}-{self.img_size}"
