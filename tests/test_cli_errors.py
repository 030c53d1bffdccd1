"""Every CLI failure caused by bad input is one line on stderr with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from geodbk.cli import main
from geodbk.errors import TrainingError
from geodbk.fit.fitting import fit_dataset


@pytest.fixture(scope="module")
def files(tmp_path_factory, pr_dataset):
    """A real knn model and dataset file, and files that are neither."""
    root = tmp_path_factory.mktemp("bad-input")
    model = fit_dataset(pr_dataset, "knn", epochs=1, progress=False, device="cpu")
    model.save(root / "knn.pt")
    pr_dataset.save(root / "dataset.parquet")
    (root / "notes.pt").write_text("not a model\n" * 20)
    (root / "notes.parquet").write_text("not a dataset\n")
    return root


def run(argv: list[str]) -> int:
    """``main(argv)``'s exit status, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code)


def assert_one_line_error(capsys, argv: list[str], match: str) -> None:
    assert run(argv) == 2, argv
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "error:" in lines[0] and match.lower() in lines[0].lower(), lines[0]


def fit_args(f, *extra: str) -> list[str]:
    return ["fit", "--dataset", str(f / "dataset.parquet"), "--out", str(f / "run"), "--no-progress", *extra]


def predict_args(f, *extra: str, model: str = "knn.pt") -> list[str]:
    return ["predict", "--model", str(f / model), "--out", str(f / "grid.nc"), "--no-progress", *extra]


BAD = {
    # unknown kinds and bad config values
    "fit unknown kind": (lambda f: fit_args(f, "--models", "dbk-rbf,gradient-boost"), "gradient-boost"),
    "fit zero epochs": (lambda f: fit_args(f, "--epochs", "0"), "--epochs"),
    "fit negative rank": (lambda f: fit_args(f, "--rank", "-8"), "--rank"),
    "fit zero lr": (lambda f: fit_args(f, "--lr", "0"), "--lr"),
    "fit lr not a number": (lambda f: fit_args(f, "--lr", "fast"), "--lr"),
    "fit bad block": (lambda f: fit_args(f, "--block-km", "-1"), "--block-km"),
    "fit negative jitter": (lambda f: fit_args(f, "--coordinate-jitter", "-500"), "--coordinate-jitter"),
    "fit unknown protocol": (lambda f: fit_args(f, "--protocol", "time-space"), "--protocol"),
    "demo unknown kind": (lambda f: ["demo", "--out", str(f / "demo"), "--models", "dnn,svm"], "svm"),
    "demo zero epochs": (lambda f: ["demo", "--out", str(f / "demo"), "--epochs", "0"], "--epochs"),
    "demo negative resolution": (lambda f: ["demo", "--out", str(f / "demo"), "--resolution", "-0.01"], "resolution"),
    "demo zero resolution": (lambda f: ["demo", "--out", str(f / "demo"), "--resolution", "0m"], "resolution"),
    "demo bad quarters": (lambda f: ["demo", "--out", str(f / "demo"), "--quarters", "2023Q1,2023Q5"], "2023Q5"),
    "demo bad quarter": (lambda f: ["demo", "--out", str(f / "demo"), "--quarter", "Q4-2023"], "quarter"),
    "demo bad change": (lambda f: ["demo", "--out", str(f / "demo"), "--change", "2023Q4"], "--change"),
    "demo bad change quarter": (lambda f: ["demo", "--out", str(f / "demo"), "--change", "2022Q4:2023Q7"], "2023Q7"),
    "demo unknown crs": (lambda f: ["demo", "--out", str(f / "demo"), "--crs", "EPSG:999999"], "CRS"),
    "demo unknown region": (lambda f: ["demo", "--out", str(f / "demo"), "--region", "TX"],
                            "covers Puerto Rico (PR) and Hawaii (HI) only, not 'Texas'"),
    "demo misspelt county": (lambda f: ["demo", "--out", str(f / "demo"), "--region", "Kauia, HI"],
                             "closest: Kauai County, HI"),
    "demo negative threshold": (lambda f: ["demo", "--out", str(f / "demo"), "--threshold", "-5"], "--threshold"),
    # files that are missing or are not what they should be
    "fit missing dataset": (lambda f: ["fit", "--dataset", str(f / "none.parquet"), "--out", str(f / "run")],
                            "none.parquet"),
    "fit dataset that is not one": (lambda f: ["fit", "--dataset", str(f / "notes.parquet"), "--out", str(f / "r")],
                                    "notes"),
    "predict missing model": (lambda f: predict_args(f, model="none.pt"), "none.pt"),
    "predict model that is not one": (lambda f: predict_args(f, model="notes.pt"), "not a geodbk model"),
    "predict zero resolution": (lambda f: predict_args(f, "--resolution", "0"), "resolution"),
    "predict bad quarters": (lambda f: predict_args(f, "--quarters", "2023Q4,2024Q0"), "2024Q0"),
    "predict bad change": (lambda f: predict_args(f, "--change", "2023Q4-2024Q1"), "--change"),
    "predict bad output": (lambda f: ["predict", "--model", str(f / "knn.pt"), "--out", str(f / "g.tif")], ".tif"),
    "predict knn at bf16": (lambda f: predict_args(f, "--precision", "bf16"), "no reduced-precision prediction"),
    "predict zero chunk rows": (lambda f: predict_args(f, "--chunk-rows", "0"), "--chunk-rows"),
    "predict unknown region": (lambda f: predict_args(f, "--region", "Atlantis"), "Atlantis"),
    "summarize model that is not one": (lambda f: ["summarize", "--model", str(f / "notes.pt"), "--polygons",
                                                   str(f / "p.geojson"), "--out", str(f / "s.csv")], "notes.pt"),
    "export missing grid": (lambda f: ["export", "--grid", str(f / "none.nc"), "--geotiff", str(f / "g.tif")],
                            "none.nc"),
    "ingest missing tiles": (lambda f: ["ingest", "--tiles", str(f / "none.parquet")], "none.parquet"),
    "unknown command": (lambda f: ["train"], "train"),
    # non-finite numbers and devices that are not there (issue 19)
    "predict nan threshold": (lambda f: predict_args(f, "--threshold", "nan"), "finite"),
    "fit inf lr": (lambda f: fit_args(f, "--lr", "inf"), "finite"),
    "predict unknown device": (lambda f: predict_args(f, "--device", "gpu"), "not a torch device"),
    "fit unknown device": (lambda f: fit_args(f, "--device", "tpu:0"), "not a torch device"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_with_exit_status_2(files, capsys, case: str) -> None:
    make_argv, match = BAD[case]
    assert_one_line_error(capsys, make_argv(files), match)
    assert not (files / "grid.nc").exists() and not (files / "demo").exists()


def test_non_finite_training_loss_is_one_line(files, capsys, monkeypatch) -> None:
    import geodbk.fit.fitting

    def diverge(*args, **kwargs):
        raise TrainingError("training loss is nan at epoch 3:\nlower --lr or use --dtype float64")

    monkeypatch.setattr(geodbk.fit.fitting, "fit_dataset", diverge)
    assert_one_line_error(capsys, fit_args(files, "--models", "dbk-rbf"), "nan at epoch 3")
    assert not (files / "run").exists()  # nothing written for a failed fit


def test_cuda_on_a_machine_without_it_says_so(files, capsys) -> None:
    """--device cuda on CPU-only torch said "not a geodbk model file"."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert_one_line_error(capsys, predict_args(files, "--device", "cuda"), "CUDA is not available")


def test_console_entry_and_module_print_one_line(files) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = ["predict", "--model", str(files / "notes.pt"), "--out", str(files / "g.nc")]
    console = os.path.join(os.path.dirname(sys.executable), "geodbk")
    for cmd in ([sys.executable, "-m", "geodbk", *argv], [console, *argv]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "geodbk predict: error:" in proc.stderr


def test_a_warning_is_printed_once_per_run_even_when_filters_change_between(monkeypatch, capsys):
    """The demo warned the same line four times: each step that changes warning filters resets
    Python's record of what it has shown. The CLI now prints each distinct warning line once."""
    import warnings

    import geodbk.cli.data as data
    from geodbk.cli import main

    def handler(args):
        for _ in range(3):
            warnings.warn("48 of 8328 point(s) lie outside the fitted extent", UserWarning, stacklevel=1)
            with warnings.catch_warnings():  # as a step that silences something else does
                warnings.simplefilter("ignore", DeprecationWarning)
        warnings.warn("another warning", UserWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(data, "_run_ingest", handler)
    assert main(["ingest"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["geodbk ingest: warning: 48 of 8328 point(s) lie outside the fitted extent",
                     "geodbk ingest: warning: another warning"]
