"""Every forecaster of the rolling-origin water study on the days of one origin, as rows of the study's long
frame (``forecaster, seed, household, origin, day, actual, forecast``).

* :func:`federated_rows`: a Flower run's forecasts (its ``predictions.csv``: the served forecast and the model's
  alone), and :func:`federated_validation` its households' validation MAE (``clients.csv``);
* :func:`naive_rows`: the nodes' own naive forecasters (:mod:`bouquet.forecasting.naive`);
* :func:`stats_rows`, :func:`lightgbm_rows`: statsforecast's and LightGBM's (:mod:`bouquet.forecasting.baselines`,
  the forecasting extra);
* :func:`pooled_lstm_rows`: one LSTM trained on every household's fit windows at once (the centralised
  reference of the federation), then each household's early-stopped fine-tuning and the same serving rule;
* :func:`tree_rows`: bouquet's gradient-boosted trees in process, either the federated fit's twin (every
  household a party, the bins merged from their sketches, their sums added in the pool's order: the trees a
  Flower run grows, which ``tests/test_trees_flower.py`` shows) or pooled (one party holding every row);
* :func:`level_lightgbm_rows`: LightGBM on the same inputs and level-scaled target, pooled or per household.

``part`` is ``"validation"`` (the days before the origin that validate; the test period locked) or ``"test"``
(the origin's block).  Every forecaster reads every day before the day it forecasts and nothing after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bouquet.data.water import ClientWindows, load_pool
from bouquet.forecasting.evaluation import mase_scale
from bouquet.results import RunFolder

__all__ = ["OriginData", "federated_rows", "federated_validation", "level_lightgbm_rows", "lightgbm_rows",
           "naive_rows", "origin_data", "pooled_lstm_rows", "stats_rows", "tree_rows"]

COLUMNS = ["forecaster", "seed", "household", "origin", "day", "actual", "forecast"]


@dataclass(frozen=True)
class OriginData:
    """Every pool household's windows at one origin, for one part (``validation``: test period locked)."""

    config: Any  # AppConfig
    origin: int
    part: str
    windows: dict[str, ClientWindows]

    @property
    def days(self) -> dict[str, np.ndarray]:
        """Each household's scored days of ``part`` (its windows' target days)."""
        return {h: (w.val_days if self.part == "validation" else w.test_days) for h, w in self.windows.items()}

    def series(self) -> dict[str, tuple[np.datetime64, np.ndarray]]:
        """Each household's litres from its first day to the last day it may see (the day before the origin
        for ``validation``, the block's last day for ``test``)."""
        return {h: (w.first_day, w.to_litres(w.series)) for h, w in self.windows.items()}

    def actual(self, household: str) -> np.ndarray:
        w = self.windows[household]
        return w.to_litres(w.y_val if self.part == "validation" else w.y_test)

    def scales(self) -> pd.DataFrame:
        """``household, origin, scale``: MASE's denominator, the seasonal naive in-sample MAE before the part's
        first day."""
        rows = []
        for household, w in self.windows.items():
            first = self.days[household][0]
            litres = w.to_litres(w.series)
            rows.append({"household": household, "origin": self.origin,
                         "scale": mase_scale(litres, int(w.day_index(np.array([first]))[0]))})
        return pd.DataFrame(rows)

    def rows(self, forecaster: str, seed: int, forecasts: dict[str, np.ndarray]) -> pd.DataFrame:
        """Rows of the long frame from each household's forecasts of its :attr:`days`."""
        pieces = []
        for household, days in self.days.items():
            if household not in forecasts:
                continue
            pieces.append(pd.DataFrame({"forecaster": forecaster, "seed": seed, "household": household,
                                        "origin": self.origin, "day": days.astype("datetime64[D]"),
                                        "actual": self.actual(household),
                                        "forecast": np.asarray(forecasts[household], dtype=np.float64)}))
        return pd.concat(pieces, ignore_index=True) if pieces else pd.DataFrame(columns=COLUMNS)


def origin_data(run_config: dict[str, Any], origin: int, part: str, households: int | None = None) -> OriginData:
    """The pool's windows at ``origin`` (``part`` ``validation``: the test period locked): the first ``households``
    of the pool (default all: the federation's nodes are the pool's first households)."""
    from bouquet.config import AppConfig

    if part not in ("validation", "test"):
        raise ValueError(f"part must be 'validation' or 'test', got {part!r}")
    config = AppConfig.from_run_config({**run_config, "origin": origin, "score-test": part == "test"})
    pool = load_pool(config.water_data)
    members = pool.households[:households] if households is not None else pool.households
    windows = {h.household_id: pool.client(i, config.water_data) for i, h in enumerate(members)}
    return OriginData(config, origin, part, windows)


def naive_rows(data: OriginData, names: Sequence[str]) -> pd.DataFrame:
    """The nodes' naive forecasters ``names`` (``naive: <name>`` rows)."""
    from bouquet.tasks.water import naive_litres

    out = []
    per_household = {h: naive_litres(w, data.part) for h, w in data.windows.items()}
    for name in names:
        out.append(data.rows(f"naive: {name}", 0, {h: f[name] for h, f in per_household.items()}))
    return pd.concat(out, ignore_index=True)


def _library_rows(data: OriginData, frame: pd.DataFrame, column: str, forecaster: str) -> pd.DataFrame:
    """Rows of a library's ``unique_id, ds, <column>`` forecasts on the part's days (others dropped)."""
    frame = frame.assign(day=frame["ds"].to_numpy().astype("datetime64[D]"))
    forecasts = {}
    for household, days in data.days.items():
        mine = frame[frame["unique_id"] == household].set_index("day")[column]
        forecasts[household] = mine.reindex(days.astype("datetime64[ns]")).to_numpy(dtype=np.float64)
    return data.rows(forecaster, 0, forecasts)


def _span(data: OriginData) -> int:
    return data.config.water_data.validation_days if data.part == "validation" else data.config.water_data.origin_days


def stats_rows(data: OriginData, models: Sequence[str], refit: int = 1, n_jobs: int = 1) -> pd.DataFrame:
    """statsforecast's ``models`` (``statsforecast: <name>`` rows), refitted every ``refit`` days."""
    from bouquet.forecasting.baselines import long_frame, stats_forecasts

    frame, _ = long_frame(data.series())
    out = stats_forecasts(frame, _span(data), models, refit, n_jobs)
    return pd.concat([_library_rows(data, out, name, f"statsforecast: {name}") for name in models], ignore_index=True)


def lightgbm_rows(data: OriginData, params: Any, pooled: bool, name: str) -> pd.DataFrame:
    """LightGBM through mlforecast, pooled or per household (``name`` rows)."""
    from bouquet.forecasting.baselines import lightgbm_forecasts, long_frame

    frame, _ = long_frame(data.series())
    out = lightgbm_forecasts(frame, _span(data), params, pooled)
    return _library_rows(data, out, "lightgbm", name)


def federated_validation(folder: Path, forecaster: str, seed: int) -> pd.DataFrame:
    """``forecaster, seed, household, mae, served-mae``: a Flower run's households' validation MAE (the model's
    alone, and what it serves) from its ``clients.csv``."""
    clients = RunFolder(folder).table("clients")
    model = "val-model-mae-litres" if "val-model-mae-litres" in clients else "val-mae-litres"
    return pd.DataFrame({"forecaster": forecaster, "seed": seed, "household": clients["household"].astype(str),
                         "mae": clients[model].astype(float), "served-mae": clients["val-mae-litres"].astype(float)})


def federated_rows(folder: Path, forecaster: str, seed: int, origin: int) -> pd.DataFrame:
    """A Flower run's test-day forecasts: ``<forecaster>`` (what each household is served) and ``<forecaster>
    (model)`` (the model alone) rows."""
    predictions = RunFolder(folder).table("predictions")
    base = pd.DataFrame({"seed": seed, "household": predictions["household"].astype(str), "origin": origin,
                         "day": pd.to_datetime(predictions["day"]).to_numpy().astype("datetime64[D]"),
                         "actual": predictions["actual-litres"].astype(float)})
    served = base.assign(forecaster=forecaster, forecast=predictions["predicted-litres"].astype(float))
    model_column = "model-litres" if "model-litres" in predictions else "predicted-litres"
    model = base.assign(forecaster=f"{forecaster} (model)", forecast=predictions[model_column].astype(float))
    return pd.concat([served, model], ignore_index=True)[COLUMNS]


def pooled_lstm_rows(data: OriginData, epochs: int, learning_rate: float, seed: int, name: str
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One LSTM on every household's fit windows at once (Adam at ``learning_rate``, ``epochs`` passes, the
    study's loss; each window carries its household's blend), then each household's fine-tuning and serving as
    the study's nodes do (:meth:`bouquet.tasks.water.WaterTask.evaluate`).  Returns the part's forecast rows
    (``<name>`` served and ``<name> (model)``) and the households' validation MAE (model alone)."""
    import torch

    from bouquet.forecasting.combine import COMBINATION_WEIGHTS, pooled_weight
    from bouquet.tasks.water import WaterTask, combine, naive_litres, predict_litres, train_pooled

    config = data.config
    torch.set_num_threads(1)
    tasks = {h: WaterTask(i, h, w, config.water_model, config.water_train, personal=config.personal,
                          fallback=config.fallback, data=config.water_data)
             for i, (h, w) in enumerate(data.windows.items())}
    torch.manual_seed(seed)
    model = next(iter(tasks.values())).new_model()
    settings = dataclasses.replace(config.water_train, epochs=epochs, learning_rate=learning_rate)
    train_pooled(model, list(tasks.values()), settings, np.random.default_rng([seed, 99]))
    served, alone, validation, models = {}, {}, [], {}
    for i, (household, task) in enumerate(tasks.items()):
        own = task.new_model()
        own.load_state_dict(model.state_dict())
        metrics = task.evaluate(own, np.random.default_rng([seed, i, 1]), final=True)
        validation.append({"forecaster": name, "seed": seed, "household": household,
                           "mae": metrics.get("val-model-mae-litres", np.nan),
                           "served-mae": metrics.get("val-mae-litres", np.nan)})
        models[household] = own
    if config.fallback.rule == "pooled":  # the pool's share, as the server chooses it (pooled_share)
        errors = [[task.share_errors_of(models[h])[f"val-share-mae-{k}"] for k in range(len(COMBINATION_WEIGHTS))]
                  for h, task in tasks.items()]
        share = pooled_weight(errors)
        tasks = {h: dataclasses.replace(t, fallback=dataclasses.replace(t.fallback, share=share))
                 for h, t in tasks.items()}
    for household, task in tasks.items():
        own = models[household]
        w = task.windows
        x = w.x_val if data.part == "validation" else w.x_test
        model_litres = predict_litres(own, w, x)
        serving = task.serving(own)
        baseline = naive_litres(w, data.part)[serving.baseline] if serving.baseline else model_litres
        alone[household], served[household] = model_litres, combine(model_litres, baseline, serving.weight)
    rows = pd.concat([data.rows(name, seed, served), data.rows(f"{name} (model)", seed, alone)], ignore_index=True)
    return rows, pd.DataFrame(validation)


def _tree_inputs(data: OriginData) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each household's training rows (:func:`bouquet.tasks.trees.household_rows`) and the inputs of the part's
    days."""
    from bouquet.forecasting.features import daily_features
    from bouquet.tasks.trees import household_rows

    params = data.config.tree_features
    rows, inputs = {}, {}
    for household, w in data.windows.items():
        rows[household] = household_rows(w, params)[0]
        inputs[household] = daily_features(w.to_litres(w.series), w.first_day, w.day_index(data.days[household]),
                                           params)
    return rows, inputs


def tree_rows(data: OriginData, params: Any, name: str, federated: bool = True) -> tuple[pd.DataFrame, Any]:
    """bouquet's trees (``params``: :class:`bouquet.algorithms.trees.TreeParams`) on the part's days: the federated
    fit's in-process twin (``federated``: a party per household) or the pooled fit (one party).  Returns the rows
    (``<name>``, the model alone) and the fit's log."""
    from bouquet.algorithms.trees import PartiesSource, fit, pooled_source
    from bouquet.forecasting.features import feature_grid

    rows, inputs = _tree_inputs(data)
    parties = list(rows.values())
    if federated:
        source = PartiesSource(parties, params)
    else:
        source = pooled_source(np.concatenate([r.x for r in parties]), np.concatenate([r.y for r in parties]), params)
    grid = feature_grid(data.config.tree_features) if params.bins == "grid" else None
    ensemble, log = fit(source, params, grid=grid)
    forecasts = {h: f.litres(ensemble.predict(f.x)) for h, f in inputs.items()}
    return data.rows(name, 0, forecasts), log


def level_lightgbm_rows(data: OriginData, params: Any, pooled: bool, name: str) -> pd.DataFrame:
    """LightGBM on the trees' inputs and level-scaled target (:func:`bouquet.forecasting.baselines.level_lightgbm_forecasts`),
    pooled or per household, on the part's days."""
    from bouquet.forecasting.baselines import level_lightgbm_forecasts

    rows, inputs = _tree_inputs(data)
    ratios = level_lightgbm_forecasts({h: (r.x, r.y) for h, r in rows.items()}, {h: f.x for h, f in inputs.items()},
                                      params, pooled)
    return data.rows(name, 0, {h: inputs[h].litres(ratios[h]) for h in inputs})
