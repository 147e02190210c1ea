"""The task registry: one row per task, the config and the apps read its traits, and a task defined outside the
package (tests/toy_task_app) registers itself and runs end to end on bouquet's own ServerApp and ClientApp."""

import ast
import json
from pathlib import Path

import pytest

from bouquet.config import AppConfig, ConfigError
from bouquet.params import ParamError
from bouquet.tasks.registry import TASKS, TaskKind, import_task_module, register_task

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bouquet"
TOY_APP = ROOT / "tests" / "toy_task_app"


def test_the_two_tasks_are_rows_with_their_traits():
    water, vision = TASKS["water"], TASKS["vision"]
    assert water.forecasting and water.personal_state and water.meta_learning and not water.central_evaluation
    assert vision.central_evaluation and not (vision.forecasting or vision.personal_state or vision.meta_learning)
    assert (water.data_attacks, vision.data_attacks) == (("target-shift",), ("label-flip",))
    assert water.node_half().__name__ == "water_task" and vision.server_half().__name__ == "VisionServer"
    assert AppConfig.from_run_config({"task": "vision"}).task is vision


def test_bad_task_input_is_refused_with_the_key():
    with pytest.raises(ConfigError, match=r"run-config 'task': task must be one of water, vision.*got 'toyx'"):
        AppConfig.from_run_config({"task": "toyx"})
    with pytest.raises(ConfigError, match=r"run-config 'task-module': .*cannot be imported"):
        AppConfig.from_run_config({"task": "water", "task-module": "no_such_module_here"})
    with pytest.raises(ParamError, match="cannot be imported"):
        import_task_module("no_such_module_here")
    with pytest.raises(ValueError, match="'module:attribute' or a callable"):
        TaskKind("bad", label="bad", node="bouquet.client_app.water_task", server="a:b", pool_size="a:b")
    with pytest.raises(ValueError, match="registered already"):
        register_task(TaskKind("water", label="another water", node="a:b", server="a:b", pool_size="a:b"))
    assert TASKS["water"].label.startswith("household water")


def test_the_config_reads_the_task_traits_not_its_name(monkeypatch):
    """A task without forecasting, personalisation, Per-FedAvg's step or data attacks: each is refused by its
    trait, naming the key."""
    monkeypatch.setitem(TASKS, "plain", TaskKind("plain", label="plain", node="a:b", server="a:b", pool_size="a:b"))
    base = {"task": "plain", "forecaster": "paper"}
    for extra, message in (({"fallback": "select"}, "'fallback': .* task 'plain' is not one"),
                           ({"personalize-epochs": 1}, "'personalize-epochs': personalisation is not implemented"),
                           ({"strategy": "perfedavg-fo"}, "Per-FedAvg is not implemented for the plain task"),
                           ({"attack": "target-shift", "attack-fraction": 0.2}, "'target-shift' poisons the water")):
        with pytest.raises(ConfigError, match=message):
            AppConfig.from_run_config({**base, **extra, "validation-fraction": 0.2})
    config = AppConfig.from_run_config(base)
    assert config.task.name == "plain" and config.to_run_config()["task"] == "plain"


def _task_name_uses(path: Path) -> list[str]:
    """Comparisons with a task name on one side, and dict literals keyed by task names, in ``path``."""
    names = set(TASKS) - {"toy"}
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            sides = [k for k in node.keys if k is not None]
        else:
            continue
        for side in sides:
            items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            if any(isinstance(c, ast.Constant) and c.value in names for c in items):
                hits.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
                break
    return hits


def test_no_task_name_is_compared_outside_the_registry(tmp_path):
    """The config, the apps, the launcher and the report ask the task's row; only the registry names tasks.
    Exempt: the studies and their analysis, which are studies of one task each."""
    registry = PACKAGE / "tasks" / "registry.py"
    hits = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != registry
            and not {"analysis", "studies"} & set(path.parts) for hit in _task_name_uses(path)]
    assert hits == []
    probe = Path(__file__).with_name("toy_task_app") / "toytask" / "task.py"
    assert _task_name_uses(probe) == []  # the toy names itself only in its row
    sample = tmp_path / "sample.py"
    sample.write_text('if config.run.task == "vision":\n    pass\nHALVES = {"water": 1}\n')
    assert len(_task_name_uses(sample)) == 2, "the scan finds a comparison and a dict keyed by task names"


def test_a_task_module_registers_its_task_and_the_launcher_sizes_its_pool(monkeypatch):
    from bouquet import launch

    monkeypatch.syspath_prepend(str(TOY_APP))
    config = AppConfig.from_run_config({"task": "toy", "task-module": "toytask.task", "toy-steps": 5})
    assert config.task.label.startswith("toy regression") and "toy" in TASKS
    assert config.section("toy").steps == 5 and config.section("toy").learning_rate == 0.1
    assert config.to_run_config()["toy-steps"] == 5
    assert AppConfig.from_run_config(config.to_run_config()) == config  # what a run folder records reads back
    with pytest.raises(ConfigError, match=r"run-config 'toy-steps': toy-steps must be >= 1, got 0"):
        AppConfig.from_run_config({"task": "toy", "task-module": "toytask.task", "toy-steps": 0})
    with pytest.raises(ConfigError, match="unknown run-config key 'toy-steps'"):
        AppConfig.from_run_config({"task": "water", "toy-steps": 5})  # only the toy task's run knows its keys
    with pytest.raises(KeyError, match="no config section 'toy'"):
        AppConfig().section("toy")
    assert launch.pool_size(TOY_APP, "") == 6
    model = config.task.server_half()(config).new_model()
    assert sum(p.numel() for p in model.parameters()) == 3


@pytest.mark.e2e
def test_a_task_defined_outside_the_package_runs_end_to_end(superlink, tmp_path):
    """tests/toy_task_app: bouquet's ServerApp and ClientApp, a task no module of bouquet names.  Its two
    client groups want opposite weights: HK finds the two coalitions, and every client is evaluated."""
    results = tmp_path / "results"
    done = superlink.flwr_run(TOY_APP, run_config=f'results-dir="{results}" run-name="toy"',
                              federation_config="num-supernodes=6 client-resources-num-cpus=1")
    output = done.stdout + done.stderr
    assert done.returncode == 0 and (results / "toy" / "summary.json").exists(), \
        output[-4000:] + "\nSuperLink runs: " + superlink.run_statuses()
    summary = json.loads((results / "toy" / "summary.json").read_text())
    assert summary["task"] == "toy" and summary["clients-evaluated"] == 6
    recorded = json.loads((results / "toy" / "config.json").read_text())
    assert recorded["toy-steps"] == 20 and recorded["task-module"] == "toytask.task"  # its own keys, recorded
    assert summary["mse-mean"] < 0.05, summary  # each served its coalition's model (their mean would fit neither)
    assert "-> K=2" in output
    rounds = [json.loads(line) for line in (results / "toy" / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds if r["phase"] == "train"] == [1, 2, 3]


def test_the_config_sections_of_the_built_in_tasks_come_from_their_rows(monkeypatch):
    """AppConfig's task sections are the rows' (``params``); a registered task's key that is bouquet's own is
    refused."""
    import dataclasses

    from bouquet.config import _SECTIONS
    from bouquet.params import RunConfigKeys

    sections = {s.name: s.params for s in _SECTIONS}
    for name in ("water", "vision"):
        assert all(sections[section] is params for section, params in TASKS[name].params.items())
    assert not set(TASKS["water"].sections) & set(TASKS["vision"].sections)

    @dataclasses.dataclass(frozen=True)
    class Clashing:
        RUN_CONFIG = RunConfigKeys()
        seed: int = 0

    monkeypatch.setitem(TASKS, "clash", TaskKind("clash", label="clash", node="a:b", server="a:b", pool_size="a:b",
                                                 params={"clash": Clashing}))
    with pytest.raises(ConfigError, match="task 'clash': its keys seed are bouquet's own"):
        AppConfig.from_run_config({"task": "clash"})
