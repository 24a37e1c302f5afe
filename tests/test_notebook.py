"""examples/visualize_cuts.ipynb: kept without outputs in git, and it runs from top to bottom."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

if os.environ.get("CI"):  # CI installs the test extra: a missing package there is a failure, not a skip
    import ipykernel  # noqa: F401
    import nbclient
    import nbformat
else:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "visualize_cuts.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, "strip outputs before committing"


def test_notebook_runs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, if any cell fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    pngs = [base64.b64decode(o.data["image/png"]) for o in outputs if "data" in o and "image/png" in o.data]
    assert len(pngs) >= 3  # the cut, the layer view, the timeline (and the Pareto curve where it exists)
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" for png in pngs)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "saved activations:" in text
    assert "FusionDefinition" in text or "Thunder subsymbols" in text  # one emitted region
    assert "digraph remat_cut" in text
