"""The tasks: one row each (its two halves, its config sections, its traits), as the families are one row each.

``task = "water"`` names a row of :data:`TASKS`.  A row names its client half (``node``: builds the node's
:class:`bouquet.tasks.base.Task` from the run config and the node's Flower ``Context``) and its server half
(``server``: builds the :class:`bouquet.serving.task.ServerTask` from the run config) by import path,
``"module:attribute"``, as Flower's ``[tool.flwr.app.components]`` names the ServerApp and ClientApp: the
registry imports neither torch nor Flower, so reading a run config stays light, and each half is loaded
when a run needs it.  A callable works too.

The config's checks, the ServerApp, the ClientApp, the launcher and the report read a run's row (its traits),
never the task's name: no module but this one compares a task name (``tests/test_tasks.py`` scans the package
for such comparisons).  Adding a task is adding a row: :func:`register_task` from a module of your own, and
``task-module = "your.module"`` in the run config so that the ServerApp, the ClientApp and ``bouquet.launch``
import it before they look the task up (``tests/toy_task.py`` is a whole task defined outside the package).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bouquet.algorithms.trees import TreeParams
from bouquet.data.images import VisionDataParams
from bouquet.data.water import WaterDataParams
from bouquet.forecasting.combine import FallbackParams
from bouquet.forecasting.features import FeatureParams
from bouquet.params import ParamError
from bouquet.tasks.params import (
    CentralEvalParams,
    ForecastModelParams,
    LSTMParams,
    PersonalParams,
    VisionModelParams,
    VisionTrainParams,
    WaterTrainParams,
)

__all__ = ["TASKS", "TaskKind", "import_task_module", "register_task", "task_kind", "task_names"]


@dataclass(frozen=True)
class TaskKind:
    """One task: its halves, the config sections it reads and its traits.

    Parameters
    ----------
    name : str
        The ``task`` value.
    label : str
        How messages name it.
    node : str or callable
        ``"module:attribute"`` of (or the) ``build(config: AppConfig, context: Context) -> Task``.
    server : str or callable
        ``"module:attribute"`` of (or the) ``build(config: AppConfig) -> ServerTask``.
    pool_size : str or callable
        ``"module:attribute"`` of (or the) ``size(config: AppConfig) -> int``: the clients of the federation a
        simulation starts (``bouquet.launch``).
    params : mapping of str to type
        The config sections the task brings (its data, model and training): section name -> params class,
        whose ``RUN_CONFIG`` names its run-config keys (:class:`bouquet.params.RunConfigKeys`).  The built-in
        tasks' sections are ``AppConfig``'s fields (``config.water_data``); a registered task's are
        ``config.section(name)``, and its keys are accepted once its ``task-module`` is imported.
    forecasting : bool
        A forecasting task: the naive forecasters, the fallback to them and the ``forecaster`` presets
        (``bouquet/presets/``) apply, and a run draws ``report.png``.
    personal_state : bool
        Client-side personalisation (fine-tuning, a personal head, Ditto) is implemented for it.
    meta_learning : bool
        Per-FedAvg's client step is implemented for it.
    central_evaluation : bool
        Its server half can score the shared model itself (the ``central`` section applies:
        ``vision-evaluation = "central"`` leaves the clients' evaluation out).
    data_attacks : tuple of str
        The data-poisoning attacks (``bouquet.algorithms.attacks.DATA_ATTACKS``) its data supports.
    """

    name: str
    label: str
    node: str | Callable[..., Any]
    server: str | Callable[..., Any]
    pool_size: str | Callable[..., int]
    params: Mapping[str, type] = field(default_factory=dict)
    forecasting: bool = False
    personal_state: bool = False
    meta_learning: bool = False
    central_evaluation: bool = False
    data_attacks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.strip():
            raise ValueError(f"a task needs a name without surrounding spaces, got {self.name!r}")
        for part in ("node", "server", "pool_size"):
            value = getattr(self, part)
            if isinstance(value, str) and value.count(":") != 1:
                raise ValueError(f"task {self.name!r}: {part} must be 'module:attribute' or a callable, got {value!r}")

    @property
    def sections(self) -> tuple[str, ...]:
        """The names of the config sections the task brings."""
        return tuple(self.params)

    def node_half(self) -> Callable[..., Any]:
        """``build(config, context) -> Task``."""
        return _resolve(self.node)

    def server_half(self) -> Callable[..., Any]:
        """``build(config) -> ServerTask``."""
        return _resolve(self.server)

    def clients(self) -> Callable[..., int]:
        """``size(config) -> int``."""
        return _resolve(self.pool_size)


def _resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(target):
        return target
    module, attribute = target.split(":")
    value: Any = importlib.import_module(module)
    for name in attribute.split("."):
        value = getattr(value, name)
    return value


#: The registered tasks by name: the two built in, and those :func:`register_task` adds.
TASKS: dict[str, TaskKind] = {}


def register_task(kind: TaskKind, replace: bool = False) -> TaskKind:
    """Add ``kind`` to :data:`TASKS` (``replace``: over a row of the same name); returns it."""
    if kind.name in TASKS and not replace and TASKS[kind.name] != kind:
        raise ValueError(f"a task named {kind.name!r} is registered already")
    TASKS[kind.name] = kind
    return kind


def task_names() -> tuple[str, ...]:
    return tuple(TASKS)


def task_kind(name: str) -> TaskKind:
    """The row of task ``name``; a :class:`ParamError` on ``task`` names the registered ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ParamError("task", f"task must be one of {', '.join(TASKS)} (or one a task-module registers), "
                                 f"got {name!r}") from None


def import_task_module(module: str) -> None:
    """Import ``module`` (the ``task-module`` key), which registers a task of its own; "" imports nothing."""
    if not module.strip():
        return
    try:
        importlib.import_module(module.strip())
    except ImportError as error:
        raise ParamError("task_module", f"task-module {module!r} cannot be imported: {error}") from error


register_task(TaskKind(
    "water", label="household water forecasting (HK paper)",
    node="bouquet.client_app:water_task", server="bouquet.serving.water:WaterServer",
    pool_size="bouquet.serving.water:pool_size",
    params={"water_data": WaterDataParams, "forecast_model": ForecastModelParams, "water_model": LSTMParams,
            "water_train": WaterTrainParams, "personal": PersonalParams, "fallback": FallbackParams,
            "trees": TreeParams, "tree_features": FeatureParams},
    forecasting=True, personal_state=True, meta_learning=True, data_attacks=("target-shift",)))
register_task(TaskKind(
    "vision", label="image classification (SCKM paper)",
    node="bouquet.client_app:vision_task", server="bouquet.serving.vision:VisionServer",
    pool_size="bouquet.serving.vision:pool_size",
    params={"vision_data": VisionDataParams, "vision_model": VisionModelParams, "vision_train": VisionTrainParams,
            "central": CentralEvalParams},
    central_evaluation=True, data_attacks=("label-flip",)))
