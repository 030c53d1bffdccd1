"""Data-parallel training (geodbk.fit.distributed, ``geodbk fit --nproc``): 2 gloo processes give
the 1-process fit with the same global batch."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from geodbk.fit.distributed import DataParallel
from geodbk.fit.regressor import build_model
from geodbk.fit.train import fit_arrays
from geodbk.models import ModelConfig
from geodbk.models.backbone import ResNetBackbone
from geodbk.models.config import TrainConfig
from geodbk.models.zoo import get_model_spec

pytestmark = pytest.mark.usefixtures("single_thread")

WORLD = 2
CONFIG = ModelConfig(hidden=16, rank=16, dtype="float64", test_noise=True)
# 226 rows in batches of 45: five of 23 + 22 rows per rank, and a last batch of 1 row (1 + 0)
BATCH = 45
FITS = {
    "dbk-rbf": TrainConfig(epochs=4, batch_size=BATCH, lr=1e-2, patience=None, progress=False, device="cpu"),
    "exact-dbk": TrainConfig(epochs=3, lr=1e-2, full_batch_max=200, patience=None, progress=False, device="cpu"),
    "knn": TrainConfig(progress=False, device="cpu"),
}


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    X, X_val = rng.uniform(-1, 1, (226, 2)), rng.uniform(-1, 1, (61, 2))

    def f(x: np.ndarray) -> np.ndarray:
        return np.sin(3 * x[:, 0]) * x[:, 1]

    return {
        "X": X, "y": f(X) + 0.1 * rng.standard_normal(226), "X_val": X_val,
        "y_val": f(X_val) + 0.1 * rng.standard_normal(61),
        "tests": rng.integers(1, 20, 226).astype(float), "tests_val": rng.integers(1, 20, 61).astype(float),
    }


def _fit(kind: str, train_config: TrainConfig) -> list[dict[str, float]]:
    return fit_arrays(kind, model_config=CONFIG, train_config=train_config, **_data()).history


def _gradients(kind: str, parallel: DataParallel | None) -> tuple[float, torch.Tensor]:
    """Loss and flat gradient of one objective evaluation on a batch of 45 rows."""
    data = {k: torch.as_tensor(v[:BATCH]) for k, v in _data().items()}
    torch.manual_seed(0)
    model = build_model(kind, 2, CONFIG)
    objective = get_model_spec(kind).objective(FITS[kind])
    with parallel.sharded_rows(model) if parallel else contextlib.nullcontext():
        loss = objective(model, data["X"], data["y"], 226, data["tests"])
    loss.backward()
    if parallel:
        parallel.average_gradients(list(model.parameters()))
    return float(loss.detach()), _flat_gradient(model)


def _per_shard_gradient(parallel: DataParallel) -> torch.Tensor:
    """What averaging per-shard losses (DistributedDataParallel's scheme) gives for dbk-rbf."""
    data = {k: torch.as_tensor(v[:BATCH]) for k, v in _data().items()}
    torch.manual_seed(0)
    model = build_model("dbk-rbf", 2, CONFIG)
    part = parallel.shard(BATCH)
    get_model_spec("dbk-rbf").objective(FITS["dbk-rbf"])(
        model, data["X"][part], data["y"][part], 226, data["tests"][part]).backward()
    parallel.average_gradients(list(model.parameters()))
    return _flat_gradient(model)


def _flat_gradient(model: torch.nn.Module) -> torch.Tensor:
    """The gradients of the parameters that have one (exact MML leaves q(w) out), flattened."""
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def _worker(rank: int, root: str) -> None:
    """One gloo rank: the fits, the backbone's batch sizes in training, and one step's gradients."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=WORLD)
    try:
        rows: list[int] = []

        def record(module: torch.nn.Module, args: tuple) -> None:  # rows reaching the backbone in training
            if isinstance(module, ResNetBackbone) and module.training:
                rows.append(len(args[0]))

        hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
        histories = {kind: _fit(kind, tc) for kind, tc in FITS.items()}
        hook.remove()
        parallel = DataParallel.current()
        assert parallel is not None
        result = {
            "histories": histories, "rows": rows,
            "gradients": {kind: _gradients(kind, parallel) for kind in ("dbk-rbf", "exact-dbk")},
            "per_shard": _per_shard_gradient(parallel),
        }
        torch.save(result, f"{root}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("gloo")
    mp.spawn(_worker, args=(str(root),), nprocs=WORLD)
    return [torch.load(root / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(FITS))
def test_two_gloo_processes_give_the_one_process_fit(ranks, kind):
    single = _fit(kind, FITS[kind])
    for result in ranks:
        parallel = result["histories"][kind]
        assert [h["epoch"] for h in parallel] == [h["epoch"] for h in single]
        np.testing.assert_allclose([h["val_nll"] for h in parallel], [h["val_nll"] for h in single], atol=1e-4)
        np.testing.assert_allclose([h["loss"] for h in parallel], [h["loss"] for h in single], atol=1e-4)
    first, second = (pd.DataFrame(result["histories"][kind]) for result in ranks)
    pd.testing.assert_frame_equal(first, second, check_exact=True)  # the ranks never diverge


@pytest.mark.slow
def test_each_rank_runs_the_model_on_its_own_shard(ranks):
    epoch_rows = {0: [23] * 5 + [1], 1: [22] * 5 + [0]}  # 45 rows = 23 + 22; the last batch's 1 row = 1 + 0
    # exact-dbk: 200 rows (full_batch_max) a step, then refresh's q(w) from all 226 rows on every rank
    full_batch = {0: [100, 226] * 3, 1: [100, 226] * 3}
    for rank, result in enumerate(ranks):
        assert result["rows"] == epoch_rows[rank] * 4 + full_batch[rank], rank


@pytest.mark.slow
def test_one_step_has_the_whole_batch_gradient(ranks):
    for kind in ("dbk-rbf", "exact-dbk"):
        loss, grad = _gradients(kind, None)
        for result in ranks:
            parallel_loss, parallel_grad = result["gradients"][kind]
            assert parallel_loss == pytest.approx(loss, abs=1e-12)
            np.testing.assert_allclose(parallel_grad, grad, atol=1e-10)
    # averaging per-shard losses instead is not the whole-batch step: dPPGP's k_b is a batch maximum
    assert float((ranks[0]["per_shard"] - _gradients("dbk-rbf", None)[1]).abs().max()) > 1e-3


def test_the_comparison_resolves_a_different_global_batch():
    same = _fit("dbk-rbf", FITS["dbk-rbf"])
    other = _fit("dbk-rbf", dataclasses.replace(FITS["dbk-rbf"], batch_size=BATCH - 1))
    assert abs(same[-1]["val_nll"] - other[-1]["val_nll"]) > 1e-3


# --- geodbk fit --nproc ------------------------------------------------------------------------
def _fit_command(dataset: Path, out: Path, *extra: str) -> list[str]:
    return ["fit", "--dataset", str(dataset), "--out", str(out), "--models", "dbk-rbf", "--epochs", "2",
            "--hidden", "8", "--rank", "8", "--batch-size", "128", "--dtype", "float64", "--device", "cpu",
            "--no-progress", *extra]


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory, pr_dataset) -> Path:
    """Every fifth row of the Puerto Rico dataset (1,284 tiles: 134 validation and 119 test rows, over
    the 100 each that geodbk fit needs)."""
    path = tmp_path_factory.mktemp("cli") / "dataset.parquet"
    dataclasses.replace(pr_dataset, frame=pr_dataset.frame.iloc[::5].copy()).save(path)
    return path


@pytest.mark.slow
def test_fit_nproc_2_writes_the_run_once_with_the_one_process_metrics(small_dataset, tmp_path):
    from geodbk.cli import main

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "geodbk", *_fit_command(small_dataset, tmp_path / "two"),
                           "--nproc", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("dbk-rbf: best epoch") == 1 and done.stdout.count("split: train") == 1, done.stdout
    assert sorted(p.name for p in (tmp_path / "two").rglob("*") if not p.name.startswith(".")) == [
        "dataset.parquet", "dbk-rbf.pt", "metrics.csv", "metrics.json", "models"]
    assert sorted(p.name for p in (tmp_path / "two").glob(".*")) == [".geodbk", ".geodbk.lock"]  # marker, lock
    assert main(_fit_command(small_dataset, tmp_path / "one")) == 0
    two, one = (pd.read_csv(tmp_path / run / "metrics.csv") for run in ("two", "one"))
    np.testing.assert_allclose(two["NLL"], one["NLL"], atol=1e-4)


@pytest.mark.slow
def test_a_failed_worker_ends_the_job_with_its_status_and_one_line(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    (tmp_path / "none.parquet").write_bytes(b"not a parquet file")  # a regular file each worker fails to read
    done = subprocess.run([sys.executable, "-m", "geodbk", *_fit_command(tmp_path / "none.parquet", tmp_path / "run"),
                           "--nproc", "2"], capture_output=True, text=True, env=env, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "geodbk fit: error: cannot read dataset file" in done.stderr, done.stderr
    assert lines[-1].startswith("geodbk fit: error: a worker of 2 failed with exit status 2"), lines
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_fit_nproc_0_is_a_one_line_error(tmp_path, capsys):
    from geodbk.cli import main

    (tmp_path / "dataset.parquet").touch()  # --dataset must name a regular file before --nproc is checked
    assert main(_fit_command(tmp_path / "dataset.parquet", tmp_path / "run", "--nproc", "0")) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--nproc must be >= 1, got 0" in lines[0], lines


def test_the_workers_get_the_same_fit_arguments(tmp_path):
    from geodbk.cli import build_parser
    from geodbk.cli.data import _fit_argv

    (tmp_path / "d.parquet").touch()  # parsing checks that --dataset is a regular file
    argv = _fit_command(tmp_path / "d.parquet", Path("run"), "--nproc", "3", "--seed", "-4", "--lr", "0.003",
                        "--split", "spatial-block", "--paper-size", "--protocol", "paper")
    args = build_parser().parse_args(argv)
    again = build_parser().parse_args(_fit_argv(args))
    assert again.nproc == 1 and vars(again) == {**vars(args), "nproc": 1}
