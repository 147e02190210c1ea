"""The app's run configuration: the components' params classes composed, and one generic key mapping.

Each component owns a frozen params class with its defaults and validation (``HKParams``,
``SamplingParams``, ``WaterDataParams``, ...).  :class:`AppConfig` holds one instance of each (a
*section*) and :data:`KEYS` maps every kebab-case run-config key to the field it sets: by default the
key is the section's prefix plus the field name with ``_`` -> ``-``; a few keys are named otherwise
(``local-epochs`` sets ``water_train.epochs``), and three are shared by two sections (``batch-size``,
``data-seed``, ``sckm-layer-combine``, ``sckm-sign``), whose classes take that default from one constant.  Defaults
are read from the classes, so each lives in one place; ``pyproject.toml``'s ``[tool.flwr.app.config]``
repeats them for ``flwr run``, except the keys of the ``forecaster`` presets, where it holds the default
job's preset (``bouquet/presets/personal.toml``); a test checks both.

The ``strategy`` value is parsed once into a :class:`StrategySpec`.  The HK section exists only when the
strategy is HK (its geometry comes from the name and decides how ``hk-tau`` is validated); the values of
its keys are kept either way.  An unknown key or a bad value raises :class:`ConfigError` naming the key.
Importing this module loads neither torch nor flwr.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from bouquet.algorithms.attacks import DATA_ATTACKS, AttackParams
from bouquet.algorithms.clustered import CFLParams, IFCAParams
from bouquet.algorithms.coalitions_fixed_k import FixedKParams
from bouquet.algorithms.fedopt import ServerOptParams
from bouquet.algorithms.hk import HKParams
from bouquet.algorithms.memory import MemoryParams
from bouquet.algorithms.selection import (
    SELECTORS,
    AFLSelector,
    FedCorSelector,
    PowerOfChoiceSelector,
    SCKMClusterSelector,
    SCKMSelectSelector,
    Selector,
)
from bouquet.algorithms.trees import TreeParams
from bouquet.checkpoint import CheckpointParams
from bouquet.data.images import VisionDataParams
from bouquet.data.water import WaterDataParams
from bouquet.families import FAMILIES, STRATEGIES, Family, FamilyError, StrategySpec, family_names
from bouquet.forecasting.combine import FallbackParams
from bouquet.forecasting.features import FeatureParams
from bouquet.params import ParamError, RunConfigKeys
from bouquet.strategies.params import (
    UPDATE_SELECTOR_NEEDS,
    CoalitionParams,
    ModelStoreParams,
    ProximalParams,
    RobustRuleParams,
    SamplingParams,
    ScreeningParams,
    SelectionParams,
)
from bouquet.tasks.params import (
    PROFILE_BASELINES,
    CentralEvalParams,
    ForecastModelParams,
    LSTMParams,
    PerFedAvgParams,
    PersonalParams,
    VisionModelParams,
    VisionTrainParams,
    WaterTrainParams,
)
from bouquet.tasks.registry import TASKS, TaskKind, import_task_module, task_kind
from bouquet.transport import TransportParams

__all__ = ["DEFAULT_JOB", "DEPRECATED_KEYS", "FORECASTERS", "KEYS", "PRESETS_DIR", "STRATEGIES", "TASKS", "AppConfig",
           "ConfigError", "Key", "RunParams", "StrategySpec", "TaskKind", "with_preset"]

#: Where the ``forecaster`` presets live: one run-config TOML file each, shipped with the app
#: (``flwr run . --run-config bouquet/presets/paper.toml``).
PRESETS_DIR = Path(__file__).resolve().parent / "presets"
#: The preset whose values ``pyproject.toml`` holds: what ``flwr run .`` runs.
DEFAULT_JOB = "personal"


def _load_presets() -> dict[str, dict[str, Any]]:
    presets = {}
    for path in sorted(PRESETS_DIR.glob("*.toml")):
        values = tomllib.loads(path.read_text())
        if values.pop("forecaster", None) != path.stem:
            raise RuntimeError(f"{path}: its forecaster key must name the file ({path.stem!r})")
        presets[path.stem] = values
    return presets


#: The ``forecaster`` presets of the water task, read from :data:`PRESETS_DIR`: each sets the same keys (the
#: model's inputs and loss, the split, the training recipe, the serving rule), so a preset file is a whole
#: forecaster.  ``paper`` is the HK paper's setting (every value is its key's default: the reproduction);
#: ``improved`` adds weekday and household-profile inputs, the L1 loss and a window-median baseline;
#: ``personal`` is the LSTM recipe the rolling-origin forecaster study chose on validation with its test period
#: locked, ``trees`` the federated gradient-boosted trees (docs/results/water.md; each file says what it holds).
FORECASTERS: dict[str, dict[str, Any]] = _load_presets()
#: Preset keys not applied with Per-FedAvg, which personalises the served model itself.
_PERSONALISATION_KEYS = ("personalize-epochs", "personal-layers", "ditto-lambda")

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """An unknown run-config key or an invalid value."""


@dataclass(frozen=True)
class RunParams:
    """What the ServerApp runs.

    Parameters
    ----------
    num_server_rounds : int, default 20
        T, the rounds the server runs.
    task : str, default "water"
        A row of :data:`bouquet.tasks.registry.TASKS`: ``water`` (household water forecasting, HK paper),
        ``vision`` (image classification, SCKM paper), or one that ``task_module`` registers.
    task_module : str, default ""
        A module to import before the task is looked up, which registers a task of its own
        (:func:`bouquet.tasks.registry.register_task`); the ServerApp and every ClientApp import it.
    strategy : str, default "hk-cosine"
        One of :data:`STRATEGIES` (how models are combined).
    selection : str, default "random"
        A name in :data:`bouquet.algorithms.selection.SELECTORS` (who trains; ``random``: seeded uniform).
    results_dir : str, default "results"
        The folder each run writes its run folder into.
    run_name : str, default ""
        The run folder's name (default: date, time and strategy).
    round_timeout : float, default 3600
        Seconds the server waits for a round's replies; a node that has not answered is reported lost.
    forecaster : {"paper", "improved", "personal", "trees"}, default "paper"
        The water forecaster's preset (:data:`FORECASTERS`, one run-config file each in
        :data:`PRESETS_DIR`).  A run config that names a preset and leaves out some of its keys gets the
        preset's values for those; every key the run config holds wins, whatever its value.  ``flwr run``
        passes every key of ``pyproject.toml``, so there a preset is chosen with its file
        (``--run-config bouquet/presets/paper.toml``) or by ``python -m bouquet.launch``, which applies
        the file under the keys it is given (:func:`with_preset`).  The app's ``pyproject.toml`` holds the
        ``personal`` values (the default job); this class's default is the paper's, for code that builds
        a config itself.
    """

    #: How the run config names its fields (bouquet.config reads it).
    RUN_CONFIG: ClassVar[RunConfigKeys] = RunConfigKeys()

    num_server_rounds: int = 20
    task: str = "water"
    task_module: str = ""
    strategy: str = "hk-cosine"
    selection: str = "random"
    results_dir: str = "results"
    run_name: str = ""
    round_timeout: float = 3600.0
    forecaster: str = "paper"
    #: ``strategy`` parsed (set by the checks below: a params class is frozen)
    spec: StrategySpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_server_rounds < 1:
            raise ParamError("num_server_rounds", f"num-server-rounds must be >= 1, got {self.num_server_rounds}")
        import_task_module(self.task_module)
        task_kind(self.task)
        object.__setattr__(self, "spec", StrategySpec.parse(self.strategy))
        if self.selection not in SELECTORS:
            raise ParamError("selection", f"unknown selection {self.selection!r}; choose one of {', '.join(SELECTORS)}")
        if self.round_timeout <= 0:
            raise ParamError("round_timeout", f"round-timeout must be > 0, got {self.round_timeout}")
        if self.forecaster not in FORECASTERS:
            raise ParamError("forecaster", f"forecaster must be one of {', '.join(FORECASTERS)}, got {self.forecaster!r}")


@dataclass(frozen=True)
class Key:
    """One run-config key: the section it sets and the field path in it (nested for the data sections)."""

    name: str
    section: str
    path: tuple[str, ...]


@dataclass(frozen=True)
class _Section:
    """One section of :class:`AppConfig`: its attribute and its params class (whose ``RUN_CONFIG`` names its
    keys, :class:`bouquet.params.RunConfigKeys`)."""

    name: str
    params: type


#: The sections of :class:`AppConfig`, in key order: those of the run and the strategies, then each built-in
#: task's from its row of the task registry, then the rest.  Each params class declares its own keys.
_SECTIONS = tuple(_Section(name, params) for name, params in (
    ("run", RunParams), ("transport", TransportParams), ("sampling", SamplingParams), ("selection", SelectionParams),
    ("hk", HKParams), ("coalitions", CoalitionParams), ("memory", MemoryParams), ("fixed_k", FixedKParams),
    ("proximal", ProximalParams), ("server_opt", ServerOptParams), ("perfedavg", PerFedAvgParams),
    *[(name, params) for kind in TASKS.values() for name, params in kind.params.items()],
    ("store", ModelStoreParams), ("ifca", IFCAParams), ("cfl", CFLParams), ("robust", RobustRuleParams),
    ("attack", AttackParams), ("checkpoint", CheckpointParams), ("sckm_select", SCKMSelectSelector),
    ("sckm_cluster", SCKMClusterSelector), ("power_of_choice", PowerOfChoiceSelector), ("afl", AFLSelector),
    ("fedcor", FedCorSelector), ("screening", ScreeningParams)))

#: Old key names still accepted, each with a warning naming its new name: what HK and fixed-K share is
#: ``coalition-*`` (``hk-*`` keys are HK's own).
DEPRECATED_KEYS = {"hk-barycenter-weighting": "coalition-barycenter-weighting",
                   "hk-min-coalition-fraction": "coalition-min-fraction",
                   "hk-update-norm-bound": "coalition-update-norm-bound"}


#: S of the app (the HK paper's 50 clients a round); SamplingParams' own default (None: a fraction) is for
#: other people's apps.
APP_CLIENTS_PER_ROUND = 50
#: FedProx's mu in the app (the HK paper's setting); ProximalParams' own default (0.0) is Flower's FedProx's.
APP_PROXIMAL_MU = 0.01
_APP_DEFAULTS = {("sampling", ("clients_per_round",)): APP_CLIENTS_PER_ROUND,
                 ("proximal", ("mu",)): APP_PROXIMAL_MU}
#: The app's values of fields that no key sets: it asks each node for its identity (its ClientApp answers)
#: and waits for nodes one at a time (Flower's floors of 2 are for apps whose nodes cannot be told apart).
_APP_FIXED: dict[str, dict[str, Any]] = {
    "sampling": {"min_evaluate_nodes": 1, "min_available_nodes": 1, "identify_nodes": True}}


def _section_keys(section: _Section) -> Iterator[Key]:
    """The keys of a section's own fields, as its params class declares them (``RUN_CONFIG``)."""
    for name, path in section.params.RUN_CONFIG.keys(section.params):
        yield Key(name, section.name, path)


def _nested_keys(section: _Section) -> Iterator[Key]:
    """The keys of a section's nested params (the water data's synthetic households and cleaning)."""
    for name, path in section.params.RUN_CONFIG.nested.items():
        yield Key(name, section.name, path)


def _all_keys(section: _Section) -> list[Key]:
    """A section's keys, its nested ones last (as :data:`KEYS` orders them)."""
    return [*_section_keys(section), *_nested_keys(section)]


#: Every run-config key, in declaration order: every section's own keys, then the nested ones (``data-seed``
#: also seeds the vision partition); a key may set two sections' fields.
KEYS: tuple[Key, ...] = (*[k for s in _SECTIONS for k in _section_keys(s)],
                         *[k for s in _SECTIONS for k in _nested_keys(s)])
_BY_NAME: dict[str, list[Key]] = {}
for _key in KEYS:
    _BY_NAME.setdefault(_key.name, []).append(_key)
_SECTION = {s.name: s for s in _SECTIONS}
#: Sections built only for the family whose variant sets their geometry (``None`` otherwise; the values
#: of their keys are kept in ``AppConfig.inactive``).
_EXCLUSIVE = {f.geometry_section for f in FAMILIES.values() if f.exclusive_section}


def _field_value(value: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        value = getattr(value, name)
    return value


def _field_default(params: type, path: tuple[str, ...]) -> Any:
    return _field_value(params(), path)


def _task_of(values: Mapping[str, Any]) -> TaskKind | None:
    """The run config's task row (the default job's task where it names none), its ``task-module`` imported
    first; None for a task no module registered (left to :class:`RunParams`, which names the key)."""
    try:
        import_task_module(str(values.get("task-module", "")))
    except ParamError as error:
        raise ConfigError(f"run-config 'task-module': {error}") from error
    return TASKS.get(str(values.get("task", RunParams.task)))


def _task_sections(kind: TaskKind | None) -> tuple[_Section, ...]:
    """The sections a task brings that :class:`AppConfig` has no field for (a registered task's; none for the
    built-in ones).  Their keys must not be bouquet's."""
    if kind is None:
        return ()
    extra = tuple(_Section(name, params) for name, params in kind.params.items() if name not in _SECTION)
    clash = sorted({key.name for section in extra for key in _all_keys(section)} & set(_BY_NAME))
    if clash:
        raise ConfigError(f"task {kind.name!r}: its keys {', '.join(clash)} are bouquet's own; rename them "
                          f"(RUN_CONFIG prefix)")
    return extra


def _default(key: Key) -> Any:
    override = _APP_DEFAULTS.get((key.section, key.path))
    if override is not None:
        return override
    return _field_default(_SECTION[key.section].params, key.path)


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"run-config {key!r} must be true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise ConfigError(f"run-config {key!r} must be an integer, got {value!r}")
        return int(value)
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"run-config {key!r} must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"run-config {key!r} must be a string, got {value!r}")
    return value


def _set_nested(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        values = values.setdefault(name, {})
    values[path[-1]] = value


def _build(params: type, values: dict[str, Any]) -> Any:
    """``params(**values)`` with nested dicts built into their own dataclasses (the water data's)."""
    kinds = {f.name: f for f in fields(params)}
    kwargs = {}
    for name, value in values.items():
        if isinstance(value, dict):
            nested = kinds[name].default_factory()  # type: ignore[misc]
            value = dataclasses.replace(nested, **value)
        kwargs[name] = value
    return params(**kwargs)


def _key_for(section: str, field_name: str, keys: Sequence[Key] = KEYS) -> str:
    """The key of ``field_name`` of ``section`` among ``keys`` (else all the section's keys), for messages."""
    names = [k.name for k in keys if k.section == section and k.path[-1] == field_name]
    if names:
        return names[0]
    return ", ".join(k.name for k in keys if k.section == section)


@dataclass(frozen=True)
class AppConfig:
    """Every run-config key of the bouquet app, as the components' params sections.

    Build it with :meth:`from_run_config` (kebab-case keys, as in ``[tool.flwr.app.config]``);
    ``AppConfig()`` is the default run.  Sections: ``run`` (:class:`RunParams`), ``transport`` (:class:`bouquet.transport.TransportParams`), ``sampling``,
    ``selection``, ``coalitions``, ``proximal`` (:mod:`bouquet.strategies.params`), ``memory``
    (:class:`bouquet.algorithms.memory.MemoryParams`), ``hk``
    (:class:`bouquet.algorithms.hk.HKParams`, ``None`` unless the strategy is HK), ``fixed_k``,
    ``perfedavg``, ``water_data``, ``water_model``, ``water_train``, ``vision_data``, ``vision_model``,
    ``vision_train``, ``central``, ``store`` (shared or per-coalition models), ``ifca``, ``cfl`` and the
    selectors' parameters (``sckm_select``, ``sckm_cluster``, ``power_of_choice``, ``afl``, ``fedcor``).  Every key, its section and default: :meth:`describe_keys`.
    """

    run: RunParams = field(default_factory=RunParams)
    transport: TransportParams = field(default_factory=TransportParams)
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(clients_per_round=APP_CLIENTS_PER_ROUND,
                                                                            **_APP_FIXED["sampling"]))
    selection: SelectionParams = field(default_factory=SelectionParams)
    hk: HKParams | None = field(default_factory=HKParams)
    coalitions: CoalitionParams = field(default_factory=CoalitionParams)
    memory: MemoryParams = field(default_factory=MemoryParams)
    fixed_k: FixedKParams = field(default_factory=FixedKParams)
    proximal: ProximalParams = field(default_factory=lambda: ProximalParams(mu=APP_PROXIMAL_MU))
    server_opt: ServerOptParams = field(default_factory=ServerOptParams)
    perfedavg: PerFedAvgParams = field(default_factory=PerFedAvgParams)
    water_data: WaterDataParams = field(default_factory=WaterDataParams)
    forecast_model: ForecastModelParams = field(default_factory=ForecastModelParams)
    water_model: LSTMParams = field(default_factory=LSTMParams)
    water_train: WaterTrainParams = field(default_factory=WaterTrainParams)
    personal: PersonalParams = field(default_factory=PersonalParams)
    fallback: FallbackParams = field(default_factory=FallbackParams)
    trees: TreeParams = field(default_factory=TreeParams)
    tree_features: FeatureParams = field(default_factory=FeatureParams)
    vision_data: VisionDataParams = field(default_factory=VisionDataParams)
    vision_model: VisionModelParams = field(default_factory=VisionModelParams)
    vision_train: VisionTrainParams = field(default_factory=VisionTrainParams)
    central: CentralEvalParams = field(default_factory=CentralEvalParams)
    store: ModelStoreParams = field(default_factory=ModelStoreParams)
    ifca: IFCAParams = field(default_factory=IFCAParams)
    cfl: CFLParams = field(default_factory=CFLParams)
    robust: RobustRuleParams = field(default_factory=RobustRuleParams)
    attack: AttackParams = field(default_factory=AttackParams)
    checkpoint: CheckpointParams = field(default_factory=CheckpointParams)
    sckm_select: SCKMSelectSelector = field(default_factory=SCKMSelectSelector)
    sckm_cluster: SCKMClusterSelector = field(default_factory=SCKMClusterSelector)
    power_of_choice: PowerOfChoiceSelector = field(default_factory=PowerOfChoiceSelector)
    afl: AFLSelector = field(default_factory=AFLSelector)
    fedcor: FedCorSelector = field(default_factory=FedCorSelector)
    screening: ScreeningParams = field(default_factory=ScreeningParams)
    #: values of the keys of sections not built for this strategy (``hk-*`` when it is not HK)
    inactive: tuple[tuple[str, Any], ...] = ()
    #: the sections a registered task brings (:class:`bouquet.tasks.registry.TaskKind` ``params``) that are not
    #: fields of this class, as (name, params); read them with :meth:`section`
    task_params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        spec, family = self.spec, self.family
        if self.sampling.clients_per_round is None:
            raise ConfigError("clients-per-round must be >= 1")
        for name in _EXCLUSIVE:  # sections that exist for their family only
            missing = getattr(self, name) is None
            if missing == (name == family.geometry_section):
                raise ConfigError(f"the {name} section is {'missing' if missing else 'set'} for strategy {spec.name!r}")
        if family.geometry_section and getattr(self, family.geometry_section).geometry != spec.variant:
            raise ConfigError(f"{family.geometry_section} geometry "
                              f"{getattr(self, family.geometry_section).geometry!r} differs from strategy {spec.name!r}")
        task = self.task
        if family.meta_learning and not task.meta_learning:
            raise ConfigError(f"{family.label} is not implemented for the {task.name} task (tasks with its client "
                              f"step: {', '.join(t.name for t in TASKS.values() if t.meta_learning)})")
        coalitions = family_names(lambda f: f.coalitions)
        if self.store.coalition_models == "personal" and not (family.coalitions or family.clusters):
            raise ConfigError(f"run-config 'coalition-models': 'personal' serves each coalition its model, but "
                              f"strategy {spec.name!r} forms no coalitions (use {coalitions})")
        if self.memory.active and not family.coalitions:
            raise ConfigError(f"run-config 'coalition-memory': memory of coalitions, but strategy {spec.name!r} "
                              f"forms no coalitions (use {coalitions})")
        if self.coalitions.opinion_arrays.strip() and not family.opinions:
            raise ConfigError(f"run-config 'hk-opinion-arrays': the arrays HK reads, but strategy {spec.name!r} "
                              f"is not HK (use {family_names(lambda f: f.opinions)})")
        c, off = self.coalitions, CoalitionParams()
        for key, value in (("coalition-robust", c.robust),
                           ("coalition-min-fraction", c.min_coalition_fraction != off.min_coalition_fraction),
                           ("coalition-update-norm-bound", c.update_norm_bound != off.update_norm_bound),
                           ("coalition-update-min-cosine", c.update_min_cosine != off.update_min_cosine),
                           ("coalition-update-relative-cosine",
                            c.update_relative_cosine != off.update_relative_cosine)):
            if value and not family.coalitions:
                raise ConfigError(f"run-config {key!r}: a robust option of coalition aggregation, but strategy "
                                  f"{spec.name!r} forms no coalitions (use {coalitions})")
        if not family.robust and self.robust != RobustRuleParams():
            changed = next(f.name for f in fields(RobustRuleParams)
                           if getattr(self.robust, f.name) != getattr(RobustRuleParams(), f.name))
            raise ConfigError(f"run-config {_key_for('robust', changed)!r} is set, but strategy {spec.name!r} is not "
                              f"one of Flower's robust rules ({family_names(lambda f: f.robust, last=',')})")
        try:
            family.check(self)
        except FamilyError as error:
            raise ConfigError(str(error)) from error
        if self.attack.attack in DATA_ATTACKS and self.attack.attack not in task.data_attacks:
            fits = [t.name for t in TASKS.values() if self.attack.attack in t.data_attacks]
            raise ConfigError(f"run-config 'attack': {self.attack.attack!r} poisons the {' or '.join(fits)} task's "
                              f"data, but task is {self.run.task!r}")
        if self.selection.sketch_source == "local-update":
            needs = [n for n in self.selector().needs if n not in UPDATE_SELECTOR_NEEDS]
            if needs:
                raise ConfigError(f"run-config 'selection': {self.run.selection!r} needs {', '.join(needs)}, which "
                                  f"training replies do not carry; sketch-source 'local-update' chooses among "
                                  f"trained updates by their sketches (random, sckm-select, sckm-cluster, ...)")
            if family.draws_own_clients or self.selection.mode == "piggyback":
                key = "strategy" if family.draws_own_clients else "selection-mode"
                raise ConfigError(f"run-config {key!r}: sketch-source 'local-update' trains every candidate and "
                                  f"chooses among their updates; it does not combine with "
                                  f"{family.label if key == 'strategy' else 'piggyback sketches'}")
            if 0 < self.selection.candidates_per_round < self.sampling.clients_per_round:
                raise ConfigError(f"run-config 'candidates-per-round': {self.selection.candidates_per_round} "
                                  f"trained candidates cannot give {self.sampling.clients_per_round} updates "
                                  f"(clients-per-round)")
        self._check_forecaster()
        if family.draws_own_clients and self.run.selection != "random":
            raise ConfigError(f"run-config 'selection': {family.label} draws its clients itself (uniformly) and "
                              f"assigns them by loss; selection {self.run.selection!r} cannot be combined with it")

    def _check_forecaster(self) -> None:
        """The water forecaster's cross-section rules: baselines that need inputs or a validation split,
        personalisation and the server optimiser only where they apply."""
        spec, baseline = self.spec, self.water_model.baseline
        if baseline in PROFILE_BASELINES and self.water_data.household != "profile":
            raise ConfigError(f"run-config 'forecast-baseline': {baseline!r} reads the household's weekday mean, "
                              f"an input of household-inputs = 'profile' (got {self.water_data.household!r})")
        data = self.water_data
        no_validation = ("validation-fraction > 0" if data.split == "fraction" else "validation-days > 0")
        if baseline == "household" and not data.has_validation:
            raise ConfigError(f"run-config 'forecast-baseline': 'household' chooses each household's baseline on its "
                              f"validation windows; set {no_validation}")
        if self.fallback.rule != "none" and not data.has_validation:
            raise ConfigError(f"run-config 'fallback': {self.fallback.rule!r} chooses between the model and the "
                              f"household's baseline on its validation days; set {no_validation}")
        if self.forecast_model.trees and self.checkpoint.resume_from:
            raise ConfigError("run-config 'resume-from': a tree fit (forecast-model = \"trees\") is not "
                              "checkpointed (it takes minutes); start it again")
        if self.fallback.rule != "none" and not self.task.forecasting:
            raise ConfigError(f"run-config 'fallback': the fallback to a naive forecaster is a forecasting task's, "
                              f"and task {self.run.task!r} is not one")
        if self.personal.early_stop and not data.has_validation:
            raise ConfigError(f"run-config 'personalize-early-stop': it keeps the fine-tuning epoch with the lowest "
                              f"validation MAE; set {no_validation}")
        personal = self.personal
        if personal.active:
            key = next(k for k, on in (("personalize-epochs", personal.epochs > 0),
                                       ("personal-layers", personal.layers != "none"),
                                       ("ditto-lambda", personal.ditto_lambda > 0)) if on)
            if not self.task.personal_state:
                raise ConfigError(f"run-config {key!r}: personalisation is not implemented for the {self.run.task} "
                                  f"task (tasks with it: {', '.join(t.name for t in TASKS.values() if t.personal_state)})")
            if self.family.meta_learning:
                raise ConfigError(f"run-config {key!r}: {self.family.label} personalises the served model itself; "
                                  f"do not combine it with bouquet's personalisation")
            if self.family.all_personal and personal.stateful:
                raise ConfigError(f"run-config {key!r}: with strategy {spec.name!r} every model is already personal")
        if self.server_opt.active and self.family.clusters:
            raise ConfigError(f"run-config 'server-optimizer': it steps the shared model, which strategy "
                              f"{spec.name!r} does not serve (use {family_names(lambda f: not f.clusters)})")

    # ------------------------------------------------------------ derived
    @property
    def spec(self) -> StrategySpec:
        """The parsed ``strategy``."""
        return self.run.spec

    def section(self, name: str) -> Any:
        """The config section ``name``: a field (``config.section("water_data")`` is ``config.water_data``) or
        one a registered task brings."""
        if name in _SECTION:
            return getattr(self, name)
        for section, params in self.task_params:
            if section == name:
                return params
        raise KeyError(f"no config section {name!r} (task {self.run.task!r} brings "
                       f"{', '.join(self.task.sections) or 'none'})")

    @property
    def task(self) -> TaskKind:
        """The task's row: its halves, sections and traits (:mod:`bouquet.tasks.registry`)."""
        return task_kind(self.run.task)

    @property
    def family(self) -> Family:
        """The strategy's family: its traits, checks and builders (:mod:`bouquet.families`)."""
        return self.run.spec.kind

    def selector(self) -> Selector:
        """The client selector named by ``selection``, with its parameters."""
        sections = {"sckm-select": self.sckm_select, "sckm-cluster": self.sckm_cluster,
                    "power-of-choice": self.power_of_choice, "afl": self.afl, "fedcor": self.fedcor}
        name = self.run.selection
        return sections[name] if name in sections else SELECTORS[name]()

    def perfedavg_settings(self) -> PerFedAvgParams:
        """Per-FedAvg's settings with the variant the strategy names."""
        return dataclasses.replace(self.perfedavg, variant=self.spec.variant or self.perfedavg.variant)

    # ------------------------------------------------------------ mapping
    @classmethod
    def keys(cls) -> list[str]:
        """All run-config keys, kebab-case, each once."""
        return list(_BY_NAME)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every key's default, read from the params classes."""
        return dict(_DEFAULTS)

    @classmethod
    def describe_keys(cls) -> list[tuple[str, str, Any]]:
        """``(key, section.field, default)`` for every key."""
        return [(k.name, ".".join((k.section, *k.path)), _default(k)) for k in KEYS]

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> AppConfig:
        """Build from a Flower run config (kebab-case keys); missing keys take defaults.

        The same run config gives the same (cached) object: a ClientApp parses it once per message.

        Raises
        ------
        ConfigError
            A key that is not known, or a value of the wrong type or range (the message names the key).
        """
        try:
            frozen = tuple(sorted(dict(run_config).items()))
            hash(frozen)
        except TypeError:  # an unhashable value: no cache, the checks below say what is wrong
            return cls._parse(run_config)
        return _parse_cached(cls, frozen)

    @classmethod
    def _parse(cls, run_config: Mapping[str, Any]) -> AppConfig:
        raw = renamed_keys(run_config)
        extra = _task_sections(_task_of(raw))
        extra_keys = [key for section in extra for key in _all_keys(section)]
        defaults = {**_DEFAULTS, **{key.name: _field_default(section.params, key.path)
                                    for section in extra for key in _all_keys(section)}}
        given: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in defaults:
                known = [*_BY_NAME, *(k.name for k in extra_keys)]
                raise ConfigError(f"unknown run-config key {key!r}; known keys: {', '.join(known)}")
            given[key] = _coerce(key, value, type(defaults[key]))
        forecasting = _forecasting({**defaults, **given})  # its forecaster presets apply
        preset = _preset(given.get("forecaster", defaults["forecaster"]), given) if forecasting else {}
        values = {**defaults, **preset, **given}
        _check_preset_applied(values, given, forecasting)
        _drop_default_job_personalisation(values)
        _drop_default_job_water_keys(values, forecasting)
        by_section: dict[str, dict[str, Any]] = {s.name: {} for s in _SECTIONS}
        for key in KEYS:
            _set_nested(by_section[key.section], key.path, values[key.name])
        run = cls._section("run", by_section["run"])
        spec = run.spec
        family = spec.kind
        sections: dict[str, Any] = {"run": run}
        inactive: list[tuple[str, Any]] = []
        for section in _SECTIONS[1:]:
            kwargs = by_section[section.name]
            if section.name in _EXCLUSIVE and section.name != family.geometry_section:
                inactive += [(k.name, values[k.name]) for k in KEYS if k.section == section.name]
                sections[section.name] = None
                continue
            if section.name == family.geometry_section:
                kwargs = {**kwargs, "geometry": spec.variant}
            sections[section.name] = cls._section(section.name, {**_APP_FIXED.get(section.name, {}), **kwargs})
        task_params = []
        for section in extra:
            kwargs: dict[str, Any] = {}
            for key in _all_keys(section):
                _set_nested(kwargs, key.path, values[key.name])
            try:
                task_params.append((section.name, _build(section.params, kwargs)))
            except ParamError as error:
                raise ConfigError(f"run-config {_key_for(section.name, error.field, extra_keys)!r}: {error}") from error
        try:
            return cls(**sections, inactive=tuple(inactive), task_params=tuple(task_params))
        except ParamError as error:
            raise ConfigError(f"run-config {_key_for('run', error.field)!r}: {error}") from error

    @staticmethod
    def _section(name: str, kwargs: dict[str, Any]) -> Any:
        try:
            return _build(_SECTION[name].params, kwargs)
        except ParamError as error:
            raise ConfigError(f"run-config {_key_for(name, error.field)!r}: {error}") from error
        except ValueError as error:
            raise ConfigError(f"run-config ({_key_for(name, '')}): {error}") from error

    def to_run_config(self) -> dict[str, Any]:
        """Kebab-case mapping of every key (what the results folder records)."""
        out: dict[str, Any] = {}
        for key in KEYS:
            if key.name in out:
                continue
            section = getattr(self, key.section)
            if section is None:
                continue
            value = section
            for name in key.path:
                value = getattr(value, name)
            out[key.name] = value
        out.update(dict(self.inactive))
        ordered = {name: out[name] for name in _BY_NAME}
        for name, params in self.task_params:  # a registered task's own keys, after bouquet's
            for key in _all_keys(_Section(name, type(params))):
                ordered[key.name] = _field_value(params, key.path)
        return ordered


_DEFAULTS = {name: _default(keys[0]) for name, keys in _BY_NAME.items()}


def _field_docs(params: type) -> dict[str, tuple[str, str]]:
    """Each field's type line and description in the numpydoc ``Parameters`` section of ``params``'s docstring
    (the one place a params class says what a field does), by field name; ``a, b : type`` describes both."""
    doc = inspect.getdoc(params) or ""
    block = re.search(r"^Parameters\n-+\n(.*?)(?:\n\n[A-Z][a-z]+\n-+\n|\Z)", doc, flags=re.MULTILINE | re.DOTALL)
    docs: dict[str, tuple[str, list[str]]] = {}
    current: list[str] = []
    for line in block.group(1).splitlines() if block else []:
        head = re.match(r"^([A-Za-z_][\w, ]*?) : (.*)$", line)
        if head:
            current = [name.strip() for name in head.group(1).split(",")]
            for name in current:
                docs[name] = (head.group(2), [])
        elif line.startswith("    "):
            for name in current:
                docs[name][1].append(line.strip())
    return {name: (kind, " ".join(lines)) for name, (kind, lines) in docs.items()}


def _markdown(text: str) -> str:
    """reST markup (``x``, :func:`x`) as Markdown code."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def _first_sentence(text: str) -> str:
    """The first sentence of a docstring entry (after a leading ``key-name``. that repeats the key)."""
    text = re.sub(r"^``[a-z0-9-]+``[.:]\s*", "", text)
    match = re.match(r"(.+?\.)(\s+[A-Z`]|$)", text)
    return _markdown(match.group(1) if match else text)


def key_reference() -> list[tuple[str, Any, str, str]]:
    """Every run-config key with the default job's value (what ``flwr run .`` runs: ``pyproject.toml``), its
    values (the type line of its field in its params class's docstring, without the default) and the first
    sentence of the field's description there, in declaration order (section by section).  docs/USAGE.md's
    key table is :func:`key_table` of it."""
    job = AppConfig.from_run_config({"forecaster": DEFAULT_JOB}).to_run_config()
    rows = []
    for name, keys in _BY_NAME.items():
        key = keys[0]
        params: type = _SECTION[key.section].params
        for part in key.path[:-1]:
            params = type(getattr(params(), part))
        kind, text = _field_docs(params).get(key.path[-1], ("", ""))
        rows.append((name, job[name], _markdown(re.sub(r",? *default .*$", "", kind)), _first_sentence(text)))
    return rows


def key_table() -> str:
    """:func:`key_reference` as the Markdown table docs/USAGE.md holds (``python -m bouquet.config``)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| key | `flwr run .` | values | what it sets |", "|---|---|---|---|"]
    for name, value, kind, text in key_reference():
        shown = "true" if value is True else "false" if value is False else \
            f'"{value}"' if isinstance(value, str) else repr(value)
        lines.append(f"| `{name}` | `{cell(shown)}` | {cell(kind)} | {cell(text)} |")
    return "\n".join(lines) + "\n"


def renamed_keys(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """``run_config`` with each deprecated key (:data:`DEPRECATED_KEYS`) under its new name, and a warning.

    ``flwr run`` passes every key of the app's ``pyproject.toml``, so the new key is often there at its
    default beside an old one the user set: the value that differs from the default wins.  Both set to two
    different values other than the default is an error.
    """
    out = dict(run_config)
    for old, new in DEPRECATED_KEYS.items():
        if old not in out:
            continue
        value = out.pop(old)
        log.warning("run-config %r is deprecated: use %r (it takes the same values)", old, new)
        if new in out and out[new] != value and out[new] != _DEFAULTS[new] and value != _DEFAULTS[new]:
            raise ConfigError(f"run-config {old!r} (deprecated) and {new!r} are both set, to {value!r} and "
                              f"{out[new]!r}: set {new!r} only")
        if new not in out or out[new] == _DEFAULTS[new]:
            out[new] = value
    return out


def with_preset(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` over the file of the preset it names (``forecaster``), if it names one.

    What ``python -m bouquet.launch`` (and every run bouquet starts) sends to ``flwr run``: the preset's keys
    with the ones given on top, so that a value given always wins, whatever it is.  A run config of another
    task than water that names no preset gets ``paper``'s (the class defaults: 20 rounds, every node
    evaluated), not the default job's, which are the water forecaster's.

    Raises
    ------
    ConfigError
        ``forecaster`` names no preset file.
    """
    name = overrides.get("forecaster")
    if name is None:
        if _forecasting(overrides):
            return dict(overrides)
        name = "paper"  # another task: the class defaults for the preset's keys it leaves out, not the water job's
    if name not in FORECASTERS:
        raise ConfigError(f"run-config 'forecaster': forecaster must be one of {', '.join(FORECASTERS)}, got {name!r}")
    return {"forecaster": name, **FORECASTERS[name], **overrides}


def _preset(name: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """The keys ``forecaster = name`` sets that the run config leaves out (a key given always wins).  An
    unknown name is left to :class:`RunParams`.  With Per-FedAvg, which personalises the served model itself,
    the preset's personalisation keys are not applied."""
    preset = FORECASTERS.get(name, {})
    if _meta_learning(given.get("strategy", _DEFAULTS["strategy"])):
        preset = {key: value for key, value in preset.items() if key not in _PERSONALISATION_KEYS}
    return {key: value for key, value in preset.items() if key not in given}


def _forecasting(values: Mapping[str, Any]) -> bool:
    """Whether the run config's task (the default job's where it names none) is a forecasting one, whose
    ``forecaster`` presets apply.  An unknown task is left to :class:`RunParams` (not a forecasting one here)."""
    kind = _task_of(values)
    return kind is not None and kind.forecasting


def _meta_learning(strategy: Any) -> bool:
    return strategy in STRATEGIES and StrategySpec.parse(strategy).kind.meta_learning


def _check_preset_applied(values: Mapping[str, Any], given: Mapping[str, Any], forecasting: bool) -> None:
    """A run config that names a preset other than the default job's but holds the default job's value for
    every key where the two differ: ``forecaster = "paper"`` given to ``flwr run`` alone, over the app's
    ``pyproject.toml``.  Running it would run the default job under the preset's name."""
    name = values["forecaster"]
    if name == DEFAULT_JOB or name not in FORECASTERS or not forecasting:
        return
    preset, job = FORECASTERS[name], FORECASTERS[DEFAULT_JOB]
    differ = [key for key in preset if preset[key] != job[key]]
    if differ and all(key in given and given[key] == job[key] for key in differ):
        raise ConfigError(
            f"run-config 'forecaster' = {name!r}, but every key the preset sets still holds the default job's "
            f"value ({', '.join(differ)}): flwr run takes a preset as its file, "
            f"--run-config bouquet/presets/{name}.toml (copy it to change a key); python -m bouquet.launch "
            f"--run-config 'forecaster=\"{name}\"' applies the file itself")


def _drop_default_job_water_keys(values: dict[str, Any], forecasting: bool) -> None:
    """A task other than water over ``pyproject.toml`` alone (``flwr run . --run-config 'task="vision"'``):
    every preset key still holds the default job's value, which is the water forecaster's, so each is set
    back to its default, as ``paper`` holds them (20 rounds, every node evaluated; the water-only keys do
    nothing for other tasks, and the checks would refuse them).  A run config that sets any of them otherwise
    keeps them all as given."""
    if forecasting or values["forecaster"] != DEFAULT_JOB:
        return
    job = FORECASTERS[DEFAULT_JOB]
    if all(values[key] == value for key, value in job.items()):
        log.info("task %r over the default job: the water forecaster's preset keys take their defaults "
                 "(num-server-rounds %s, fraction-evaluate %s)", values["task"], _DEFAULTS["num-server-rounds"],
                 _DEFAULTS["fraction-evaluate"])
        values.update({key: _DEFAULTS[key] for key in job}, forecaster="paper")


def _drop_default_job_personalisation(values: dict[str, Any]) -> None:
    """Per-FedAvg personalises the served model itself: over ``pyproject.toml`` (the default job), its
    personalisation keys at the default job's values are set back to their defaults, as the preset would
    not have applied them (only under ``forecaster = "personal"``); a personalisation value of another kind
    stays, and is refused by the checks."""
    if values["forecaster"] != DEFAULT_JOB or not _meta_learning(values["strategy"]):
        return
    job = FORECASTERS[DEFAULT_JOB]
    for key in _PERSONALISATION_KEYS:
        if key in job and values[key] == job[key] and values[key] != _DEFAULTS[key]:
            log.info("run-config %r = %r is the default job's personalisation; %s personalises the served model "
                     "itself: %r = %r", key, values[key], values["strategy"], key, _DEFAULTS[key])
            values[key] = _DEFAULTS[key]


@functools.lru_cache(maxsize=64)
def _parse_cached(cls: type[AppConfig], frozen: tuple[tuple[str, Any], ...]) -> AppConfig:
    return cls._parse(dict(frozen))


if __name__ == "__main__":  # python -m bouquet.config: the key table of docs/USAGE.md
    print(key_table(), end="")
