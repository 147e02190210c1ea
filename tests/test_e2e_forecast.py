"""End to end: a utility's own meter file (data-source = "csv") through a real `flwr run` on rolling origins, with
each household served its model, its baseline or a combination, tomorrow's forecast in the run folder, and
`python -m bouquet.forecast` forecasting again from the same (and from newer) readings without retraining."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bouquet import forecast
from bouquet.results import RunFolder

ROOT = Path(__file__).resolve().parents[1]
METERS = ROOT / "examples" / "meters_daily.csv"
pytestmark = pytest.mark.e2e


def test_meter_file_to_tomorrows_forecast_and_again_without_retraining(run_app, tmp_path):
    folder, stdout = run_app(
        f'forecaster="improved" data-source="csv" data-path="{METERS}" active-factor=0 min-history-days=0 '
        'split="origins" origin=2 validation-days=28 forecast-baseline="household" fallback="combine" '
        "personalize-epochs=2 personalize-early-stop=true strategy=\"fedavg\" num-server-rounds=2 "
        "clients-per-round=3 local-epochs=1", supernodes=3)
    run = RunFolder(folder)
    summary = run.summary()
    assert summary["test-period-scored"] and summary["clients-evaluated"] == 3
    assert sum(summary["served"].values()) == 3 and summary["mase-mean"] > 0
    assert "% of households beat their own best naive forecast on the test days" in stdout
    clients = run.table("clients")
    assert {"baseline", "served", "served-model-share", "model-mae-litres", "baseline-mae-litres"} <= set(clients)
    predictions = run.table("predictions")
    assert (predictions["predicted-litres"] >= 0).all()
    per_client = predictions.assign(err=(predictions["predicted-litres"] - predictions["actual-litres"]).abs())
    np.testing.assert_allclose(per_client.groupby("partition-id")["err"].mean().to_numpy(),
                               clients.sort_values("partition-id")["mae-litres"].to_numpy(), rtol=1e-6)
    # the last block (origin 2 of 3): the last 28 days of each meter
    data = pd.read_csv(METERS, parse_dates=["ds"])
    ends = data.groupby("unique_id")["ds"].max()
    assert (pd.to_datetime(predictions.groupby("household")["day"].max()) == ends).all()
    # tomorrow and the six days after, from each household's own served model
    ahead = run.table("forecast")
    assert list(ahead.columns) == list(forecast.COLUMNS) and len(ahead) == 3 * 7
    first = ahead[ahead["horizon"] == 1].set_index("household")["day"]
    assert (pd.to_datetime(first) == ends + pd.Timedelta(days=1)).all()
    assert (ahead["forecast-litres"] >= 0).all() and ahead["baseline"].ne("").all()
    assert len(list((folder / "models").glob("*.npz"))) == 3
    # again from the same readings, without retraining: the same forecast
    out = tmp_path / "again.csv"
    assert forecast.main([str(folder), "--data", str(METERS), "--out", str(out)]) == 0
    again = pd.read_csv(out)
    merged = ahead.merge(again, on=["household", "day"], suffixes=("", "-again"))
    assert len(merged) == 21
    np.testing.assert_allclose(merged["forecast-litres-again"], merged["forecast-litres"], rtol=1e-6)
    # newer readings: one more week of meter-001 (and a meter the run never saw)
    week = pd.DataFrame({"unique_id": ["meter-001"] * 7 + ["meter-999"],
                         "ds": [(ends["meter-001"] + pd.Timedelta(days=d)).date() for d in range(1, 8)]
                         + [ends["meter-001"].date()], "y": [250.0] * 8})
    newer = tmp_path / "newer.csv"
    pd.concat([data.assign(ds=data["ds"].dt.date), week]).to_csv(newer, index=False)
    assert forecast.main([str(folder), "--data", str(newer), "--out", str(out)]) == 0
    later = pd.read_csv(out)
    meter = later[later["household"] == "meter-001"]
    assert pd.to_datetime(meter["day"]).min() == ends["meter-001"] + pd.Timedelta(days=8)
    assert "meter-999" not in set(later["household"])


def test_forecast_command_errors(tmp_path, capsys):
    assert forecast.main([str(tmp_path), "--data", str(METERS)]) == 2
    assert "no models/ folder" in capsys.readouterr().err
    (tmp_path / "models").mkdir()
    assert forecast.main([str(tmp_path), "--data", str(METERS)]) == 2
    assert "models/ holds no forecaster" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        forecast.main([str(tmp_path), "--data", str(METERS), "--days", "0"])
