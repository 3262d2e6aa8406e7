"""The example inputs of the guides' commands, under docs/examples/: two Flowers photos, a sketch and a mask.

    TFDS_DATA_DIR=/path/to/tfds python tools/example_images.py [--out docs/examples]

- ``rose.jpg``, ``sunflower.jpg``: the first image of that class in Oxford Flowers 102's test split (TFDS),
  centre-cropped and resized to 64x64 by training's own function (:func:`ddim.images.center_crop_resize`),
  JPEG quality 90.
- ``sketch.png``: a flower painted in flat colours (petals, a disc, a stem on a plain ground), the kind of
  input SDEdit turns into a photo-like image (``ddim edit``).
- ``hole.png``: the mask of ``ddim inpaint``: white, the region to fill, is a square in the middle of a 64x64
  black image.

The same command writes the same files (TFDS's order and PIL's drawing are deterministic).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

SIZE = 64
PHOTOS = ("rose", "sunflower")


def flowers_photo(name: str, data_dir: str | None) -> np.ndarray:
    """The first test-split image of the class ``name``, as the model's input (uint8, SIZE x SIZE)."""
    import tensorflow_datasets as tfds

    from ddim.images import center_crop_resize

    dataset, info = tfds.load("oxford_flowers102", split="test", data_dir=data_dir, with_info=True)
    label = info.features["label"].str2int(name)
    for example in tfds.as_numpy(dataset):
        if example["label"] == label:
            return center_crop_resize(example["image"], SIZE)
    raise SystemExit(f"error: no {name} in the test split")


def sketch():
    """A flower in flat colours: yellow petals round a brown disc on a green stem, over a blue-green ground."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIZE, SIZE), (70, 110, 60))
    draw = ImageDraw.Draw(image)
    draw.rectangle((30, 36, 33, SIZE), fill=(40, 90, 30))
    centre, radius = (32, 28), 12
    for k in range(10):
        angle = 2 * math.pi * k / 10
        x, y = centre[0] + radius * math.cos(angle), centre[1] + radius * math.sin(angle)
        draw.ellipse((x - 7, y - 7, x + 7, y + 7), fill=(240, 200, 40))
    draw.ellipse((centre[0] - 8, centre[1] - 8, centre[0] + 8, centre[1] + 8), fill=(110, 60, 20))
    return image


def hole():
    """White (fill) in a 24x24 square in the middle, black (keep) elsewhere."""
    mask = np.zeros((SIZE, SIZE), np.uint8)
    mask[20:44, 20:44] = 255
    return mask


def main(argv=None) -> None:
    from PIL import Image

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/examples"))
    parser.add_argument("--data-dir", default=None, help="TFDS's data directory (default: $TFDS_DATA_DIR)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in PHOTOS:
        Image.fromarray(flowers_photo(name, args.data_dir)).save(args.out / f"{name}.jpg", quality=90)
    sketch().save(args.out / "sketch.png")
    Image.fromarray(hole()).save(args.out / "hole.png")
    for path in sorted(args.out.iterdir()):
        print(f"{path} {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
