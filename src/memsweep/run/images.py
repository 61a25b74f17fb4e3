"""Images for `task=image_classification`: scikit-learn's handwritten digits, the labelled images that ship
with an installed package (1,797 grey 8x8 scans of the digits 0-9, `sklearn.datasets.load_digits`).

Each image is resized to the model's input (`image_size` x `image_size`, bilinear: 8x8 becomes the patch grid
of a ViT whose image is 8 patches wide, and is upsampled further for a larger grid), repeated over the model's
`num_channels`, and scaled as ViT's image processors scale pixels (mean 0.5, std 0.5: values in [-1, 1]).
The split is stratified by class and seeded, as the text data's is; the resizing is done per image as a batch
is drawn, so a 224-pixel model holds only the 8x8 originals.

As for text (run/data.py), no image is left out silently: one whose label is missing or no digit is refused (or
dropped under data.drop_invalid=true), and the images data.labels leaves out are counted (RowCounts).
"""
from dataclasses import dataclass, field
from typing import NamedTuple

from ..config.schema import DataConf
from ..errors import ConfigError
from .results import RowCounts

# sklearn's digits hold pixel intensities 0..16 (the count of set pixels in each 4x4 block of the 32x32 scan)
DIGITS_MAX = 16.0
# ViT's image processors (google/vit-*) normalise each channel with mean 0.5 and std 0.5
MEAN, STD = 0.5, 0.5


def digits():
    """(images as an N x 8 x 8 float array, integer labels) of scikit-learn's digits."""
    from sklearn.datasets import load_digits

    found = load_digits()
    return found.images.astype("float32"), found.target


class Split(NamedTuple):
    """The held-out split of the digits `data.labels` keeps, their label names, and what became of the images."""
    train_x: object  # N x 8 x 8 float arrays
    train_y: list[int]
    eval_x: object
    eval_y: list[int]
    names: list[str]
    rows: RowCounts


def usable(cfg: DataConf, labels) -> tuple[list[bool], RowCounts]:
    """Which images to keep (a label data.labels names), and the count of each kind left out: a label that is
    missing or no digit 0-9 cannot be used (refused, with the first image's 0-based index, unless
    data.drop_invalid=true), a digit data.labels does not name is left out on purpose."""
    names = [str(d) for d in range(10)] if cfg.labels is None else [str(x) for x in cfg.labels]
    digit = [str(y) in {str(d) for d in range(10)} for y in labels]  # NaN, None, -1: no digit
    if not all(digit) and not cfg.drop_invalid:
        first = digit.index(False)
        raise ConfigError("data.drop_invalid", f"false, and {digit.count(False)} of the {len(labels)} digits' images "
                                               f"have a label that is no digit 0-9 (the first: index {first}, 0-based, "
                                               f"label {labels[first]!r}); allowed: true to drop them (counted on the "
                                               "console and in results.json)")
    keep = [ok and str(y) in names for ok, y in zip(digit, labels)]
    outside = sum(ok and not kept for ok, kept in zip(digit, keep))
    return keep, RowCounts(len(labels), digit.count(False), outside, 0)


def split(cfg: DataConf, seed: int, strict_sizes: bool = False) -> Split:
    """The digits `data.labels` keeps, eval_size images held out, stratified by class and seeded; train_size of
    the rest (null: all of it)."""
    from sklearn.model_selection import train_test_split

    images, labels = digits()
    names = [str(d) for d in range(10)] if cfg.labels is None else [str(x) for x in cfg.labels]
    unknown = sorted(set(names) - {str(d) for d in range(10)})
    if unknown or len(set(names)) < 2:
        raise ConfigError("data.labels", f"{names} is not allowed; allowed: two or more of the digits 0-9 (null: all)")
    keep, rows = usable(cfg, list(labels))
    images, labels = images[keep], [names.index(str(y)) for y, kept in zip(labels, keep) if kept]
    if not 10 <= cfg.eval_size < len(images) - 10:  # each split needs an image of each of the 10 classes
        raise ConfigError("data.eval_size", f"{cfg.eval_size} is not allowed for the {len(images)} digits; allowed: "
                                            f"10 to {len(images) - 11}")
    train_x, eval_x, train_y, eval_y = train_test_split(images, labels, test_size=cfg.eval_size, stratify=labels,
                                                        random_state=seed)
    if cfg.train_size is not None and cfg.train_size < len(train_x):
        if cfg.train_size < 10:
            raise ConfigError("data.train_size", f"{cfg.train_size} is below the 10 classes; allowed: 10 to "
                                                 f"{len(train_x)} (or null: all)")
        train_x, _, train_y, _ = train_test_split(train_x, train_y, train_size=cfg.train_size, stratify=train_y,
                                                  random_state=seed)
    elif strict_sizes and cfg.train_size is not None and cfg.train_size > len(train_x):
        raise ConfigError("data.train_size", f"{cfg.train_size} is more than the {len(train_x)} digits left for "
                                             f"training; allowed: up to {len(train_x)} (or null: all)")
    return Split(train_x, train_y, eval_x, eval_y, names, rows)


class Resized:
    """A torch dataset of {pixel_values, labels}: each 8x8 digit resized to the model's input as it is drawn."""

    def __init__(self, images, labels, image_size: int, channels: int):
        import torch

        self.images = torch.as_tensor(images)[:, None] / DIGITS_MAX
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self.image_size, self.channels = image_size, channels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        import torch.nn.functional as F

        image = F.interpolate(self.images[i:i + 1], size=(self.image_size, self.image_size), mode="bilinear",
                              align_corners=False)[0]
        return {"pixel_values": ((image - MEAN) / STD).expand(self.channels, -1, -1).contiguous(),
                "labels": self.labels[i]}


@dataclass
class ImageData:
    train: Resized
    eval: Resized
    label_names: list[str]
    rows: RowCounts = field(default_factory=RowCounts)


def tokens(model_config) -> int:
    """The sequence an image is to a ViT-style model: its patch grid and a class token."""
    size, patch = model_config.image_size, model_config.patch_size
    size = size[0] if isinstance(size, (list, tuple)) else size
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    return (int(size) // int(patch)) ** 2 + 1


def load(cfg: DataConf, seed: int, model_config) -> ImageData:
    """The train and eval splits at the model's input size (`image_size`, `num_channels` of its config)."""
    train_x, train_y, eval_x, eval_y, names, rows = split(cfg, seed)
    size, channels = int(model_config.image_size), int(getattr(model_config, "num_channels", 3))
    return ImageData(Resized(train_x, train_y, size, channels), Resized(eval_x, eval_y, size, channels), names, rows)
