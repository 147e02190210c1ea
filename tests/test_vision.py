"""Vision data (digits, ImageFolder, shards, Dirichlet) and the vision task (models, SGD, sketches)."""

import shutil
import tarfile

import numpy as np
import pytest
import torch

from bouquet.algorithms.sckm import sketch_indices
from bouquet.data.images import (
    VisionDataParams,
    dirichlet_partition,
    load_images,
    partition,
    shard_partition,
)
from bouquet.tasks.vision import (
    VisionTrainParams,
    accuracy,
    batch_at,
    gradient_sketch,
    make_model,
    train_batches,
)


def test_digits_load_offline_as_bytes_with_a_stratified_split():
    data = load_images(VisionDataParams())
    assert data.x_train.dtype == np.uint8 and data.shape == (1, 8, 8)
    assert len(data.y_train) + len(data.y_test) == 1797 and len(data.classes) == 10
    train_share = np.bincount(data.y_train) / np.bincount(data.y_train + 0).sum()
    test_share = np.bincount(data.y_test) / len(data.y_test)
    np.testing.assert_allclose(train_share, test_share, atol=0.01)
    assert data.x_train.max() == 255


def test_shards_follow_the_paper():
    labels = np.repeat(np.arange(10), 60)  # 600 samples, 10 classes
    parts = shard_partition(labels, num_clients=10, shards_per_client=1, rng=np.random.default_rng(0))
    # S = 1 with class-aligned shards: every client holds one class, all distinct
    assert sorted(len(set(labels[p])) for p in parts) == [1] * 10
    assert sorted(int(labels[p][0]) for p in parts) == list(range(10))
    parts = shard_partition(labels, num_clients=10, shards_per_client=2, rng=np.random.default_rng(1))
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat.tolist())) == 600  # disjoint and complete (600 = 20 shards x 30)
    assert all(len(p) == 60 for p in parts) and all(len(set(labels[p])) <= 2 for p in parts)
    again = shard_partition(labels, 10, 2, np.random.default_rng(1))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(ValueError, match="shards need"):
        shard_partition(labels[:5], 10, 1, np.random.default_rng(0))


def test_dirichlet_covers_everything_once_and_skews_labels():
    labels = np.repeat(np.arange(5), 100)
    parts = dirichlet_partition(labels, 10, 0.1, np.random.default_rng(0), min_size=5)
    flat = np.concatenate(parts)
    assert sorted(flat.tolist()) == list(range(500)) and min(len(p) for p in parts) >= 5
    dominant = [np.bincount(labels[p], minlength=5).max() / len(p) for p in parts]
    assert np.mean(dominant) > 0.5  # alpha = 0.1: most clients are dominated by one class
    cfg = VisionDataParams(partitioner="dirichlet", dirichlet_alpha=100.0)
    even = partition(labels, 4, cfg)
    assert all(abs(len(p) - 125) < 40 for p in even)


def _image_folder(root, size=(6, 6), classes=("cat", "ant"), per=3):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per):
                Image.fromarray(rng.integers(0, 255, size=(*size, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def test_image_folder_and_its_tarball_load_with_sorted_classes(tmp_path):
    _image_folder(tmp_path / "imgs")
    data = load_images(VisionDataParams(dataset="imagefolder", path=str(tmp_path / "imgs")))
    assert data.classes == ("ant", "cat") and data.x_train.shape == (6, 3, 6, 6)
    assert np.bincount(data.y_train).tolist() == [3, 3]
    again = load_images(VisionDataParams(dataset="imagefolder", path=str(tmp_path / "imgs")))  # from the cache
    np.testing.assert_array_equal(again.x_test, data.x_test)
    with tarfile.open(tmp_path / "imgs.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "imgs", arcname="my-images")
    packed = load_images(VisionDataParams(dataset="imagefolder", path=str(tmp_path / "imgs.tar.gz")))
    np.testing.assert_array_equal(packed.x_train, data.x_train)


def _load_packed(path, queue):
    data = load_images(VisionDataParams(dataset="imagefolder", path=path))
    queue.put((data.x_train.tobytes(), data.y_train.tolist(), data.classes))


def _tarball(tmp_path, per=3):
    _image_folder(tmp_path / "imgs", per=per)
    with tarfile.open(tmp_path / "imgs.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "imgs", arcname="my-images")
    return tmp_path / "imgs.tar.gz"


def test_a_tarball_is_never_visible_half_extracted(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("BOUQUET_CACHE_DIR", str(cache))
    packed = _tarball(tmp_path)
    seen = []
    original = tarfile.TarFile.extractall

    def watching(self, path, *args, **kwargs):
        seen.append(sorted(p.name for p in cache.iterdir()))  # what another run would find mid-extraction
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "extractall", watching)
    data = load_images(VisionDataParams(dataset="imagefolder", path=str(packed)))
    assert len(seen) == 1 and all(not name.startswith("images-") or name.endswith(".partial") for name in seen[0])
    left = sorted(p.name for p in cache.iterdir())
    assert len(left) == 2 and left[1] == left[0] + ".npz"  # the whole folder and the decoded cache, nothing else
    assert (cache / left[0] / ".complete").exists() and data.x_train.shape == (6, 3, 6, 6)


def test_an_extraction_cut_short_is_redone(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("BOUQUET_CACHE_DIR", str(cache))
    packed = _tarball(tmp_path)
    first = load_images(VisionDataParams(dataset="imagefolder", path=str(packed)))
    folder = next(p for p in cache.iterdir() if p.is_dir())
    (folder / ".complete").unlink()  # as an older bouquet left it when killed mid-extraction
    shutil.rmtree(folder / "my-images" / "test")
    next(cache.glob("*.npz")).unlink()
    again = load_images(VisionDataParams(dataset="imagefolder", path=str(packed)))
    np.testing.assert_array_equal(again.x_test, first.x_test)
    assert (folder / ".complete").exists() and not list(cache.glob("*.partial"))


def test_runs_that_load_a_new_tarball_together_all_get_it_whole(tmp_path, monkeypatch):
    import multiprocessing

    cache = tmp_path / "cache"
    monkeypatch.setenv("BOUQUET_CACHE_DIR", str(cache))  # inherited by the spawned processes
    packed = _tarball(tmp_path, per=40)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_load_packed, args=(str(packed), queue)) for _ in range(4)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    alone = load_images(VisionDataParams(dataset="imagefolder", path=str(packed)))
    assert all(r == (alone.x_train.tobytes(), alone.y_train.tolist(), alone.classes) for r in results)
    assert len(list(cache.iterdir())) == 2  # one folder, one .npz: no partial copies or temporary files left


def test_image_folder_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="needs vision-data-path"):
        VisionDataParams(dataset="imagefolder")
    with pytest.raises(FileNotFoundError):
        load_images(VisionDataParams(dataset="imagefolder", path=str(tmp_path / "nope")))
    (tmp_path / "x" / "train" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="no 'test' folder"):
        load_images(VisionDataParams(dataset="imagefolder", path=str(tmp_path / "x")))
    with pytest.raises(ValueError, match="partitioner"):
        VisionDataParams(partitioner="random")


def test_models_have_the_documented_sizes_and_refuse_wrong_inputs():
    cnn = make_model("cnn", (1, 8, 8), 10)
    assert cnn(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    vgg = make_model("vgg16", (3, 32, 32), 10)
    n_params = sum(p.numel() for p in vgg.parameters())
    assert 14.5e6 < n_params < 15.0e6  # 13 conv layers of VGG-16 "D" + 512 -> 10
    assert sum(isinstance(m, torch.nn.Conv2d) for m in vgg.modules()) == 13
    assert vgg(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
    with pytest.raises(ValueError, match="32 x 32"):
        make_model("vgg16", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="vision-model"):
        make_model("resnet", (1, 8, 8), 10)
    bn = make_model("vgg16-bn", (3, 32, 32), 10)
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in bn.modules()) == 13
    assert not list(bn.buffers())  # batch statistics only: nothing for the server to average but parameters
    assert bn(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    gn = make_model("cnn-gn", (3, 32, 32), 10)
    assert sum(p.numel() for p in gn.parameters()) == 114_186  # 3 conv blocks (32, 64, 128) + 2048 -> 10
    assert sum(isinstance(m, torch.nn.GroupNorm) for m in gn.modules()) == 3 and not list(gn.buffers())
    assert make_model("cnn-gn", (1, 8, 8), 10)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    with pytest.raises(ValueError, match="8 x 8"):
        make_model("cnn-gn", (1, 4, 4), 10)


@pytest.mark.parametrize("name", ["vgg16", "vgg16-bn", "cnn-gn"])
def test_vgg_gradients_reach_the_first_layer(name):
    # torchvision's init; with PyTorch's default init the ratio was 3.5e-7 (measured): the first layers froze
    torch.manual_seed(0)
    model = make_model(name, (3, 32, 32), 10)
    x, y = torch.rand(16, 3, 32, 32), torch.randint(0, 10, (16,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    first = model.features[0]
    ratio = float(first.weight.grad.norm() / first.weight.norm())
    assert ratio > 1e-3, ratio
    with torch.no_grad():  # the signal survives the 13 layers (default init: RMS 0.22 -> 0.006)
        h = model.features(x)
    assert float(h.pow(2).mean().sqrt()) > 0.01


def test_local_sgd_learns_the_digits():
    torch.manual_seed(0)
    data = load_images(VisionDataParams())
    model = make_model("cnn", data.shape, 10)
    before, _ = accuracy(model, data.x_test, data.y_test)
    train_batches(model, data.x_train, data.y_train, VisionTrainParams(120, 32, 0.05, 0.9), np.random.default_rng(0))
    after, _ = accuracy(model, data.x_test, data.y_test)
    assert after > 0.8 and before < 0.3


def test_sketch_is_the_gradient_at_the_shared_coordinates():
    torch.manual_seed(0)
    model = make_model("cnn", (1, 8, 8), 10)
    data = load_images(VisionDataParams())
    batch = batch_at(data.x_train, data.y_train, 16, np.random.default_rng(0))
    sketch, loss, sizes = gradient_sketch(model, batch, 0.05, [3, 1])
    model.zero_grad()
    full_loss = torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
    full_loss.backward()
    params = list(model.parameters())
    picks = sketch_indices([p.numel() for p in params], 0.05, [3, 1])
    expected = np.concatenate([p.grad.reshape(-1).numpy()[i] for p, i in zip(params, picks)])
    np.testing.assert_allclose(sketch, expected, rtol=1e-5, atol=1e-7)
    assert loss == pytest.approx(float(full_loss)) and sizes == [len(i) for i in picks]
    # another client with other data samples the same coordinates in the same round
    other = batch_at(data.x_train[::-1].copy(), data.y_train[::-1].copy(), 16, np.random.default_rng(1))
    sketch2, _, sizes2 = gradient_sketch(model, other, 0.05, [3, 1])
    assert sizes2 == sizes and sketch2.shape == sketch.shape and not np.allclose(sketch2, sketch)
    assert len(sketch) == sum(max(1, round(0.05 * p.numel())) for p in params)


def test_central_evaluation_scores_a_seeded_subset_of_the_test_set():
    from bouquet.config import AppConfig, ConfigError
    from bouquet.serving.vision import central_evaluation

    data = load_images(VisionDataParams())
    full_config = AppConfig.from_run_config({"task": "vision"})
    initial, evaluate_full = central_evaluation(full_config)
    model = make_model("cnn", data.shape, 10)
    model.load_state_dict(initial.to_torch_state_dict())
    assert evaluate_full(0, initial)["accuracy"] == accuracy(model, data.x_test, data.y_test)[0]

    sub_config = AppConfig.from_run_config({"task": "vision", "central-eval-size": 50})
    _, evaluate_sub = central_evaluation(sub_config)
    scores = {evaluate_sub(0, initial)["accuracy"] for _ in range(2)}
    assert len(scores) == 1  # the same subset every round
    keep = np.sort(np.random.default_rng([sub_config.vision_data.seed, 2]).choice(len(data.y_test), 50, replace=False))
    assert scores == {accuracy(model, data.x_test[keep], data.y_test[keep])[0]}
    with pytest.raises(ConfigError, match="central-eval-size"):
        AppConfig.from_run_config({"task": "vision", "central-eval-size": -1})


def test_vision_device_is_checked_and_a_missing_gpu_is_a_clear_error():
    from bouquet.config import AppConfig, ConfigError
    from bouquet.tasks.vision import torch_device

    assert AppConfig.from_run_config({"vision-device": "cuda:1"}).vision_model.device == "cuda:1"
    assert AppConfig.from_run_config({}).vision_model.device == "cpu"  # the default: nothing moves
    for bad in ("gpu", "cuda:x", "CPU", ""):
        with pytest.raises(ConfigError, match="vision-device"):
            AppConfig.from_run_config({"vision-device": bad})
    assert torch_device("cpu") == torch.device("cpu")
    assert torch_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        assert torch_device("cuda:0") == torch.device("cuda:0")
    else:  # what CI and a CPU-only edge box see: the server refuses before any round
        from bouquet.serving.vision import central_evaluation  # imports Flower, which a GPU check may not have

        with pytest.raises(RuntimeError, match="vision-device='cuda'.*client-resources-num-gpus"):
            torch_device("cuda")
        with pytest.raises(RuntimeError, match="sees no CUDA device"):
            central_evaluation(AppConfig.from_run_config({"task": "vision", "vision-device": "cuda"}))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
@pytest.mark.parametrize("name", ["cnn-gn", "vgg16-bn"])
def test_on_cuda_the_vision_task_trains_sketches_and_scores_as_on_the_cpu(name):
    """The same training steps, sketch and accuracy on both devices (cuDNN's kernels differ in the last bits)."""
    from bouquet.tasks.vision import torch_device

    x = np.random.default_rng(0).integers(0, 256, size=(64, 3, 32, 32), dtype=np.uint8)
    y = np.random.default_rng(1).integers(0, 10, size=64)
    results = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = make_model(name, (3, 32, 32), 10).to(torch_device(device))
        loss = train_batches(model, x, y, VisionTrainParams(3, 16, 0.01, 0.0), np.random.default_rng(2))
        sketch, sketch_loss, _ = gradient_sketch(model, batch_at(x, y, 16, np.random.default_rng(3)), 0.01, [0, 1])
        results.append((loss, sketch, sketch_loss, accuracy(model, x, y)))
    (cpu_loss, cpu_sketch, cpu_sketch_loss, cpu_acc), (gpu_loss, gpu_sketch, gpu_sketch_loss, gpu_acc) = results
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-3) and gpu_sketch_loss == pytest.approx(cpu_sketch_loss, rel=1e-3)
    np.testing.assert_allclose(gpu_sketch, cpu_sketch, rtol=1e-2, atol=1e-4)
    assert gpu_acc[1] == pytest.approx(cpu_acc[1], rel=1e-3)


def test_runners_decode_each_image_source_once_before_any_run(tmp_path, monkeypatch, capsys):
    from bouquet.experiments import Job, prepare_image_caches

    cache = tmp_path / "cache"
    monkeypatch.setenv("BOUQUET_CACHE_DIR", str(cache))
    packed = _tarball(tmp_path)
    config = {"vision-dataset": "imagefolder", "vision-data-path": str(packed)}
    jobs = [Job(f"arm {i}", dict(config), tmp_path / f"run-{i}", 10) for i in range(3)]
    jobs.append(Job("digits", {"vision-dataset": "digits"}, tmp_path / "run-d", 10))
    prepare_image_caches(jobs)
    assert capsys.readouterr().out.count("images ready") == 1  # one source, three jobs
    assert len(list(cache.glob("images-*.npz"))) == 1
    prepare_image_caches(jobs[3:])  # no image folder: nothing to do, nothing printed
    assert capsys.readouterr().out == ""


def test_an_archive_is_cached_by_its_content(tmp_path, monkeypatch):
    import os

    cache = tmp_path / "cache"
    monkeypatch.setenv("BOUQUET_CACHE_DIR", str(cache))
    packed = _tarball(tmp_path)
    load_images(VisionDataParams(dataset="imagefolder", path=str(packed)))
    os.utime(packed, (1, 1))  # a new mtime, as a re-mounted read-only share gives: the same cache
    copy = tmp_path / "elsewhere.tar.gz"
    shutil.copy(packed, copy)
    load_images(VisionDataParams(dataset="imagefolder", path=str(copy)))
    assert len(list(cache.glob("images-*.npz"))) == 1
    with tarfile.open(packed, "w:gz") as tar:  # other content: a new entry
        tar.add(tmp_path / "imgs" / "train", arcname="my-images/train")
        tar.add(tmp_path / "imgs" / "train", arcname="my-images/test")
    load_images(VisionDataParams(dataset="imagefolder", path=str(packed)))
    assert len(list(cache.glob("images-*.npz"))) == 2
