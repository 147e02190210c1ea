"""The one-command SCKM reproduction: its steps are valid command lines; it stops at a failure and resumes."""

import csv
import importlib

import pytest

from bouquet.studies import reproduce_sckm as reproduce


def test_every_step_is_a_command_line_its_script_accepts(tmp_path):
    steps = reproduce.plan("cifar10", "cpu", [0, 1, 2], tmp_path)
    assert [s.script for s in steps] == ["run_sckm_experiments"] * 2 + ["sckm_figures"] * 2 + ["sckm_probe"] * 2
    parsed = [(importlib.import_module(f"bouquet.analysis.{s.script}") if s.script.endswith("_figures")
               else importlib.import_module(f"bouquet.studies.{s.script}")).build_parser().parse_args(s.argv) for s in steps]
    assert [p.study for p in parsed[:2]] == ["select", "cluster"]
    assert all(p.seeds == [0, 1, 2] and p.profile == "cpu" and p.settings == "all" for p in parsed[:2])
    assert parsed[2].base == tmp_path / "select-cifar10-cpu" and parsed[3].out.parent == tmp_path / "figures"
    assert parsed[4].rounds == [1, 5, 10] and parsed[5].rounds == [20, 40] and parsed[5].local_batches == 20
    assert parsed[4].out != parsed[5].out
    assert len(reproduce.plan("digits", "smoke", [0], tmp_path, probe=False)) == 4


def test_a_failed_step_stops_the_run_and_the_next_run_skips_a_finished_probe(tmp_path, monkeypatch, capsys):
    calls, failures = [], [3]  # the cluster figures fail once

    def fake_call(command, cwd):
        calls.append(command[1].rsplit("/", 1)[-1])
        return failures.pop() if len(calls) == 4 and failures else 0

    monkeypatch.setattr(reproduce.subprocess, "call", fake_call)
    args = ["--data", "digits", "--seeds", "0", "--out", str(tmp_path)]
    assert reproduce.main(args) == 3
    assert calls == ["run_sckm_experiments.py"] * 2 + ["sckm_figures.py"] * 2
    assert "step 4 (cluster figures) failed with exit code 3" in capsys.readouterr().err
    (tmp_path / "probe-digits").mkdir()
    (tmp_path / "probe-digits" / "probe_rank.csv").write_text("done\n")
    calls.clear()
    assert reproduce.main(args) == 0
    assert calls[-1] == "sckm_probe.py" and calls.count("sckm_probe.py") == 1  # the finished probe was skipped
    with (tmp_path / "reproduce-times.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["exit-code"] for r in rows] == ["0", "0", "0", "3", "0", "0", "0", "0", "0"]


def test_print_lists_the_steps_without_running_them(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(reproduce.subprocess, "call", lambda *a, **k: pytest.fail("ran a step"))
    assert reproduce.main(["--print", "--no-probe", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and "scripts/run_sckm_experiments.py --study select" in lines[0]
