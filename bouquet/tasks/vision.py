"""The vision task: image classifiers, local mini-batch SGD, accuracy, gradient sketches.

Models (``vision-model``):

``cnn``
    A small CPU-friendly CNN (two 3x3 conv + max-pool blocks, two linear
    layers); works on any image of at least 4 x 4 pixels (digits 8 x 8,
    CIFAR 32 x 32).
``vgg16``
    The CIFAR-style VGG-16 the SCKM paper trains: the 13 conv layers of
    configuration "D" (Simonyan & Zisserman 2015), 3x3 kernels, ReLU, five
    2x2 max-pools, no batch norm (the original VGG; batch-norm buffers would
    also be averaged by FedAvg, a choice the paper does not discuss), then a
    512 -> classes linear classifier: 14.7 M parameters for 10 classes
    (torchvision's ImageNet VGG-16 has 134 M in its 4096-wide head).  Needs
    32 x 32 inputs.  Written in plain torch: torchvision on this machine
    only exists as CUDA builds (5 GB), which an edge box does not want.

Clients train a fixed number of mini-batches per round (SGD), the SCKM
paper's protocol; :func:`gradient_sketch` computes the loss and the sampled
gradient coordinates at the received model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from bouquet.algorithms.sckm import sketch_indices

__all__ = [
    "MODELS",
    "VGG16",
    "SmallCNN",
    "VisionTrainSettings",
    "accuracy",
    "batch_at",
    "batch_indices",
    "gradient_sketch",
    "make_model",
    "to_tensor",
    "train_batches",
]

MODELS = ("cnn", "vgg16")
VGG16_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class SmallCNN(nn.Module):
    """conv(32)-pool-conv(64)-pool-linear(128)-linear(classes)."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int) -> None:
        super().__init__()
        if image_size < 4:
            raise ValueError(f"SmallCNN needs images of at least 4 x 4 pixels, got {image_size}")
        side = image_size // 4
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * side * side, 128), nn.ReLU(),
                                        nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class VGG16(nn.Module):
    """CIFAR-style VGG-16 (configuration D, no batch norm) with a 512 -> classes classifier."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int = 32) -> None:
        super().__init__()
        if image_size != 32:
            raise ValueError(f"VGG16 here is the CIFAR variant and needs 32 x 32 images, got {image_size}")
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG16_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(channels, int(item), 3, padding=1), nn.ReLU()]
                channels = int(item)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def make_model(name: str, shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """``cnn`` or ``vgg16`` for images of ``shape`` = (channels, height, width)."""
    channels, height, width = shape
    if height != width:
        raise ValueError(f"square images expected, got {height} x {width}")
    if name == "cnn":
        return SmallCNN(channels, num_classes, height)
    if name == "vgg16":
        return VGG16(channels, num_classes, height)
    raise ValueError(f"vision-model must be one of {MODELS}, got {name!r}")


@dataclass(frozen=True)
class VisionTrainSettings:
    """Local training: ``local_batches`` SGD steps of ``batch_size`` at ``learning_rate``."""

    local_batches: int = 10
    batch_size: int = 32
    learning_rate: float = 0.1
    momentum: float = 0.0

    def __post_init__(self) -> None:
        if self.local_batches < 1 or self.batch_size < 1:
            raise ValueError(f"local-batches and batch-size must be >= 1, got {self.local_batches}, {self.batch_size}")
        if self.learning_rate <= 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"need learning-rate > 0 and 0 <= momentum < 1, got {self.learning_rate}, {self.momentum}")


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 images (N, C, H, W) -> float32 in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32) / 255.0)


def batch_indices(n: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of one mini-batch drawn without replacement from ``n`` samples (all when fewer)."""
    return np.sort(rng.choice(n, size=min(batch_size, n), replace=False))


def batch_at(x: np.ndarray, y: np.ndarray, batch_size: int,
             rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One mini-batch of images (scaled to [0, 1]) and labels, by :func:`batch_indices`."""
    pick = batch_indices(len(y), batch_size, rng)
    return to_tensor(x[pick]), torch.from_numpy(y[pick])


def train_batches(model: nn.Module, x: np.ndarray, y: np.ndarray, settings: VisionTrainSettings,
                  rng: np.random.Generator,
                  penalty: Callable[[nn.Module], torch.Tensor] | None = None) -> float:
    """``local_batches`` SGD steps on random mini-batches; returns the mean training loss.

    ``penalty(model)`` is added to each batch loss (FedProx's proximal term,
    :func:`bouquet.tasks.water.proximal_penalty`); the reported loss excludes it.
    """
    if len(y) == 0:
        raise ValueError("this client has no training images")
    model.train()
    optimiser = torch.optim.SGD(model.parameters(), lr=settings.learning_rate, momentum=settings.momentum)
    losses = []
    for _ in range(settings.local_batches):
        xb, yb = batch_at(x, y, settings.batch_size, rng)
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        (loss if penalty is None else loss + penalty(model)).backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    return float(np.mean(losses))


@torch.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 512) -> tuple[float, float]:
    """(accuracy in [0, 1], mean cross-entropy) of ``model`` on ``(x, y)``."""
    model.eval()
    correct, total_loss = 0, 0.0
    for start in range(0, len(y), batch_size):
        xb = to_tensor(x[start:start + batch_size])
        yb = torch.from_numpy(y[start:start + batch_size])
        logits = model(xb)
        total_loss += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(dim=1) == yb).sum())
    return correct / len(y), total_loss / len(y)


def gradient_sketch(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], fraction: float,
                    seed: list[int] | int,
                    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
                    ) -> tuple[np.ndarray, float, list[int]]:
    """Loss and sketch of the gradient at ``model``'s current weights on one batch.

    The sketch is ``fraction`` of the coordinates of every trainable
    parameter tensor (in ``named_parameters`` order), chosen by
    :func:`bouquet.algorithms.sckm.sketch_indices` from ``seed``, so every
    client with the same model and seed samples the same coordinates.

    Returns
    -------
    (sketch, loss, layer sketch sizes)
        float32 vector of length d', the batch loss, and the number of
        sketched coordinates per parameter tensor.
    """
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    model.zero_grad()
    model.train()
    xb, yb = batch
    loss = loss_fn(model(xb), yb)
    grads = torch.autograd.grad(loss, params)
    picks = sketch_indices([p.numel() for p in params], fraction, seed)
    pieces = [g.detach().reshape(-1).numpy()[idx] for g, idx in zip(grads, picks)]
    return np.concatenate(pieces).astype(np.float32), float(loss.detach()), [len(i) for i in picks]
