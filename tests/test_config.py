"""Run config: pyproject and AppConfig agree, unknown keys and bad values get clear errors."""

import tomllib
from pathlib import Path

import pytest

from bouquet.config import DEFAULT_JOB, FORECASTERS, PRESETS_DIR, AppConfig, ConfigError, with_preset

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_pyproject_defaults_equal_appconfig_defaults():
    """pyproject.toml holds every key: the class's default, except the forecaster presets' keys, where it holds
    the default job's preset file, value for value."""
    declared = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    assert sorted(declared) == sorted(AppConfig.keys())
    assert declared["forecaster"] == DEFAULT_JOB == "personal"
    preset = FORECASTERS[DEFAULT_JOB]
    assert {key: declared[key] for key in preset} == preset
    defaults = AppConfig().to_run_config()
    assert {key: value for key, value in declared.items() if key not in preset and key != "forecaster"} == \
        {key: value for key, value in defaults.items() if key not in preset and key != "forecaster"}
    assert AppConfig.from_run_config({**declared, **with_preset({"forecaster": "paper"})}) == AppConfig()


def test_every_preset_file_sets_the_same_keys_and_paper_is_every_default(tmp_path):
    """A preset file is a whole forecaster: any of them over any config gives the same keys their values."""
    names = sorted(path.stem for path in PRESETS_DIR.glob("*.toml"))
    assert names == sorted(FORECASTERS) == ["improved", "paper", "personal", "trees"]
    keys = {name: set(FORECASTERS[name]) for name in names}
    assert all(k == keys["paper"] for k in keys.values()) and len(keys["paper"]) == 14
    defaults = AppConfig().to_run_config()
    assert FORECASTERS["paper"] == {key: defaults[key] for key in keys["paper"]}
    improved = {key for key in keys["paper"] if FORECASTERS["improved"][key] != FORECASTERS["paper"][key]}
    assert improved == {"forecast-baseline", "forecast-loss", "calendar-inputs", "household-inputs"}
    for name in names:  # as flwr run reads the file: its forecaster key names it
        assert tomllib.loads((PRESETS_DIR / f"{name}.toml").read_text())["forecaster"] == name


def test_the_personal_preset_is_the_default_job_and_per_fedavg_keeps_its_own_personalisation():
    declared = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    job = AppConfig.from_run_config(declared)  # what flwr run . runs
    assert job.run.forecaster == "personal" and job.run.strategy == "hk-cosine"
    assert (job.water_model.baseline, job.water_train.loss, job.water_data.validation_fraction) == \
        ("household", "huber", 0.0)
    # the rolling-origin study's choice: the latest block is the test days, the 56 before validate
    assert (job.water_data.split, job.water_data.origin, job.water_data.origin_days, job.water_data.validation_days) \
        == ("origins", 2, 28, 56)
    # the forecaster study's choice on validation, then the serving rule's by nested validation: the model alone
    assert job.personal.early_stop and job.fallback.rule == "none"
    assert (job.run.num_server_rounds, job.water_train.epochs, job.water_train.learning_rate) == (50, 3, 0.1)
    assert job.personal.epochs == 5 and job.sampling.fraction_evaluate == 0.1
    assert AppConfig.from_run_config(job.to_run_config()) == job
    assert AppConfig.from_run_config({"forecaster": "personal"}) == job  # the preset, from code
    # a key given always wins, also when its value is the class's default (the paper's learning rate)
    assert AppConfig.from_run_config({**declared, "num-server-rounds": 8}).run.num_server_rounds == 8
    assert AppConfig.from_run_config({**declared, "learning-rate": 0.001}).water_train.learning_rate == 0.001
    assert AppConfig.from_run_config({"forecaster": "personal", "num-server-rounds": 20}).run.num_server_rounds == 20
    # Per-FedAvg personalises the served model itself: the preset's fine-tuning is left out, not an error
    perfedavg = AppConfig.from_run_config({**declared, "strategy": "perfedavg-fo"})
    assert perfedavg.personal.epochs == 0 and perfedavg.water_train.epochs == 3
    assert AppConfig.from_run_config({"forecaster": "personal", "strategy": "perfedavg-fo"}) == perfedavg
    with pytest.raises(ConfigError, match="personalises the served model itself"):  # asked for outside the job
        AppConfig.from_run_config({"strategy": "perfedavg-fo", "personalize-epochs": 5})
    # the paper's reproduction: its preset file, over pyproject.toml
    paper = AppConfig.from_run_config({**declared, **with_preset({"forecaster": "paper"})})
    assert (paper.water_model.baseline, paper.run.num_server_rounds, paper.personal.epochs) == ("none", 20, 0)
    assert AppConfig.from_run_config({**declared, **with_preset({"forecaster": "paper", "learning-rate": 0.01})}) \
        .water_train.learning_rate == 0.01


def test_a_preset_named_without_its_file_over_pyproject_is_refused():
    """``flwr run . --run-config 'forecaster="paper"'`` would run the default job under the paper's name."""
    declared = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    with pytest.raises(ConfigError, match=r"bouquet/presets/paper.toml"):
        AppConfig.from_run_config({**declared, "forecaster": "paper"})
    # one key of the preset set otherwise is a choice, not a forgotten file
    mixed = AppConfig.from_run_config({**declared, "forecaster": "improved", "forecast-baseline": "window-median"})
    assert mixed.water_model.baseline == "window-median" and mixed.water_train.learning_rate == 0.1  # the job's
    with pytest.raises(ConfigError, match="forecaster must be one of"):
        with_preset({"forecaster": "best"})


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
    ("scaler", "quantile", "scaler must be one of"),
    ("fraction-evaluate", 1.5, "fraction_evaluate must be in"),
    ("min-hours-per-day", 30, "min_hours_per_day"),
    ("data-path", 3, "must be a string"),
    ("synthetic-households", 0, "n_households must be >= 1"),
    ("sckm-layer-combine", "sum", "sckm-layer-combine must be one of"),
    ("afl-alpha1", 1.0, "alpha1"),
    ("selection-mode", "push", "selection mode must be one of"),
    ("vision-model", "resnet", "vision-model must be one of"),
    ("local-epochs", 0, "local epochs must be >= 1"),
    ("hidden-size", 0, "hidden-size must be >= 1"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message) as error:
        AppConfig.from_run_config({key: value})
    assert f"run-config {key!r}" in str(error.value)


def test_a_strategy_name_is_parsed_once_into_a_spec():
    from bouquet.config import StrategySpec

    assert StrategySpec.parse("hk-cosine-bounded") == StrategySpec("hk-cosine-bounded", "hk", "cosine-bounded")
    config = AppConfig.from_run_config({"strategy": "fixed-k-cosine", "fixed-k": 3})
    assert config.spec.family == "fixed-k" and config.fixed_k.geometry == "cosine" and config.fixed_k.k == 3
    assert config.hk is None  # no HK section for another strategy, but its keys' values are kept
    perfedavg = AppConfig.from_run_config({"strategy": "perfedavg-hf", "perfedavg-alpha": 0.05})
    assert perfedavg.perfedavg_settings().variant == "hf" and perfedavg.perfedavg_settings().alpha == 0.05


def test_hk_keys_are_validated_by_the_geometry_the_strategy_names_and_kept_otherwise():
    assert AppConfig.from_run_config({"strategy": "hk-euclidean", "hk-tau": 1.5}).hk.tau == 1.5
    with pytest.raises(ConfigError, match="run-config 'hk-tau'"):
        AppConfig.from_run_config({"strategy": "hk-cosine", "hk-tau": 1.5})
    fedavg = AppConfig.from_run_config({"strategy": "fedavg", "hk-tau": 1.5})
    assert fedavg.to_run_config()["hk-tau"] == 1.5
    assert AppConfig.from_run_config(fedavg.to_run_config()) == fedavg


def test_each_default_lives_in_its_params_class():
    from bouquet.algorithms.hk import HKParams
    from bouquet.strategies.params import SelectionParams
    from bouquet.tasks.params import VisionTrainParams

    defaults = AppConfig.defaults()
    assert defaults["hk-tau"] == HKParams.tau and defaults["sketch-fraction"] == SelectionParams.sketch_fraction
    assert defaults["vision-learning-rate"] == VisionTrainParams.learning_rate
    # a key that sets two sections has one default: both classes read it from one constant
    for key in ("batch-size", "data-seed", "sckm-layer-combine"):
        sections = [k for k in AppConfig.describe_keys() if k[0] == key]
        assert len(sections) == 2 and len({default for _, _, default in sections}) == 1, key


def test_reading_the_config_imports_neither_torch_nor_flwr():
    import subprocess
    import sys

    code = ("import sys, bouquet.config; bad = [m for m in ('torch', 'flwr') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_integers_are_accepted_for_floats_and_roundtrip():
    config = AppConfig.from_run_config({"learning-rate": 1, "num-server-rounds": 3.0})
    assert config.water_train.learning_rate == 1.0 and config.run.num_server_rounds == 3
    assert AppConfig.from_run_config(config.to_run_config()) == config


def test_daiad_source_without_path_is_allowed_for_per_node_paths():
    from bouquet.data.water import load_pool

    config = AppConfig.from_run_config({"data-source": "daiad"})
    with pytest.raises(ValueError, match="needs a data path"):
        load_pool(config.water_data)


@pytest.mark.parametrize("key, value, message", [("fixed-k", 0, "run-config .fixed-k.: k must be a positive integer"),
                                                 ("proximal-mu", -1.0, "proximal-mu must be >= 0")])
def test_baseline_parameters(key, value, message):
    with pytest.raises(ConfigError, match=message):
        AppConfig.from_run_config({key: value})


@pytest.mark.parametrize("run_config, key, message", [
    ({"coalition-models": "personal", "strategy": "fedavg"}, "coalition-models", "forms no coalitions"),
    ({"coalition-models": "private"}, "coalition-models", "must be one of"),
    ({"strategy": "ifca", "ifca-k": 5, "clients-per-round": 4}, "ifca-k", "more than the 4 clients per round"),
    ({"strategy": "ifca", "selection": "sckm-select"}, "selection", "cannot be combined"),
    ({"cfl-eps1": 0.0}, "cfl-eps1", "must be > 0"),
    ({"cfl-eps2": -1.0}, "cfl-eps2", "must be > 0"),
    ({"cfl-min-size": 1}, "cfl-min-size", "must be >= 2"),
    ({"synthetic-types": "family,castle"}, "synthetic-types", "must name types among"),
    ({"vision-groups": "shuffle"}, "vision-groups", "must be one of"),
    ({"vision-evaluation": "nowhere"}, "vision-evaluation", "must be one of"),
])
def test_clustered_fl_keys_refuse_bad_values_by_name(run_config, key, message):
    with pytest.raises(ConfigError, match=message) as error:
        AppConfig.from_run_config(run_config)
    assert f"run-config {key!r}" in str(error.value)


def test_personal_models_and_the_clustered_peers_are_valid_configs():
    assert AppConfig.from_run_config({"coalition-models": "personal"}).store.coalition_models == "personal"
    assert AppConfig.from_run_config({"strategy": "fixed-k-cosine", "coalition-models": "personal"}).spec.family == \
        "fixed-k"
    from bouquet.config import StrategySpec

    for family in ("ifca", "cfl", "local"):
        assert AppConfig.from_run_config({"strategy": family}).spec == StrategySpec(family, family)


def test_deprecated_hk_keys_of_what_hk_and_fixed_k_share_still_work_with_a_warning(caplog):
    from bouquet.config import DEPRECATED_KEYS

    old = AppConfig.from_run_config({"strategy": "fixed-k-cosine", "hk-min-coalition-fraction": 0.25,
                                     "hk-update-norm-bound": 2.0, "hk-barycenter-weighting": "samples"})
    assert "is deprecated: use 'coalition-min-fraction'" in caplog.text
    new = AppConfig.from_run_config({"strategy": "fixed-k-cosine", "coalition-min-fraction": 0.25,
                                     "coalition-update-norm-bound": 2.0, "coalition-barycenter-weighting": "samples"})
    assert old == new and old.coalitions.min_coalition_fraction == 0.25
    assert not set(DEPRECATED_KEYS) & set(new.to_run_config()), "a run records the new names only"
    # flwr run passes the new key at its default (pyproject) beside the old one the user set: the set one wins
    both = AppConfig.from_run_config({"coalition-min-fraction": 0.0, "hk-min-coalition-fraction": 0.25})
    assert both.coalitions.min_coalition_fraction == 0.25
    with pytest.raises(ConfigError, match="'hk-min-coalition-fraction' \\(deprecated\\) and 'coalition-min-fraction' "
                                          "are both set"):
        AppConfig.from_run_config({"coalition-min-fraction": 0.5, "hk-min-coalition-fraction": 0.25})
    with pytest.raises(ConfigError, match="'coalition-barycenter-weighting'"):
        AppConfig.from_run_config({"hk-barycenter-weighting": "most"})


def test_the_apps_sampling_asks_identities_and_waits_for_nodes_one_at_a_time():
    """Fields no key sets have the app's values in the config itself, not in the ServerApp."""
    for config in (AppConfig(), AppConfig.from_run_config({"clients-per-round": 7})):
        s = config.sampling
        assert (s.identify_nodes, s.min_evaluate_nodes, s.min_available_nodes, s.min_train_nodes) == (True, 1, 1, 2)
    assert AppConfig() == AppConfig.from_run_config({})


def test_another_task_does_not_take_the_water_jobs_preset_keys():
    """The default job's preset keys are the water forecaster's: a vision run started by bouquet gets the class
    defaults for those it leaves out (as the SCKM studies always ran), a key it sets wins, and plain flwr run over
    pyproject.toml with only the task changed runs the class defaults too, instead of failing on water keys."""
    declared = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    vision = AppConfig.from_run_config({**declared, **with_preset({"task": "vision"})})
    assert (vision.run.num_server_rounds, vision.sampling.fraction_evaluate, vision.fallback.rule) == (20, 1.0, "none")
    assert vision == AppConfig.from_run_config({"task": "vision"})
    longer = AppConfig.from_run_config({**declared, **with_preset({"task": "vision", "num-server-rounds": 50})})
    assert longer.run.num_server_rounds == 50
    with pytest.raises(ConfigError, match="'personalize-epochs'.*not implemented for the vision task"):  # asked for: refused
        AppConfig.from_run_config({**declared, **with_preset({"task": "vision", "personalize-epochs": 5})})
    plain = AppConfig.from_run_config({**declared, "task": "vision"})  # flwr run . --run-config 'task="vision"'
    assert plain == vision


def test_usage_lists_every_key_as_the_params_classes_describe_it():
    """docs/USAGE.md's key table is ``python -m bouquet.config`` (every key, its value in pyproject.toml, its
    field's description in its params class); a key added without a description, or the page not
    regenerated, fails here."""
    import re

    from bouquet.config import key_reference, key_table

    rows = key_reference()
    assert [row[0] for row in rows] == AppConfig.keys()
    assert [row[0] for row in rows if not row[3]] == []  # every field is described in its params class
    usage = (PYPROJECT.parent / "docs" / "USAGE.md").read_text()
    (block,) = re.findall(r"<!-- key-table:begin -->\n(.*?)<!-- key-table:end -->", usage, flags=re.DOTALL)
    assert block == key_table()
    declared = tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]
    assert {row[0]: row[1] for row in rows} == declared  # the table's values are pyproject.toml's


def test_each_params_class_declares_its_own_keys():
    """The keys live beside the fields they set (``RUN_CONFIG``, :class:`bouquet.params.RunConfigKeys`), once:
    every section's class declares its own, and a declaration that names a field the class lacks fails."""
    import dataclasses

    import pytest

    from bouquet.config import _SECTIONS
    from bouquet.params import RunConfigKeys

    for section in _SECTIONS:
        assert "RUN_CONFIG" in vars(section.params), section.params.__name__
    names = [name for section in _SECTIONS for name, _ in section.params.RUN_CONFIG.keys(section.params)]
    nested = [name for section in _SECTIONS for name in section.params.RUN_CONFIG.nested]
    assert sorted(set(names + nested)) == sorted(AppConfig.keys())

    @dataclasses.dataclass(frozen=True)
    class Probe:
        alpha: float = 1.0

    assert list(RunConfigKeys(prefix="probe-").keys(Probe)) == [("probe-alpha", ("alpha",))]
    with pytest.raises(ValueError, match="names fields it does not have: beta"):
        list(RunConfigKeys(rename={"beta": "b"}).keys(Probe))
