"""The vision task: image classifiers, local mini-batch SGD, accuracy, gradient sketches.

Models (``vision-model``):

``cnn``
    A small CPU-friendly CNN (two 3x3 conv + max-pool blocks, two linear
    layers); works on any image of at least 4 x 4 pixels (digits 8 x 8,
    CIFAR 32 x 32).
``cnn-gn``
    Three conv blocks (3x3 conv, GroupNorm, ReLU, 2x2 max-pool; 32, 64
    and 128 channels), then one linear layer: 114 k parameters on CIFAR.
    GroupNorm normalises each image on its own, so there are no batch
    statistics to average or to keep local.  The CPU regime of the
    selection study (``experiments/sckm/profiles/regime.toml``), where the
    two-block ``cnn`` left chance too slowly to rank selectors.
``vgg16``
    The CIFAR-style VGG-16 the SCKM paper trains: the 13 conv layers of
    configuration "D" (Simonyan & Zisserman 2015), 3x3 kernels, ReLU, five
    2x2 max-pools, no batch norm (the original VGG; batch-norm buffers would
    also be averaged by FedAvg, a choice the paper does not discuss), then a
    512 -> classes linear classifier: 14.7 M parameters for 10 classes
    (torchvision's ImageNet VGG-16 has 134 M in its 4096-wide head).  Needs
    32 x 32 inputs.  Initialised as torchvision's VGG is (Kaiming-normal
    conv weights, fan-out, zero biases; classifier N(0, 0.01)): with
    PyTorch's default init the activations' RMS fell from 0.22 to 0.006
    over the 13 conv layers and the first layer's gradient-to-weight ratio
    was 3e-7, so the first layers did not train.  Written in plain torch:
    torchvision on this machine only exists as CUDA builds (5 GB), which an
    edge box does not want.
``vgg16-bn``
    The same with batch norm after every conv.  The norms use the batch's
    own statistics at evaluation too (``track_running_stats=False``), so
    the model has no running buffers for the server to average: averaging
    them is a choice neither paper discusses (FedBN keeps them local).

Clients train a fixed number of mini-batches per round (SGD), the SCKM
paper's protocol; :func:`gradient_sketch` computes the loss and the sampled
gradient coordinates at the received model.  Every function here computes
on the device the model's parameters are on (``vision-device``,
:func:`torch_device`); batches are built on the CPU and moved there.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from bouquet.algorithms.sckm import sketch_indices
from bouquet.data.images import (
    ImageData,
    VisionDataParams,
    client_test_rows,
    group_of,
    grouped,
    load_images,
    partition,
    validation_rows,
)
from bouquet.tasks.base import batch_indices, proximal_penalty
from bouquet.tasks.params import MODELS, VisionModelParams, VisionTrainParams

__all__ = [
    "MODELS",
    "VGG16",
    "GroupNormCNN",
    "SmallCNN",
    "VisionTask",
    "VisionTrainParams",
    "accuracy",
    "batch_at",
    "batch_indices",
    "gradient_sketch",
    "make_model",
    "to_tensor",
    "torch_device",
    "train_batches",
]

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


class GroupNormCNN(nn.Module):
    """Three conv(3x3)-GroupNorm-ReLU-maxpool blocks (32, 64, 128 channels), then linear(classes).

    Parameters
    ----------
    groups : int, default 8
        GroupNorm groups per block (4, 8 and 16 channels per group).
    """

    CHANNELS = (32, 64, 128)

    def __init__(self, in_channels: int, num_classes: int, image_size: int, groups: int = 8) -> None:
        super().__init__()
        if image_size < 8:
            raise ValueError(f"cnn-gn needs images of at least 8 x 8 pixels, got {image_size}")
        layers: list[nn.Module] = []
        channels = in_channels
        for width in self.CHANNELS:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.GroupNorm(groups, width), nn.ReLU(),
                       nn.MaxPool2d(2)]
            channels = width
        side = image_size // 8
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(channels * side * side, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class VGG16(nn.Module):
    """CIFAR-style VGG-16 (configuration D) with a 512 -> classes classifier, initialised as torchvision's.

    Parameters
    ----------
    batch_norm : bool, default False
        Batch norm (batch statistics, no running buffers) after every conv: ``vgg16-bn``.
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int = 32, batch_norm: bool = False) -> None:
        super().__init__()
        if image_size != 32:
            raise ValueError(f"VGG16 here is the CIFAR variant and needs 32 x 32 images, got {image_size}")
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG16_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            layers.append(nn.Conv2d(channels, int(item), 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(int(item), track_running_stats=False))
            layers.append(nn.ReLU())
            channels = int(item)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes))
        for module in self.modules():  # torchvision.models.VGG's init
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def make_model(name: str, shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """``cnn``, ``cnn-gn``, ``vgg16`` or ``vgg16-bn`` for images of ``shape`` = (channels, height, width)."""
    channels, height, width = shape
    if height != width:
        raise ValueError(f"square images expected, got {height} x {width}")
    if name == "cnn":
        return SmallCNN(channels, num_classes, height)
    if name == "cnn-gn":
        return GroupNormCNN(channels, num_classes, height)
    if name in ("vgg16", "vgg16-bn"):
        return VGG16(channels, num_classes, height, batch_norm=name == "vgg16-bn")
    raise ValueError(f"vision-model must be one of {MODELS}, got {name!r}")


def torch_device(name: str) -> torch.device:
    """The torch device of a ``vision-device`` value: ``auto`` is CUDA where torch sees one, else the CPU.

    Raises
    ------
    RuntimeError
        ``cuda`` or ``cuda:N`` asked for where torch sees no CUDA device (a CPU build of torch, no driver,
        or, in Flower's simulation, a node whose Ray actor holds no GPU).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"vision-device={name!r}, but torch {torch.__version__} sees no CUDA device here "
                           f"(CUDA build: {torch.version.cuda}); in a simulation, give each client a GPU with "
                           "client-resources-num-gpus (python -m bouquet.launch --gpus-per-client)")
    return torch.device(name)


def model_device(model: nn.Module) -> torch.device:
    """The device ``model``'s parameters are on."""
    return next(model.parameters()).device


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 images (N, C, H, W) -> float32 in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32) / 255.0)


def batch_at(x: np.ndarray, y: np.ndarray, batch_size: int,
             rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One mini-batch of images (scaled to [0, 1]) and labels, by :func:`batch_indices`."""
    pick = batch_indices(len(y), batch_size, rng)
    return to_tensor(x[pick]), torch.from_numpy(y[pick])


def train_batches(model: nn.Module, x: np.ndarray, y: np.ndarray, settings: VisionTrainParams,
                  rng: np.random.Generator,
                  penalty: Callable[[nn.Module], torch.Tensor] | None = None) -> float:
    """``local_batches`` SGD steps on random mini-batches; returns the mean training loss.

    ``penalty(model)`` is added to each batch loss (FedProx's proximal term,
    :func:`bouquet.tasks.water.proximal_penalty`); the reported loss excludes it.
    """
    if len(y) == 0:
        raise ValueError("this client has no training images")
    model.train()
    device = model_device(model)
    optimiser = torch.optim.SGD(model.parameters(), lr=settings.learning_rate, momentum=settings.momentum)
    losses = []
    for _ in range(settings.local_batches):
        xb, yb = (t.to(device) for t in batch_at(x, y, settings.batch_size, rng))
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
    device = model_device(model)
    correct, total_loss = 0, 0.0
    for start in range(0, len(y), batch_size):
        xb = to_tensor(x[start:start + batch_size]).to(device)
        yb = torch.from_numpy(y[start:start + batch_size]).to(device)
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
    xb, yb = (t.to(model_device(model)) for t in batch)
    loss = loss_fn(model(xb), yb)
    grads = torch.autograd.grad(loss, params)
    picks = sketch_indices([p.numel() for p in params], fraction, seed)
    pieces = [g.detach().reshape(-1).cpu().numpy()[idx] for g, idx in zip(grads, picks)]
    return np.concatenate(pieces).astype(np.float32), float(loss.detach()), [len(i) for i in picks]


@functools.lru_cache(maxsize=2)
def partitioned_images(data: VisionDataParams, num_partitions: int) -> tuple[ImageData, list[np.ndarray]]:
    """The decoded images and their client partition, once per worker process and run.

    A simulation worker serves many partitions in turn; re-reading the decoded image cache for each
    (0.1-0.5 s for CIFAR-10) cost more than the sketch or training step it was read for.
    """
    images = load_images(data)
    return images, partition(images.y_train, num_partitions, data)


@dataclass(frozen=True)
class NodeImages:
    """What one image client holds: its training shard, validation and test images, in its group's form.

    ``test_locked``: the test images are locked (``score-test = false``); ``x_test`` is then empty.
    """

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    shape: tuple[int, int, int]
    num_classes: int
    group: int | None
    x_val: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), dtype=np.uint8))
    y_val: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), dtype=np.int64))
    test_locked: bool = False


@functools.lru_cache(maxsize=8)
def node_shard(data: VisionDataParams, partition_id: int, num_partitions: int) -> NodeImages:
    """Client ``partition_id`` of ``num_partitions``: its shard, its validation and test subsets, its known group.

    With ``data.groups`` set, the images (rotate) or labels (permute) are those of the client's group
    (:func:`bouquet.data.images.grouped`), for training, validation and test alike.  ``validation-fraction``
    holds out part of the shard (:func:`bouquet.data.images.validation_rows`); ``score-test = false`` locks
    the test images (none are read), and then the client needs validation images.
    """
    images, parts = partitioned_images(data, num_partitions)
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside 0..{num_partitions - 1}")
    if not data.score_test and data.validation_fraction <= 0:
        raise ValueError("score-test = false locks the test images, and validation-fraction = 0 leaves nothing "
                         "to score: set validation-fraction > 0")
    rows = parts[partition_id]
    held = validation_rows(len(rows), partition_id, data)
    group = group_of(partition_id, data, num_partitions)
    classes = len(images.classes)
    x, y = grouped(images.x_train[rows], images.y_train[rows], group, classes, data)
    keep = np.setdiff1d(np.arange(len(rows)), held)
    x_val, y_val = x[held], y[held]
    if held.size:
        x, y = x[keep], y[keep]
    if data.score_test:
        test = client_test_rows(len(images.y_test), partition_id, data)
    else:
        test = np.zeros(0, dtype=int)
    x_test, y_test = grouped(images.x_test[test], images.y_test[test], group, classes, data)
    return NodeImages(x, y, x_test, y_test, images.shape, classes, group, x_val, y_val, not data.score_test)


@dataclass(frozen=True)
class VisionTask:
    """One image-shard client of the SCKM paper's task: local SGD on its non-IID shard.

    Build it with :meth:`for_node`.  The SCKM study scores the global model centrally on the server;
    :meth:`evaluate` scores a model on the client's own test images when it holds some
    (``vision-client-test-size``, the clustered-FL benchmarks), else on its training shard.
    """

    partition_id: int
    images: NodeImages
    model: VisionModelParams
    training: VisionTrainParams
    household: str = ""

    @classmethod
    def for_node(cls, data: VisionDataParams, model: VisionModelParams, training: VisionTrainParams,
                 partition_id: int, num_partitions: int) -> VisionTask:
        return cls(partition_id, node_shard(data, partition_id, num_partitions), model, training)

    @property
    def x(self) -> np.ndarray:
        return self.images.x

    @property
    def y(self) -> np.ndarray:
        return self.images.y

    @property
    def group(self) -> str:
        """The client's known group ("" without groups)."""
        return "" if self.images.group is None else str(self.images.group)

    @property
    def num_examples(self) -> int:
        return len(self.y)

    def new_model(self) -> nn.Module:
        """A fresh model of the run's architecture on the run's ``vision-device``."""
        return make_model(self.model.name, self.images.shape, self.images.num_classes).to(
            torch_device(self.model.device))

    def training_batch(self, batch_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_at(self.x, self.y, batch_size, rng)

    def train(self, model: nn.Module, rng: np.random.Generator, proximal_mu: float) -> float:
        penalty = proximal_penalty(model, proximal_mu) if proximal_mu > 0 else None
        return train_batches(model, self.x, self.y, self.training, rng, penalty=penalty)

    def loss(self, model: nn.Module, examples: int, rng: np.random.Generator) -> tuple[float, int]:
        """Cross-entropy of ``model`` on up to ``examples`` of the client's training images."""
        pick = batch_indices(len(self.y), examples, rng)
        return accuracy(model, self.x[pick], self.y[pick])[1], len(pick)

    def evaluate(self, model: nn.Module, rng: np.random.Generator, final: bool = False) -> dict[str, float]:
        """Accuracy and loss of ``model`` on the client's test images (else, without any, its training shard),
        and on its validation images when it holds some (``val-*``).  With the test images locked only the
        validation images are scored (``num-examples`` is then their number)."""
        images = self.images
        metrics: dict[str, float] = {}
        if len(images.y_val):
            acc, loss = accuracy(model, images.x_val, images.y_val)
            metrics |= {"val-accuracy": acc, "val-loss": loss, "val-num-examples": len(images.y_val)}
        if images.test_locked:
            return metrics | {"num-examples": len(images.y_val)}
        x, y = (images.x_test, images.y_test) if len(images.y_test) else (self.x, self.y)
        acc, loss = accuracy(model, x, y)
        return metrics | {"accuracy": acc, "loss": loss, "num-examples": len(y)}

    def final_arrays(self, model: nn.Module) -> dict[str, dict[str, np.ndarray]]:
        """Nothing beside the metrics (no forecasts for images)."""
        return {}

    def final_info(self, model: nn.Module) -> dict[str, str]:
        return {}

    def poisoned(self, attack: str, scale: float) -> VisionTask:
        """This client with its training labels flipped (``label-flip``: ``y -> C - 1 - y``); tests unchanged."""
        if attack != "label-flip":
            raise ValueError(f"the vision task's data attack is 'label-flip', got {attack!r}")
        flipped = (self.images.num_classes - 1 - self.images.y).astype(self.images.y.dtype)
        return dataclasses.replace(self, images=dataclasses.replace(self.images, y=flipped))
