"""notebooks/spatial_analysis.ipynb runs top to bottom in this venv and reaches sensible numbers.

The notebook is executed with nbclient on a kernel spec written to a temporary
``JUPYTER_PATH`` that points at this interpreter (``sys.executable``), so it runs against the
venv's geodbk and never a system Python. Its last cell prints one ``SUMMARY {json}`` line,
which the assertions read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "spatial_analysis.ipynb"
KERNEL_NAME = "geodbk-test-venv"


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code, "the notebook has no code cells"
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    jupyter_path = tmp_path_factory.mktemp("jupyter")
    spec_dir = jupyter_path / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "geodbk test venv",
        "language": "python",
        "env": {"OMP_NUM_THREADS": "2", "MPLBACKEND": "module://matplotlib_inline.backend_inline"},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    workdir = tmp_path_factory.mktemp("notebook")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(jupyter_path))
        client = nbclient.NotebookClient(
            nb, kernel_name=KERNEL_NAME, timeout=300, resources={"metadata": {"path": str(workdir)}}
        )
        client.execute()
    return nb


def _stdout(nb: nbformat.NotebookNode) -> str:
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "stream" and out.name == "stdout"
    )


def _summary(nb: nbformat.NotebookNode) -> dict:
    lines = [line for line in _stdout(nb).splitlines() if line.startswith("SUMMARY ")]
    assert len(lines) == 1, "the last cell prints one SUMMARY line"
    return json.loads(lines[0][len("SUMMARY ") :])


def test_notebook_runs_in_the_venv_kernel(executed):
    errors = [
        out for cell in executed.cells if cell.cell_type == "code" for out in cell.outputs if out.output_type == "error"
    ]
    assert errors == []
    # the kernel was this venv's interpreter
    assert _summary(executed)["python"] == sys.executable
    # five figures: the two maps, the PI-width violins, the correlation slices, the change
    # ECDFs with the sd comparison, the map of P(increase)
    images = [
        out
        for cell in executed.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(images) >= 5


def test_notebook_results_are_sensible(executed):
    s = _summary(executed)
    assert s["n_train"] > 4_000  # one quarter of Puerto Rico tiles, 80% of them
    dbk = s["metrics"]["dbk-rbf/overall"]
    # the fitted GP is at least as good as a constant Gaussian on held-out tiles (the spatial
    # signal in one quarter of tiles is weak; a miscalibrated fit scores far worse)
    assert dbk["NLL"] < s["constant_nll"] + 0.01
    assert 0.0 < dbk["MAE"] < 1.0
    assert 0.85 < dbk["coverage95"] <= 1.0
    for group in ("urban", "rural"):
        assert f"dbk-rbf/{group}" in s["metrics"]
        assert s["median_pi_width"][group] > 0
    # a correlation: bounded by 1 (Cauchy-Schwarz), high next to each reference point, and no
    # larger on average than next to it. The map's kernel includes the local residual part, whose
    # same-tile offsets the nearest grid cell (usually another tile) does not share: 0.73 there
    # on the demo fit, against 0.9+ for the deep kernel alone.
    assert s["max_abs_correlation"] <= 1.0 + 1e-3
    assert set(s["correlation_nearest_cell"]) >= {"urban", "rural"}
    for name, rho_near in s["correlation_nearest_cell"].items():
        q05, median = s["correlation_quantiles"][name]
        assert rho_near > 0.5, name
        assert q05 <= median <= rho_near + 1e-6, name
    # the change from a year before the latest quarter to the latest, at every observed tile
    assert s["change_quarters"] == ["2022Q4", "2023Q4"]
    for group in ("urban", "rural"):
        assert s["change_tiles"][group] > 100, group
        assert s["change_median_sd"][group] > 0, group
        improved, worse = s["share_improved_95"][group], s["share_worse_05"][group]
        assert 0.0 <= improved <= 1.0 and 0.0 <= worse <= 1.0 and improved + worse <= 1.0, group
        # one year moved the class medians of the observed tiles by a few percent; a fit
        # whose time trend ran away would not stay within 0.1 log10 (26%)
        assert abs(s["change_median_log10"][group]) < 0.1, group
    # urban tiles got faster in the data (tiles measured in both quarters) and in the model;
    # rural tiles are too few and too noisy in the data to assert a direction
    assert s["observed_median_change_log10"]["urban"] > 0
    assert s["change_median_log10"]["urban"] > 0
    # the two quarters' posterior errors are positively correlated, so the joint sd of the
    # change is below the naive sd that treats them as independent, at (nearly) every tile
    assert 0.0 < s["median_quarter_correlation"] <= 1.0
    assert s["joint_vs_naive_sd_ratio"] < 1.0
    assert s["share_joint_below_naive"] > 0.9
