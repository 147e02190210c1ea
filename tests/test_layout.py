"""How the repository is laid out: tests import the package, never a script by its path."""

import ast
from pathlib import Path

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
