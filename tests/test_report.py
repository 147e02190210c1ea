"""report.png: its numbers by hand (skill per round, the households shown) and the command on bad input."""

import json

import numpy as np
import pandas as pd

from bouquet.report import household_picks, main, skill_per_round


def test_skill_per_round_uses_the_households_evaluated_that_round():
    evaluations = pd.DataFrame({"round": [1, 1, 2], "partition-id": [0, 1, 1], "mae-litres": [8.0, 12.0, 9.0]})
    clients = pd.DataFrame({"partition-id": [0, 1], "naive-window-median": [10.0, 10.0]})
    frame = skill_per_round(evaluations, clients, "naive-window-median")
    assert frame["round"].tolist() == [1, 2]
    np.testing.assert_allclose(frame["mae-litres"], [10.0, 9.0])
    np.testing.assert_allclose(frame["skill"], [0.0, 0.1])


def test_household_picks_best_median_worst_and_skips_households_without_use():
    clients = pd.DataFrame({"partition-id": [0, 1, 2, 3, 4], "mae-litres": [5.0, 9.0, 12.0, 7.0, 1.0],
                            "naive-window-median": [10.0, 10.0, 10.0, 10.0, 0.0]})
    assert household_picks(clients, "naive-window-median") == {"best": 0, "median": 3, "worst": 2}
    assert household_picks(clients.iloc[4:], "naive-window-median") == {}


def test_the_command_refuses_a_folder_that_is_not_a_finished_water_run(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "holds no summary.json" in capsys.readouterr().err
    (tmp_path / "summary.json").write_text(json.dumps({"task": "vision", "final-accuracy": 0.5}))
    assert main([str(tmp_path)]) == 2
    assert "not a finished water run" in capsys.readouterr().err


def test_no_households_no_picks():
    assert household_picks(pd.DataFrame({"partition-id": [], "mae-litres": [], "n": []}), "n") == {}
