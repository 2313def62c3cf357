"""The GPU width ladder's data: Imagenette at 64 px as an ImageFolder tree (issue 32).

    python experiments/scaling/make_imagenette64.py ../shared/data/imagenette data/imagenette64
    tar czf imagenette64.tar.gz -C data imagenette64     # what travelled to the GPU machine (41 MiB)

Each image is resized as the training's uint8 cache resizes it (RGB, bicubic, straight to 64 x 64) and stored
as JPEG quality 95 without chroma subsampling (PSNR about 40 dB against the cache's pixels), because the GPU
machine took at most 64 MiB with the code: the parquet set is 135 MB, the same pixels lossless (WebP) 82 MiB.
Folders are named by WordNet id, which sorts in the parquet set's class order, so every label keeps its index.
The ladder's records name this folder (``data/imagenette64``) and its content hash (``data.json``); the studies
were measured here from the copy that the archive unpacks to (``tar`` keeps whole-second times: the same
per-file keys, so the same uint8 cache)."""

import sys
from pathlib import Path

import datasets
from PIL import Image

from timm_posgeom.data.transforms import to_rgb

WNIDS = [
    "n01440764",
    "n02102040",
    "n02979186",
    "n03000684",
    "n03028079",
    "n03394916",
    "n03417042",
    "n03425413",
    "n03445777",
    "n03888605",
]  # tench, English springer, ..., parachute: the parquet's order


def main(src: str, out: Path) -> None:
    for split in ("train", "validation"):
        ds = datasets.load_dataset(src, split=split)
        names = ds.features["label"].names
        assert len(names) == 10 and names[0] == "tench" and names[-1] == "parachute", names
        for w in WNIDS:
            (out / split / w).mkdir(parents=True, exist_ok=True)
        for i, row in enumerate(ds):
            image = to_rgb(row["image"]).resize((64, 64), Image.BICUBIC)
            image.save(out / split / WNIDS[row["label"]] / f"{i:05d}.jpg", "JPEG", quality=95, subsampling=0)
        print(split, len(ds))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
