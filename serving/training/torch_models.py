"""The PyTorch model families a recipe can name: an MLP for tables and a small CNN for images.

Both take rows of float32 features and carry their own standardisation (the training rows' mean and
standard deviation, as buffers), so the exported model answers raw rows: the artifact needs no
preprocessing script.
"""

from __future__ import annotations

import torch
from torch import nn

from serving.training.run_records import Hyperparameters, Stats

__all__ = ["build_model"]


class Standardize(nn.Module):
    """(x - mean) / std with the training rows' statistics, saved with the weights."""

    def __init__(self, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer(
            "std", torch.tensor([s if s > 0 else 1.0 for s in std], dtype=torch.float32)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std  # type: ignore[operator]


class MLP(nn.Module):
    """Standardize → (Linear → ReLU → Dropout)* → Linear."""

    def __init__(
        self, features: int, outputs: int, mean, std, hidden=(64, 64), dropout: float = 0.0
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [Standardize(mean, std)]
        width = features
        for size in hidden:
            layers += [nn.Linear(width, int(size)), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(float(dropout)))
            width = int(size)
        layers.append(nn.Linear(width, outputs))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """Rows reshaped to (channels, height, width) images → (Conv → ReLU)* → pool → Linear → ReLU →
    Linear."""

    def __init__(
        self,
        features: int,
        outputs: int,
        mean,
        std,
        image_shape,
        channels=(16, 32),
        hidden: int = 64,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        c, h, w = (int(v) for v in image_shape)
        if c * h * w != features:
            raise ValueError(
                f"data.image_shape {list(image_shape)} holds {c * h * w} values, the rows {features}"
            )
        self.shape = (c, h, w)
        self.standardize = Standardize(mean, std)
        convs: list[nn.Module] = []
        width = c
        for size in channels:
            convs += [nn.Conv2d(width, int(size), kernel_size=3, padding=1), nn.ReLU()]
            width = int(size)
        self.features = nn.Sequential(*convs, nn.AdaptiveAvgPool2d((2, 2)), nn.Flatten())
        head: list[nn.Module] = [nn.Linear(width * 4, int(hidden)), nn.ReLU()]
        if dropout:
            head.append(nn.Dropout(float(dropout)))
        head.append(nn.Linear(int(hidden), outputs))
        self.head = nn.Sequential(*head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = self.standardize(x).reshape(-1, *self.shape)
        return self.head(self.features(images))


ALLOWED = {"mlp": {"hidden", "dropout"}, "cnn": {"channels", "hidden", "dropout"}}


def build_model(
    family: str, hyperparameters: Hyperparameters, features: int, outputs: int, stats: Stats
) -> nn.Module:
    """The recipe's model, with standardisation from `stats` (mean, std, image_shape)."""
    unknown = sorted(set(hyperparameters) - ALLOWED[family])
    if unknown:
        raise ValueError(
            f"model.hyperparameters: {', '.join(unknown)} not a {family} hyperparameter "
            f"({', '.join(sorted(ALLOWED[family]))})"
        )
    if family == "mlp":
        return MLP(features, outputs, stats["mean"], stats["std"], **hyperparameters)
    shape = stats.get("image_shape") or _square(features)
    return CNN(features, outputs, stats["mean"], stats["std"], shape, **hyperparameters)


def _square(features: int) -> list[int]:
    side = int(round(features**0.5))
    if side * side != features:
        raise ValueError(
            f"data.image_shape: {features} features are not a square image; give [c, h, w]"
        )
    return [1, side, side]
