"""Hostile cases of the CLI's failures (issue 19, "one line for every failure"): non-finite option
values, devices that are not there, addresses to serve on, a full disk, Ctrl-C and running out of
memory midway, and passwords in URLs each end in one stderr line with exit 2 (130 for Ctrl-C),
leaving every file as it was and no temporary behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geodbk.cli import main
from geodbk.fit.fitting import fit_dataset

COARSE = ("--resolution", "0.1", "--no-progress")


@pytest.fixture(scope="module")
def base(tmp_path_factory, pr_dataset) -> Path:
    root = tmp_path_factory.mktemp("hostile-failures")
    model = fit_dataset(pr_dataset, "knn", epochs=1, progress=False, device="cpu")
    model.save(root / "knn.pt")
    pr_dataset.save(root / "dataset.parquet")
    assert main(["predict", "--model", str(root / "knn.pt"), "--out", str(root / "grid.nc"), *COARSE]) == 0
    (root / "p.geojson").write_text('{"type": "FeatureCollection", "features": []}')
    return root


def ingest(w: Path, *extra: str) -> list[str]:
    return ["ingest", "--quarters", "2023Q4", "--out", str(w / "d.parquet"), *extra]


def fit(w: Path, *extra: str) -> list[str]:
    return ["fit", "--dataset", str(w / "dataset.parquet"), "--out", str(w / "run"), "--models", "knn", "--no-progress",
            *extra]


def predict(w: Path, *extra: str) -> list[str]:
    return ["predict", "--model", str(w / "knn.pt"), "--out", str(w / "g.nc"), *COARSE, *extra]


def summarize(w: Path, *extra: str) -> list[str]:
    return ["summarize", "--model", str(w / "knn.pt"), "--polygons", str(w / "p.geojson"), "--out", str(w / "s.csv"),
            *extra]


def demo(w: Path, *extra: str) -> list[str]:
    return ["demo", "--out", str(w / "demo"), "--models", "knn", *extra]


# --- non-finite numbers where a finite one is needed ---------------------------------------------
FINITE_OPTIONS: dict[str, tuple[Callable[..., list[str]], str]] = {
    "ingest --urban-threshold": (ingest, "--urban-threshold"),
    "ingest --buffer": (ingest, "--buffer"),
    "ingest --block-km": (ingest, "--block-km"),
    "fit --lr": (fit, "--lr"),
    "fit --min-wavelength": (fit, "--min-wavelength"),
    "fit --coordinate-jitter": (fit, "--coordinate-jitter"),
    "fit --block-km": (fit, "--block-km"),
    "predict --threshold": (predict, "--threshold"),
    "predict --max-distance": (predict, "--max-distance"),
    "summarize --threshold": (summarize, "--threshold"),
    "demo --threshold": (demo, "--threshold"),
    "demo --max-distance": (demo, "--max-distance"),
}
NON_FINITE = ["nan", "NaN", "inf", "-inf", "1e999"]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("option", list(FINITE_OPTIONS))
def test_a_non_finite_option_value_is_one_line(hostile, base, option: str, value: str) -> None:
    make_argv, flag = FINITE_OPTIONS[option]
    outcome = hostile(make_argv(base, f"{flag}={value}"), base, expect="refused")
    assert flag in outcome.stderr[-1] and "finite" in outcome.stderr[-1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: v <= 0)
       | st.sampled_from([float("nan"), float("inf"), float("-inf")]))
def test_threshold_and_distance_must_be_positive_finite(hostile, base, value: float) -> None:
    """Any value but a positive finite number is refused before the model loads (the model path is missing)."""
    for flag in ("--threshold", "--max-distance"):
        argv = ["predict", "--model", str(base / "absent.pt"), "--out", str(base / "g.nc"), f"{flag}={value!r}"]
        outcome = hostile(argv, base, expect="refused")
        assert flag in outcome.stderr[-1]


# --- devices ----------------------------------------------------------------------------------------
DEVICES = {
    "cuda": "CUDA is not available", "cuda:0": "CUDA is not available", "cuda:7": "CUDA", "gpu": "not a torch device",
    "tpu": "not a torch device", "cuda:-1": "", "meta": "cpu, cuda or mps", "": "not a torch device",
}
DEVICE_COMMANDS = {"predict": predict, "fit": fit, "demo": demo}


@pytest.mark.parametrize("device", list(DEVICES))
@pytest.mark.parametrize("command", list(DEVICE_COMMANDS))
def test_a_device_that_is_not_there_is_named(hostile, base, command: str, device: str) -> None:
    """--device cuda on CPU-only torch said "not a geodbk model file" (finding: misleading messages)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    outcome = hostile(DEVICE_COMMANDS[command](base, "--device", device), base, expect="refused")
    assert "--device" in outcome.stderr[-1] and DEVICES[device] in outcome.stderr[-1]
    assert "not a geodbk model" not in outcome.stderr[-1]


# --- serve: argument checks only, never a server --------------------------------------------------
@pytest.fixture
def no_server(monkeypatch) -> list[list[str]]:
    """Record the server command instead of starting it."""
    started: list[list[str]] = []

    def record(path, argv, env=None):
        started.append(list(argv))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", record)
    monkeypatch.setattr(subprocess, "call", lambda argv, **kw: started.append(list(argv)) or 0)
    return started


SERVE_REFUSED = {
    "999.1.1.1": ["--address", "999.1.1.1"],
    "not-a-host": ["--address", "no such host.invalid"],
    "bad-ipv6": ["--address", "::zz::"],
    "empty-address": ["--address", ""],
    "port-0": ["--port", "0"],
    "port-70000": ["--port", "70000"],
    "port-negative": ["--port", "-1"],
    "port-not-a-number": ["--port", "http"],
    "missing-polygons": ["--polygons", "absent.geojson"],
    "address-of-another-machine": ["--address", "192.0.2.1"],
}


@pytest.mark.parametrize("case", list(SERVE_REFUSED))
def test_serve_refuses_what_it_cannot_listen_on(hostile, base, no_server, case: str) -> None:
    outcome = hostile(["serve", "--run", str(base), *SERVE_REFUSED[case]], base, expect="refused")
    assert not no_server and "ERROR: ERROR" not in " ".join(outcome.stderr)


@pytest.mark.parametrize("address", ["0.0.0.0", "::"])
def test_serve_on_every_interface_warns_that_there_is_no_authentication(hostile, base, no_server, address) -> None:
    outcome = hostile(["serve", "--run", str(base), "--address", address, "--port", "0"], base, expect="refused")
    assert "--port" in outcome.stderr[-1]  # port 0 is refused, after nothing was started
    outcome = hostile(["serve", "--run", str(base), "--address", address, "--port", "5987"], base)
    if outcome.ok:
        warnings = [line for line in outcome.stderr if ": warning:" in line]
        assert len(warnings) == 1 and "no authentication" in warnings[0] and no_server


# --- the system refuses a write ----------------------------------------------------------------------
@pytest.fixture
def full_disk(base, tmp_path):
    """A 256 KiB tmpfs at ``tmp_path/full``, filled but for ``leave`` bytes (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)]).returncode:
        pytest.skip("cannot mount a tmpfs here")

    def fill(leave: int) -> Path:
        with open(mount / "filler", "wb") as out:
            try:
                out.write(b"\0" * (256 * 1024 - leave))
                out.flush()
            except OSError:
                pass
        return mount

    yield fill
    subprocess.run(["umount", "-l", str(mount)])


FULL_DISK_WRITES = {
    "export-geotiff": lambda w, m: ["export", "--grid", str(w / "grid.nc"), "--geotiff", str(m / "g.tif")],
    "export-cog": lambda w, m: ["export", "--grid", str(w / "grid.nc"), "--geotiff", str(m / "g.tif"), "--cog"],
    "export-netcdf": lambda w, m: ["export", "--grid", str(w / "grid.nc"), "--netcdf", str(m / "g.nc")],
    "export-zarr": lambda w, m: ["export", "--grid", str(w / "grid.nc"), "--zarr", str(m / "g.zarr")],
    "export-tiles": lambda w, m: ["export", "--model", str(w / "knn.pt"), "--dataset", str(w / "dataset.parquet"),
                                  "--test-tiles", str(m / "t.geojson")],
    "predict-nc": lambda w, m: ["predict", "--model", str(w / "knn.pt"), "--out", str(m / "g.nc"), *COARSE],
    "predict-zarr": lambda w, m: ["predict", "--model", str(w / "knn.pt"), "--out", str(m / "g.zarr"), *COARSE],
    "fit": lambda w, m: ["fit", "--dataset", str(w / "dataset.parquet"), "--out", str(m / "run"), "--models", "knn",
                         "--device", "cpu", "--no-progress"],
}


@pytest.mark.parametrize("leave", [0, 6000], ids=["full", "nearly-full"])
@pytest.mark.parametrize("case", list(FULL_DISK_WRITES))
def test_a_full_disk_is_one_line_that_says_so(hostile, base, full_disk, case: str, leave: int) -> None:
    """A full disk: one line naming it, never "Permission denied" or "wrote" (finding 2)."""
    mount = full_disk(leave)
    outcome = hostile(FULL_DISK_WRITES[case](base, mount), mount.parent)
    if outcome.ok:  # the output fitted in what was left: it must be whole
        assert leave and not any(p.stat().st_size == 0 for p in mount.rglob("*") if p.is_file())
        return
    assert "no space left on device" in outcome.stderr[-1].lower(), outcome.stderr
    assert "permission denied" not in outcome.stderr[-1].lower()
    kept = [p.name for p in mount.rglob("*") if p.is_file() and p.name not in ("filler", ".geodbk.lock")]
    assert not kept, kept


# --- an unwritable folder (chmod does not bite as root) ------------------------------------------------
UNWRITABLE = {
    "ingest": lambda w, ro: ["ingest", "--quarters", "2023Q4", "--out", str(ro / "d.parquet")],
    "predict": lambda w, ro: ["predict", "--model", str(w / "knn.pt"), "--out", str(ro / "g.nc"), *COARSE],
    "export": lambda w, ro: ["export", "--grid", str(w / "grid.nc"), "--geotiff", str(ro / "g.tif")],
    "fit": lambda w, ro: ["fit", "--dataset", str(w / "dataset.parquet"), "--out", str(ro / "run"), "--models", "knn"],
    "fit-into-a-new-folder-below": lambda w, ro: ["fit", "--dataset", str(w / "dataset.parquet"), "--out",
                                                  str(ro / "a" / "run"), "--models", "knn"],
}


@pytest.mark.parametrize("case", list(UNWRITABLE))
def test_an_unwritable_folder_is_one_line(hostile, base, tmp_path, case: str) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders: chmod does not bite")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        outcome = hostile(UNWRITABLE[case](base, locked), tmp_path, expect="refused")
    finally:
        locked.chmod(0o755)
    assert "not writable" in outcome.stderr[-1] or "permission denied" in outcome.stderr[-1].lower()


# --- interrupted, or out of memory, midway --------------------------------------------------------
def export_netcdf(w: Path) -> list[str]:
    return ["export", "--grid", str(w / "grid.nc"), "--netcdf", str(w / "copy.nc")]


def export_geotiff(w: Path) -> list[str]:
    return ["export", "--grid", str(w / "grid.nc"), "--geotiff", str(w / "copy.tif")]


def predict_out(w: Path) -> list[str]:
    return predict(w)


def fit_run(w: Path) -> list[str]:
    return fit(w, "--device", "cpu")


MIDWAY = {  # (command, where the failure is injected)
    "export-netcdf": (export_netcdf, "xarray.Dataset.to_netcdf"),
    "export-geotiff": (export_geotiff, "geodbk.io.geotiff._read_every_block"),
    "predict": (predict_out, "geodbk.maps.stores.NetCDFSink.write"),
    "fit-metrics": (fit_run, "geodbk.io.run_folder.save_metrics"),
    "fit-model": (fit_run, "geodbk.fit.geomodel.write_payload"),
}
RAISED = {"ctrl-c": (KeyboardInterrupt, 130, "interrupted"), "out-of-memory": (MemoryError, 2, "out of memory"),
          "disk-error": (OSError(5, "Input/output error"), 2, "input/output error"),
          "permission": (PermissionError(13, "Permission denied", "/mnt/out"), 2, "/mnt/out: permission denied")}


@pytest.mark.parametrize("raised", list(RAISED))
@pytest.mark.parametrize("case", list(MIDWAY))
def test_a_failure_midway_leaves_no_temporary(hostile, base, tmp_path, monkeypatch, case: str, raised: str) -> None:
    """Ctrl-C (SIGTERM is raised the same way, geodbk.errors.Terminated), MemoryError or an I/O error
    in the middle of a write: one line, and the staged output is gone (finding 4)."""
    import importlib

    work = tmp_path / "w"
    shutil.copytree(base, work, copy_function=os.link)
    make_argv, where = MIDWAY[case]
    error, status, text = RAISED[raised]
    module_name, _, attribute = where.rpartition(".")
    try:
        owner = importlib.import_module(module_name)
    except ModuleNotFoundError:
        module_name, _, cls = module_name.rpartition(".")
        owner = getattr(importlib.import_module(module_name), cls)
    original = getattr(owner, attribute)

    def fail_midway(*args, **kwargs):
        original(*args, **kwargs)  # the staged output is written (in part) ...
        raise error  # ... and then the failure

    monkeypatch.setattr(owner, attribute, fail_midway)
    outcome = hostile(make_argv(work), work, expect="refused")
    assert outcome.status == status and text in outcome.stderr[-1].lower()


# --- passwords in URLs --------------------------------------------------------------------------------
SECRET_URLS = {
    "tiles": lambda w: ingest(w)[:1] + ["--tiles", "http://alice:s3cret@127.0.0.1:9/tiles.parquet"],
    "tiles-https": lambda w: ingest(w)[:1] + ["--tiles", "https://bob:hunter2:x@127.0.0.1:9/t.zip"],
    "urban-areas": lambda w: ingest(w) + ["--urban-areas", "http://carol:pa55@127.0.0.1:9/ua.zip"],
    "region": lambda w: ingest(w) + ["--region", "http://dave:letmein@127.0.0.1:9/region.geojson"],
}


@pytest.mark.parametrize("case", list(SECRET_URLS))
def test_a_password_in_a_url_is_never_echoed(hostile, base, case: str) -> None:
    argv = SECRET_URLS[case](base)
    outcome = hostile(argv, base, expect="refused")
    secret = next(a for a in argv if "@" in a).split("//")[1].split("@")[0].split(":", 1)[1]
    assert secret not in " ".join(outcome.stderr)
