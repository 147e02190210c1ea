"""Every relative link and every repository path a Markdown file names resolves to a tracked file (or a folder
holding tracked files), so that no document points at a file git does not keep (as ``docs/results/`` once was:
ignored by a ``results/`` rule meant for run outputs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The top-level folders whose paths documents name; a path that names a placeholder (``<data>``, ``*``, ``{a,b}``)
#: is a pattern, not a file, and is not checked.
FOLDERS = ("bouquet", "docs", "scripts", "tests", "experiments", "docker", ".ci")
PATH = re.compile(r"(?<![\w./<>-])((?:" + "|".join(re.escape(f) for f in FOLDERS) + r")/[A-Za-z0-9_./<>*{}-]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATTERN_CHARS = set("<>*{}")


def tracked_files() -> set[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("the link check needs the git checkout (git ls-files)")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {name for name in out.split("\0") if name}


def folders(files: set[str]) -> set[str]:
    out = set()
    for name in files:
        parts = name.split("/")
        out.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return out


def unresolved(markdown: str, text: str, files: set[str], dirs: set[str]) -> list[str]:
    """The paths and links of ``text`` (the Markdown file ``markdown``, relative to the root) that name no tracked
    file or folder."""
    missing = []
    for match in PATH.finditer(text):
        path = match.group(1)
        if PATTERN_CHARS & set(path):
            continue
        path = path.rstrip("/").rstrip(".")
        if path not in files and path not in dirs:
            missing.append(path)
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = os.path.normpath(str(Path(markdown).parent / target.split("#")[0]))
        if path not in files and path not in dirs:
            missing.append(f"link {target}")
    return missing


def test_every_path_and_link_in_the_docs_is_tracked():
    files = tracked_files()
    dirs = folders(files)
    documents = sorted(name for name in files if name.endswith(".md"))
    assert "docs/results/water.md" in documents, "docs/results/ is not tracked (.gitignore?)"
    broken = {doc: miss for doc in documents if (miss := unresolved(doc, (ROOT / doc).read_text(), files, dirs))}
    assert not broken, "paths and links that name no tracked file:\n" + "\n".join(
        f"{doc}: {', '.join(miss)}" for doc, miss in broken.items())


def test_the_check_finds_what_is_missing():
    files = {"docs/GUIDE.md", "docs/results/water.md", "bouquet/config.py"}
    text = ("see `docs/results/water.md` and [the guide](../GUIDE.md), `docs/results/gone.md`, "
            "[a link](missing.md), `docs/figures/groups-<data>/` (a pattern), https://flower.ai/x and "
            "bouquet/config.py.")
    assert unresolved("docs/results/x.md", text, files, folders(files)) == ["docs/results/gone.md", "link missing.md"]


def test_run_outputs_are_ignored_at_the_root_only():
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/x.json"], check=False, cwd=ROOT).returncode == 0
    docs_ignored = subprocess.run(["git", "check-ignore", "-q", "docs/results/x.md"], check=False, cwd=ROOT).returncode == 0
    assert ignored and not docs_ignored
