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


def test_ingest_of_global_quarters_keeps_the_state_and_equals_the_in_memory_dataset(tmp_path, capsys):
    """Two generated Ookla-schema global quarters clipped to Georgia: the streamed CLI dataset is
    the one that reading every row into memory gives."""
    import sys
    from pathlib import Path

    from geodbk.dataset.spatial_dataset import build_dataset
    from geodbk.ingest.ookla import read_tiles

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import synthetic_ookla  # benchmarks/synthetic_ookla.py, not a package

    files = synthetic_ookla.write_global_quarters(tmp_path, ["2023Q2", "2023Q3"], 3000, 3000, seed=1)
    out = tmp_path / "georgia.parquet"
    assert main(["ingest", "--tiles", *map(str, files), "--region", "GA", "--out", str(out)]) == 0
    assert "Georgia, download (Mbps)" in capsys.readouterr().out
    streamed = SpatialDataset.load(out)
    in_memory = build_dataset(read_tiles(files), "GA")
    pd.testing.assert_frame_equal(streamed.frame, in_memory.frame)
    assert streamed.dropped == in_memory.dropped and streamed.dropped["outside_region"] > 5000


def test_ingest_of_ookla_quarters_by_name_reads_their_global_files(tmp_path, monkeypatch):
    """``--tiles mobile:2023Q3 mobile:2023Q4``: Ookla's global files of two quarters, through the
    download cache (here holding the shipped sample's rows of each quarter under its URL's name),
    give the dataset that the sample itself gives for those quarters."""
    from geodbk.ingest.names import ookla_url
    from geodbk.ingest.sources import cache_path

    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path / "cache")
    sample = pd.read_parquet(paths.PUERTO_RICO_MOBILE)
    for quarter in (3, 4):
        cached = cache_path(ookla_url("mobile", 2023, quarter))
        cached.parent.mkdir(parents=True)
        sample[(sample["year"] == 2023) & (sample["quarter"] == quarter)].to_parquet(cached)
    region = ["--region", "Ponce, PR"]
    assert main(["ingest", "--tiles", "mobile:2023Q3", "mobile:2023Q4", *region, "--out", str(tmp_path / "a.parquet")]) == 0
    assert main(["ingest", *region, "--quarters", "2023Q3,2023Q4", "--out", str(tmp_path / "b.parquet")]) == 0
    by_name, from_sample = (SpatialDataset.load(tmp_path / name).frame for name in ("a.parquet", "b.parquet"))
    assert len(by_name) > 400
    pd.testing.assert_frame_equal(by_name.drop(columns="geometry"), from_sample.drop(columns="geometry"))
