"""Run config: pyproject and AppConfig agree, unknown keys and bad values get clear errors."""

import tomllib
from pathlib import Path

import pytest

from bouquet.config import AppConfig, ConfigError

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_pyproject_defaults_equal_appconfig_defaults():
    declared = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    assert sorted(declared) == sorted(AppConfig.keys())
    assert AppConfig.from_run_config(declared) == AppConfig()


def test_empty_run_config_is_the_default():
    assert AppConfig.from_run_config({}) == AppConfig()


def test_unknown_key_lists_known_keys():
    with pytest.raises(ConfigError, match=r"unknown run-config key 'num-round'.*num-server-rounds"):
        AppConfig.from_run_config({"num-round": 3})


@pytest.mark.parametrize("key, value, message", [
    ("strategy", "fedavgx", "unknown strategy .fedavgx.; choose one of fedavg, fedprox, hk-cosine"),
    ("hk-tau", 3.0, "cosine threshold tau must be in"),
    ("hk-opinions", "half", "opinions must be"),
    ("num-server-rounds", 0, "num-server-rounds must be >= 1"),
    ("num-server-rounds", 2.5, "must be an integer"),
    ("learning-rate", "fast", "must be a number"),
    ("data-source", "parquet", "data source must be one of"),
    ("scaler", "robust", "scaler must be one of"),
    ("fraction-evaluate", 1.5, "fraction-evaluate must be in"),
    ("min-hours-per-day", 30, "min_hours_per_day"),
    ("data-path", 3, "must be a string"),
])
def test_bad_values(key, value, message):
    with pytest.raises(ConfigError, match=message):
        AppConfig.from_run_config({key: value})


def test_integers_are_accepted_for_floats_and_roundtrip():
    config = AppConfig.from_run_config({"learning-rate": 1, "num-server-rounds": 3.0})
    assert config.learning_rate == 1.0 and config.num_server_rounds == 3
    assert AppConfig.from_run_config(config.to_run_config()) == config


def test_daiad_source_without_path_is_allowed_for_per_node_paths():
    config = AppConfig.from_run_config({"data-source": "daiad"})
    with pytest.raises(ValueError, match="needs a data path"):
        config.water_data()
    assert config.water_data("/node/own.csv").path == "/node/own.csv"


@pytest.mark.parametrize("key, value, message", [("fixed-k", 0, "fixed-k must be >= 1"),
                                                 ("proximal-mu", -1.0, "proximal-mu must be >= 0")])
def test_baseline_parameters(key, value, message):
    with pytest.raises(ConfigError, match=message):
        AppConfig.from_run_config({key: value})
