"""Helpers of the in-process probes (``scripts/group_cosines.py``, ``scripts/memory_probe.py``): the app's
client tasks without Flower, flat weight vectors and their cosines, pairs within and between known groups."""

from __future__ import annotations

import numpy as np
import torch

from bouquet.config import AppConfig

__all__ = ["clients", "cosine_matrix", "flat", "split_pairs"]


def flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).double().numpy()


def cosine_matrix(matrix: np.ndarray) -> np.ndarray:
    unit = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-300)
    return unit @ unit.T


def split_pairs(cosines: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of the pairs within a group and of the pairs across groups (each pair once)."""
    upper = np.triu_indices(len(groups), 1)
    same = groups[upper[0]] == groups[upper[1]]
    values = cosines[upper]
    return values[same], values[~same]


def clients(config: AppConfig, count: int) -> tuple[list, torch.nn.Module]:
    """The first ``count`` clients' tasks and the seeded initial model."""
    if config.run.task == "vision":
        from bouquet.tasks.vision import VisionTask

        tasks = [VisionTask.for_node(config.vision_data, config.vision_model, config.vision_train, i, count)
                 for i in range(count)]
    else:
        from bouquet.tasks.water import WaterTask

        tasks = [WaterTask.for_node(config.water_data, config.water_model, config.water_train, None, i, None)
                 for i in range(count)]
    torch.manual_seed(config.sampling.seed)
    return tasks, tasks[0].new_model()
