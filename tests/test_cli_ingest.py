"""``geodbk ingest`` through geodbk.cli.main."""

import pandas as pd

from geodbk import paths
from geodbk.cli import main
from geodbk.dataset.spatial_dataset import SpatialDataset


def test_ingest_default_sample_writes_the_dataset(tmp_path, capsys, pr_dataset):
    out = tmp_path / "dataset.parquet"
    assert main(["ingest", "--region", "PR", "--quarters", "2023Q4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("SpatialDataset: Puerto Rico, download (Mbps)")
    assert f"wrote {out}" in printed
    loaded = SpatialDataset.load(out)
    pd.testing.assert_frame_equal(loaded.frame, pr_dataset.frame)
    assert loaded.summary() in printed


def test_ingest_geojson_zip_for_hawaii_latency(capsys):
    code = main([
        "ingest", "--tiles", str(paths.HAWAII_MOBILE_GEOJSON_ZIP), "--region", "Hawaii",
        "--target", "latency", "--quarters", "2020Q3", "--buffer", "0", "--urban-threshold", "0.9",
    ])
    printed = capsys.readouterr().out
    assert code == 0
    assert "Hawaii, latency (ms)" in printed and "2020Q3" in printed and "2023Q4" not in printed
    assert "census-2020-county-urban-share>=0.9" in printed


def test_ingest_errors_are_one_line_with_status_2(tmp_path, capsys):
    assert main(["ingest", "--region", "Texas"]) == 2
    assert "only" in capsys.readouterr().err
    assert main(["ingest", "--tiles", str(tmp_path / "missing.parquet")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["ingest", "--year", "2023", "--quarter", "4"]) == 2
    assert "--service" in capsys.readouterr().err
    assert main(["ingest", "--quarters", "2031Q1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("geodbk ingest: error:") and "2031Q1" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())
