"""How the repository is laid out: tests import the package, never a script by its path."""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _loads_by_path(tree: ast.AST) -> list[str]:
    """Calls that load Python source from a file path: importlib's file loaders, runpy.run_path, exec of a read."""
    hits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name.endswith(("spec_from_file_location", "SourceFileLoader", "run_path")) or \
                (name == "exec" and "read_text" in ast.unparse(node)):
            hits.append(f"{node.lineno}: {name}")
    return hits


def test_no_test_loads_a_script_by_its_path():
    """What a test needs from a study lives in the package (``bouquet.studies``, ``bouquet.analysis``); the
    scripts only call it.  Running a script as a process (``python scripts/x.py``) is allowed: that is a user's
    command line."""
    hits = [f"{path.name}:{hit}" for path in sorted(TESTS.glob("*.py")) if path.name != Path(__file__).name
            for hit in _loads_by_path(ast.parse(path.read_text()))]
    assert hits == []
    probe = ast.parse("import importlib.util\nimportlib.util.spec_from_file_location('x', 'scripts/x.py')\n"
                      "import runpy\nrunpy.run_path('scripts/x.py')\n")
    assert len(_loads_by_path(probe)) == 2, "the scan finds a load by path"


def test_each_study_script_only_calls_its_module():
    """A script whose study moved into ``bouquet.studies`` holds no code of its own: its module is the one place."""
    studies = sorted(p.stem for p in (ROOT / "bouquet" / "studies").glob("*.py") if p.stem != "__init__")
    assert len(studies) >= 10
    for name in studies:
        tree = ast.parse((ROOT / "scripts" / f"{name}.py").read_text())
        defined = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign))]
        assert defined == [], f"scripts/{name}.py defines {[ast.unparse(d)[:40] for d in defined]}"
        imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert [node.module for node in imports] == [f"bouquet.studies.{name}"]


def _layers() -> list[list[str]]:
    """The layers of pyproject.toml's import-linter contract, top to bottom, each a list of module names."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    return [[name.strip() for name in layer.split("|")] for layer in layers]


def _lint(root: Path) -> tuple[int, str]:
    """import-linter's contracts (pyproject.toml) on the package under ``root``, in a fresh interpreter."""
    import os
    import subprocess
    import sys

    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=root, env=env, capture_output=True,
                          text=True,
                          timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_every_module_of_the_package_has_a_layer():
    """A new module must take its place in the layers (no module escapes the contract by being unlisted)."""
    listed = [name for layer in _layers() for name in layer]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    package = ROOT / "bouquet"
    present = {f"bouquet.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"} | \
              {f"bouquet.{p.parent.name}" for p in package.glob("*/__init__.py")}
    assert set(listed) == present


def test_imports_keep_the_layers_and_the_math_stays_pure():
    """``lint-imports``: 0 imports up the layers (every import counts: in functions and under
    ``TYPE_CHECKING`` too), the math imports no Flower / torch / Ray, the strategies no torch / Ray."""
    code, output = _lint(ROOT)
    assert code == 0, output
    assert "3 kept, 0 broken" in output


@pytest.mark.parametrize(("module", "added", "arrow"), [
    ("strategies/aggregation.py", "\n\ndef _upward():\n    from bouquet.config import AppConfig\n\n    return AppConfig\n",
     "bouquet.strategies.aggregation -> bouquet.config"),
    ("params.py", "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from bouquet.families import Family\n",
     "bouquet.params -> bouquet.families"),
])
def test_an_import_up_the_layers_breaks_the_contract(tmp_path, module, added, arrow):
    """The check can fail: the package with one function-level import of ``bouquet.config`` added to the
    strategies (below the config), or one annotation-only import of the families added to ``bouquet.params``
    (the bottom layer), breaks the layers contract."""
    import shutil

    shutil.copytree(ROOT / "bouquet", tmp_path / "bouquet", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "bouquet" / module
    target.write_text(target.read_text() + added)
    code, output = _lint(tmp_path)
    assert code != 0
    assert arrow in output


def test_architecture_lists_the_layers_the_check_keeps():
    """docs/ARCHITECTURE.md's layer list is the contract's, line for line (the page cannot go stale)."""
    import re

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    (block,) = re.findall(r"```layers\n(.*?)```", text, flags=re.DOTALL)
    documented = [[name.strip() for name in line.split("|")] for line in block.strip().splitlines()]
    assert documented == _layers()


def test_the_strategies_install_without_torch_or_ray():
    """``pip install bouquet-fl`` is the strategies alone (they import neither torch nor Ray: the import
    contract above); the app's extra brings torch and Flower's simulation (Ray)."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements):
        return {re.split(r"[<>=\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}

    assert names(project["dependencies"]) == {"flwr", "numpy", "scikit-learn"}
    assert not any("simulation" in r for r in project["dependencies"])
    assert {"torch", "flwr", "pandas", "matplotlib"} <= names(project["optional-dependencies"]["app"])
    assert any("flwr[simulation]" in r for r in project["optional-dependencies"]["app"])
