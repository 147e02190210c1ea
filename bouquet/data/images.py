"""Image data for the vision task: loaders and non-IID partitions (no torch needed).

Sources (``vision-dataset``):

``digits``
    scikit-learn's ``load_digits`` (1,797 real 8 x 8 handwritten digits,
    10 classes, shipped inside the package: works offline, the embedded
    default and what the tests use); a seeded stratified 80/20 split.
``imagefolder``
    A directory in the ImageFolder layout ``<root>/train/<class>/*.jpg`` and
    ``<root>/test/<class>/*.jpg`` (classes in sorted order), or a ``.tar.gz``
    of it (e.g. ``../shared/data/cifar10/cifar10-jpeg.tar.gz``), extracted
    once into the cache.  Decoded images are cached as one ``.npz`` per
    archive content (per path for a folder; the cache dir is
    ``$BOUQUET_CACHE_DIR`` or ``~/.cache/bouquet``).

Partitions (``vision-partitioner``):

``shards``
    The SCKM paper's (after McMahan et al. 2017): sort the training set by
    label, cut it into ``num_clients * shards_per_client`` equal shards and
    give every client ``shards_per_client`` shards drawn at random.
``dirichlet``
    Per class, client proportions ~ Dirichlet(alpha) (Hsu et al. 2019).

Why not flwr-datasets' ``ShardPartitioner``/``DirichletPartitioner``: they
need Hugging Face ``datasets`` + ``pyarrow`` (~100 MB) for what is a few
lines of numpy here; our functions take index arrays and a Generator, and a
test checks the shard invariants the paper states.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from bouquet.params import RunConfigKeys, require

__all__ = ["GROUPINGS", "SYMMETRIES", "ImageData", "VisionDataParams", "client_test_rows", "dirichlet_partition",
           "group_assignment", "group_of", "group_permutation", "grouped", "iid_partition", "load_images", "partition",
           "shard_partition", "validation_rows"]

log = logging.getLogger(__name__)

DATASETS = ("digits", "imagefolder")
PARTITIONERS = ("shards", "dirichlet", "iid")
#: Benchmarks with known client groups: none, rotated images (90 degrees x group), permuted labels.
GROUPINGS = ("none", "rotate", "permute")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


@dataclass(frozen=True)
class VisionDataParams:
    """Where the images come from, how they are split over clients, and the clients' known groups.

    Parameters
    ----------
    dataset : {"digits", "imagefolder"}, default "digits"
        scikit-learn's 8x8 digits (offline, small), or an ImageFolder tree such as CIFAR-10's JPEGs.
    path : str
        The ImageFolder folder or ``.tar.gz`` (``imagefolder``).
    partitioner : {"shards", "dirichlet", "iid"}, default "shards"
        Label-sorted shards (the SCKM paper), Dirichlet label proportions, or an IID split.
    shards_per_client : int, default 2
        ``shards``: label-sorted shards each client holds (the SCKM paper: 2).
    dirichlet_alpha : float, default 0.5
        ``dirichlet``: the concentration of each client's label proportions (smaller: less alike).
    seed : int, default 0
        Seeds the partition, the label permutations and the clients' test subsets.
    groups : {"none", "rotate", "permute"}, default "none"
        Known client groups (the clustered-FL benchmarks): the clients are dealt to the groups in equal
        numbers (sizes differ by at most one) in an order drawn from ``seed`` (:func:`group_assignment`);
        ``rotate`` turns a group's images by ``90 x (group mod 4)`` degrees, mirrored left to right for groups
        4-7 (the eight symmetries of the square: at most 8 groups), ``permute`` maps its labels through a
        seeded permutation per group (group 0 unchanged).
    num_groups : int, default 4
        Known groups with ``groups`` other than ``none``.
    client_test_size : int, default 0
        Test images each client holds (a seeded subset of the test set, in its group's form) for
        evaluation on the clients; 0: none (the server scores models centrally).
    validation_fraction : float, default 0.0
        ``validation-fraction`` (the water task's key): the share of each client's training images held out
        (a seeded subset, at least one image when > 0) and scored each round as ``val-accuracy`` and
        ``val-loss``; in [0, 0.5].
    score_test : bool, default True
        ``score-test`` (the water task's key): False locks the test images: no client scores them (a study's
        tuning runs read validation only) and the server's central evaluation is refused.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys(
        rename={"dataset": "vision-dataset", "path": "vision-data-path", "partitioner": "vision-partitioner",
                "seed": "data-seed", "groups": "vision-groups", "num_groups": "vision-num-groups",
                "client_test_size": "vision-client-test-size", "validation_fraction": "validation-fraction",
                "score_test": "score-test"},
    )

    dataset: str = "digits"
    path: str = ""
    partitioner: str = "shards"
    shards_per_client: int = 2
    dirichlet_alpha: float = 0.5
    seed: int = 0
    groups: str = "none"
    num_groups: int = 4
    client_test_size: int = 0
    validation_fraction: float = 0.0
    score_test: bool = True

    def __post_init__(self) -> None:
        require(self.dataset in DATASETS, "dataset", f"vision-dataset must be one of {DATASETS}, got {self.dataset!r}")
        require(self.dataset != "imagefolder" or bool(self.path), "path",
                "vision-dataset = 'imagefolder' needs vision-data-path (a folder or .tar.gz)")
        require(self.partitioner in PARTITIONERS, "partitioner",
                f"vision-partitioner must be one of {PARTITIONERS}, got {self.partitioner!r}")
        require(self.shards_per_client >= 1, "shards_per_client",
                f"shards-per-client must be >= 1, got {self.shards_per_client}")
        require(self.dirichlet_alpha > 0, "dirichlet_alpha", f"dirichlet-alpha must be > 0, got {self.dirichlet_alpha}")
        require(self.groups in GROUPINGS, "groups", f"vision-groups must be one of {GROUPINGS}, got {self.groups!r}")
        require(self.num_groups >= 1, "num_groups", f"vision-num-groups must be >= 1, got {self.num_groups}")
        require(self.groups != "rotate" or self.num_groups <= len(SYMMETRIES), "num_groups",
                f"vision-groups = 'rotate' has {len(SYMMETRIES)} distinct forms (4 turns, mirrored or not): "
                f"vision-num-groups must be <= {len(SYMMETRIES)}, got {self.num_groups}")
        require(0.0 <= self.validation_fraction <= 0.5, "validation_fraction",
                f"validation-fraction must be in [0, 0.5], got {self.validation_fraction}")
        require(self.client_test_size >= 0, "client_test_size",
                f"vision-client-test-size must be >= 0, got {self.client_test_size}")


@dataclass(frozen=True)
class ImageData:
    """Train and test images, uint8 (0-255), shape (N, channels, height, width).

    Kept as bytes (CIFAR-10's 50,000 training images are 150 MB so, 600 MB
    as float32); :func:`bouquet.tasks.vision.batch_at` scales a batch to
    [0, 1] floats.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])  # type: ignore[return-value]


def _cache_dir() -> Path:
    return Path(os.environ.get("BOUQUET_CACHE_DIR", Path.home() / ".cache" / "bouquet"))


def load_images(config: VisionDataParams) -> ImageData:
    """Load the configured dataset (see the module docstring)."""
    if config.dataset == "digits":
        return _digits(config.seed)
    return _image_folder(Path(config.path))


def _digits(seed: int) -> ImageData:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return ImageData(x_tr, y_tr, x_te, y_te, tuple(str(c) for c in range(10)))


def _image_folder(source: Path) -> ImageData:
    if not source.exists():
        raise FileNotFoundError(f"image data not found: {source}")
    key = _source_key(source)
    cached = _cache_dir() / f"images-{key}.npz"
    if cached.exists():
        with np.load(cached) as z:
            return ImageData(z["x_train"], z["y_train"], z["x_test"], z["y_test"], tuple(z["classes"].tolist()))
    root = _extracted(source, key) if source.is_file() else source
    train, test = _find_split(root, "train"), _find_split(root, "test")
    classes = tuple(sorted(p.name for p in train.iterdir() if p.is_dir()))
    if not classes:
        raise ValueError(f"{train} has no class folders (expected <root>/train/<class>/*.jpg)")
    x_tr, y_tr = _decode(train, classes)
    x_te, y_te = _decode(test, classes)
    cached.parent.mkdir(parents=True, exist_ok=True)
    # a name of this process's own: two runs that load a new source at once must not write one file
    tmp = cached.with_name(f"{cached.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te, classes=np.array(classes))
    os.replace(tmp, cached)
    return ImageData(x_tr, y_tr, x_te, y_te, classes)


def _source_key(source: Path) -> str:
    """Cache key: an archive's content (a copy, or the same file with a new mtime, hits the cache), a folder's path and stat."""
    if source.is_file():
        with source.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()[:16]
    stat = source.stat()
    return hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def _find_split(root: Path, name: str) -> Path:
    hits = [root / name] + sorted(p for p in root.glob(f"*/{name}") if p.is_dir())
    for hit in hits:
        if hit.is_dir():
            return hit
    raise ValueError(f"no '{name}' folder under {root} (expected the ImageFolder layout {name}/<class>/*.jpg)")


def _extracted(archive: Path, key: str) -> Path:
    """Extract ``archive`` once into the cache; the folder appears whole or not at all.

    Each process extracts into a folder of its own and renames it into place, so
    runs that start together on a new archive never read, or write into, one
    another's half-extracted files; the one that renames last drops its copy.
    """
    target = _cache_dir() / f"images-{key}"
    if (target / ".complete").exists():
        return target
    log.info("extracting %s into %s (once)", archive, target)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(partial, filter="data")
    (partial / ".complete").touch()
    if target.exists() and not (target / ".complete").exists():
        shutil.rmtree(target, ignore_errors=True)  # left by an extraction that was cut short
    try:
        partial.rename(target)
    except OSError:  # another process put its whole copy there first
        shutil.rmtree(partial, ignore_errors=True)
    return target


def _decode(split: Path, classes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    images, labels = [], []
    for label, name in enumerate(classes):
        folder = split / name
        if not folder.is_dir():
            raise ValueError(f"class folder {folder} is missing")
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        for path in files:
            with Image.open(path) as img:
                images.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
            labels.append(label)
        log.info("decoded %s/%s: %d images", split.name, name, len(files))
    shapes = {im.shape for im in images}
    if len(shapes) != 1:
        raise ValueError(f"images in {split} differ in size: {sorted(shapes)[:3]}")
    return np.stack(images).transpose(0, 3, 1, 2), np.array(labels, dtype=np.int64)


# --------------------------------------------------------------- partitions
def shard_partition(labels: np.ndarray, num_clients: int, shards_per_client: int,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """Label-sorted shards: ``num_clients * shards_per_client`` equal shards, S at random per client.

    Samples are sorted by label (ties in a seeded random order), the first
    ``n_shards * floor(N / n_shards)`` are cut into equal shards (the
    remainder, fewer than ``n_shards`` samples, is left out), and a seeded
    permutation of the shards gives each client ``shards_per_client``.

    Returns
    -------
    list of int64 arrays
        Training-set indices per client.
    """
    labels = np.asarray(labels)
    n_shards = num_clients * shards_per_client
    if num_clients < 1 or shards_per_client < 1:
        raise ValueError("num_clients and shards_per_client must be >= 1")
    if n_shards > len(labels):
        raise ValueError(f"{n_shards} shards need at least that many samples, have {len(labels)}")
    order = np.lexsort((rng.permutation(len(labels)), labels))
    size = len(labels) // n_shards
    shards = order[:n_shards * size].reshape(n_shards, size)
    assignment = rng.permutation(n_shards).reshape(num_clients, shards_per_client)
    return [np.sort(shards[row].ravel()) for row in assignment]


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                        min_size: int = 1, max_tries: int = 100) -> list[np.ndarray]:
    """Per-class Dirichlet(alpha) proportions over clients; redrawn until every client has ``min_size``."""
    labels = np.asarray(labels)
    if num_clients < 1 or alpha <= 0:
        raise ValueError("num_clients must be >= 1 and alpha > 0")
    if num_clients * min_size > len(labels):
        raise ValueError(f"{num_clients} clients x {min_size} samples exceed the {len(labels)} available")
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for cls in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == cls))
            cuts = (np.cumsum(rng.dirichlet(np.full(num_clients, alpha)))[:-1] * len(members)).astype(int)
            for client, chunk in enumerate(np.split(members, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.array(p, dtype=np.int64)) for p in parts]
    raise ValueError(f"no Dirichlet({alpha}) draw gave every client {min_size} samples in {max_tries} tries")


def iid_partition(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A seeded random split of ``num_samples`` into ``num_clients`` parts of (nearly) equal size."""
    if not 1 <= num_clients <= num_samples:
        raise ValueError(f"need 1 <= num_clients <= {num_samples} samples, got {num_clients}")
    return [np.sort(part) for part in np.array_split(rng.permutation(num_samples), num_clients)]


def partition(labels: np.ndarray, num_clients: int, config: VisionDataParams) -> list[np.ndarray]:
    """The configured partition of ``labels`` over ``num_clients`` (seeded by ``config.seed``)."""
    rng = np.random.default_rng([config.seed, num_clients])
    if config.partitioner == "shards":
        return shard_partition(labels, num_clients, config.shards_per_client, rng)
    if config.partitioner == "iid":
        return iid_partition(len(labels), num_clients, rng)
    return dirichlet_partition(labels, num_clients, config.dirichlet_alpha, rng)


# ----------------------------------------------------------- known groups
#: The ``rotate`` groups' forms: (quarter turns, mirrored), group g taking form g.
SYMMETRIES = tuple((turns, mirrored) for mirrored in (False, True) for turns in range(4))


def group_assignment(num_partitions: int, config: VisionDataParams) -> np.ndarray:
    """Each client's group: ``k % num_groups`` over the clients, in an order drawn from ``config.seed``
    (the data seed redraws which clients share a group).

    Raises ValueError, naming ``vision-num-groups``, when there are fewer clients than groups.
    """
    if num_partitions < config.num_groups:
        raise ValueError(f"vision-num-groups = {config.num_groups} needs at least as many clients "
                         f"(num-supernodes), got {num_partitions}")
    rng = np.random.default_rng([config.seed, 29, num_partitions])
    return rng.permutation(np.arange(num_partitions) % config.num_groups)


def group_of(partition_id: int, config: VisionDataParams, num_partitions: int) -> int | None:
    """Client ``partition_id``'s group (:func:`group_assignment`), or None without groups."""
    if config.groups == "none":
        return None
    return int(group_assignment(num_partitions, config)[partition_id])


def group_permutation(group: int, num_classes: int, seed: int) -> np.ndarray:
    """The label map of ``group`` (identity for group 0, else a seeded permutation)."""
    if group == 0:
        return np.arange(num_classes)
    return np.random.default_rng([seed, 17, group]).permutation(num_classes)


def grouped(x: np.ndarray, y: np.ndarray, group: int | None, num_classes: int,
            config: VisionDataParams) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels as a client of ``group`` sees them (unchanged without groups).

    ``rotate``: each image (N, C, H, W) turned by ``group mod 4`` quarter turns, and mirrored left to right
    for groups 4-7 (:data:`SYMMETRIES`); ``permute``: labels mapped by :func:`group_permutation`.  Inputs are
    not modified.
    """
    if group is None or config.groups == "none":
        return x, y
    if config.groups == "rotate":
        turns, mirrored = SYMMETRIES[group]
        turned = np.rot90(x, k=turns, axes=(2, 3))
        return np.ascontiguousarray(turned[..., ::-1] if mirrored else turned), y
    return x, group_permutation(group, num_classes, config.seed)[y]


def validation_rows(num_rows: int, partition_id: int, config: VisionDataParams) -> np.ndarray:
    """Which of a client's ``num_rows`` training images it holds out for validation (seeded positions,
    ``round(validation_fraction x num_rows)`` of them, at least one when the fraction is > 0).

    Raises ValueError, naming ``validation-fraction``, when that leaves the client no training image.
    """
    if config.validation_fraction <= 0:
        return np.zeros(0, dtype=int)
    size = max(1, round(config.validation_fraction * num_rows))
    if size >= num_rows:
        raise ValueError(f"validation-fraction = {config.validation_fraction} leaves client {partition_id} no "
                         f"training image (it holds {num_rows}): lower it, or use fewer clients")
    return np.sort(np.random.default_rng([config.seed, 5, partition_id]).choice(num_rows, size=size, replace=False))


def client_test_rows(num_test: int, partition_id: int, config: VisionDataParams) -> np.ndarray:
    """The test-set rows client ``partition_id`` evaluates on (``client_test_size`` of them, seeded)."""
    size = min(config.client_test_size, num_test)
    return np.sort(np.random.default_rng([config.seed, 3, partition_id]).choice(num_test, size=size, replace=False))
