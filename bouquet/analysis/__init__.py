"""Tables and figures of the studies, read from their run folders (:class:`bouquet.results.RunFolder`).

One module per study, each also a command line (``python -m bouquet.analysis.<module> --help``; the
``scripts/<module>.py`` of the same name runs it too): :mod:`~bouquet.analysis.hk_figures` (the HK paper's
comparison), :mod:`~bouquet.analysis.sckm_figures` (the SCKM studies), :mod:`~bouquet.analysis.groups_figures`
(known groups, coalition memory) and :mod:`~bouquet.analysis.attack_figures` (attacks).  They read what the
runs wrote and nothing else, so they run again on any copy of the results.
"""

from __future__ import annotations

from pathlib import Path


def figures_folder(base: str | Path, out: str | Path | None) -> Path:
    """Where a study's figures go (``out``, default ``<base>/figures``), created."""
    folder = Path(out) if out else Path(base) / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
