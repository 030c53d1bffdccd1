"""Milliseconds per training step and prediction throughput: geodbk vs GPyTorch's SVGP.

Times, on the same data in one run, for each (r, h) of ``--configs``:

* geodbk ``dbk-rbf`` (ResNet of width h + whitened RBF expansion of rank r, dPPGP loss),
  with eager steps (:class:`geodbk.fit.step.TrainingStep` with ``capture=False``),
* the same with the whole step captured as a CUDA graph (CUDA only),
* GPyTorch ``ApproximateGP`` + ``VariationalStrategy(learn_inducing_locations=True)``
  (whitened) + ``CholeskyVariationalDistribution``, ARD RBF on the coordinates,
  ``VariationalELBO``, batches indexed on the device,

all with rank r, batch size 1024 and AdamW(lr=1e-3); then prediction of the predictive
mean and variance at ``--points`` points (geodbk through its folded weights). Data: the
train split of the shipped Puerto Rico sample (``--data pr``, needs geopandas) or a
synthetic set of the same size and shape (``--data synthetic``), standardised targets.

Timing: each timed run is one epoch of ``--steps`` batches through
:func:`geodbk.fit.train.train_epoch` (so the once-per-epoch read is included), preceded
and followed by ``torch.cuda.synchronize()`` on CUDA. Runs are interleaved across the
models ``--repeats`` times after one warm-up epoch each (which also captures the graphs);
the minimum is reported with the median, the minimum being the least disturbed by other
load. Ratios are between numbers measured in this run.

Run: ``python benchmarks/bench_dppgp_vs_gpytorch.py [--device auto] [--configs 128x64,1024x256]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gpytorch
import torch

from geodbk.fit.regressor import build_model
from geodbk.fit.step import TrainingStep, train_epoch
from geodbk.fit.train import make_optimizer
from geodbk.models import ModelConfig, get_model_spec
from geodbk.models.config import TrainConfig

BATCH = 1024
PR_TRAIN_ROWS = 113_078  # the size of the shipped sample's train split


class GPyTorchSVGP(gpytorch.models.ApproximateGP):
    """Whitened SVGP with learned inducing points and an ARD RBF kernel."""

    def __init__(self, inducing: torch.Tensor) -> None:
        distribution = gpytorch.variational.CholeskyVariationalDistribution(inducing.shape[0])
        strategy = gpytorch.variational.VariationalStrategy(
            self, inducing, distribution, learn_inducing_locations=True
        )
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=inducing.shape[1])
        )

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def load_data(source: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(X (n, 2), standardised y (n,), description) on ``device``."""
    if source == "pr":
        from geodbk.dataset.spatial_dataset import load_sample_dataset

        X_np, y_np, _ = load_sample_dataset("PR").arrays("train")
        X = torch.tensor(X_np, dtype=torch.float32)
        y = torch.tensor(y_np, dtype=torch.float32)
        label = "Puerto Rico train split"
    else:
        gen = torch.Generator().manual_seed(0)
        X = torch.rand(PR_TRAIN_ROWS, 2, generator=gen) * 2 - 1
        y = torch.sin(4 * X[:, 0]) * torch.cos(3 * X[:, 1]) + 0.3 * torch.randn(PR_TRAIN_ROWS, generator=gen)
        label = "synthetic, PR train-split size"
    y = (y - y.mean()) / y.std()
    return X.to(device), y.to(device), label


def geodbk_trainer(X: torch.Tensor, y: torch.Tensor, cfg: ModelConfig, capture: bool):
    """(model, run-one-epoch) for dbk-rbf through geodbk's own training step."""
    spec = get_model_spec("dbk-rbf")
    tc = TrainConfig(batch_size=BATCH, lr=1e-3)
    torch.manual_seed(0)
    model = build_model("dbk-rbf", X.shape[1], cfg).to(X.device)
    step = TrainingStep(model, spec.objective(tc), make_optimizer(model, tc), X, y, capture=capture)
    generator = torch.Generator().manual_seed(0)
    epochs = iter(range(1, 1 << 30))

    def epoch() -> None:
        train_epoch(step, tc, False, generator, kind="dbk-rbf", epoch=next(epochs))

    return model, epoch


def gpytorch_trainer(X: torch.Tensor, y: torch.Tensor, rank: int):
    """(model, likelihood, run-one-epoch) for GPyTorch's SVGP."""
    torch.manual_seed(0)
    model = GPyTorchSVGP(torch.rand(rank, X.shape[1]) * 2 - 1).to(X.device)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(X.device)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(y))
    params = list(model.parameters()) + list(likelihood.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)  # no backbone, so no decay
    generator = torch.Generator().manual_seed(0)

    def epoch() -> None:
        model.train()
        likelihood.train()
        for idx in torch.randperm(len(X), generator=generator).to(X.device).split(BATCH):
            optimizer.zero_grad(set_to_none=True)
            loss = -mll(model(X[idx]), y[idx])
            loss.backward()
            optimizer.step()

    return model, likelihood, epoch


def timed(fn: Callable[[], None], device: torch.device) -> float:
    """Seconds for ``fn()``, with the device synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


@torch.no_grad()
def geodbk_predict(model: torch.nn.Module, points: torch.Tensor, batch: int) -> None:
    model.eval()
    for chunk in points.split(batch):
        out = model(chunk)
        out.mean, out.predictive_var  # noqa: B018 - both are what a map needs


@torch.no_grad()
def gpytorch_predict(model, likelihood, points: torch.Tensor, batch: int) -> None:
    model.eval()
    likelihood.eval()
    with gpytorch.settings.fast_pred_var():
        for chunk in points.split(batch):
            pred = likelihood(model(chunk))
            pred.mean, pred.variance  # noqa: B018


def bench_config(X, y, rank: int, hidden: int, args, device: torch.device) -> tuple[dict, dict]:
    """ms/step {name: [runs]} and prediction points/s {name: best} for one (r, h)."""
    Xs, ys = X[: args.steps * BATCH], y[: args.steps * BATCH]
    cfg = ModelConfig(hidden=hidden, rank=rank)
    dbk, dbk_epoch = geodbk_trainer(Xs, ys, cfg, capture=False)
    runs: dict[str, Callable[[], None]] = {"geodbk dbk-rbf eager": dbk_epoch}
    if device.type == "cuda":
        runs["geodbk dbk-rbf captured"] = geodbk_trainer(Xs, ys, cfg, capture=True)[1]
    gp, lik, gp_epoch = gpytorch_trainer(Xs, ys, rank)
    runs["GPyTorch SVGP"] = gp_epoch
    for run in runs.values():  # warm-up (and graph capture)
        run()
    ms: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            ms[name].append(1e3 * timed(run, device) / args.steps)

    gen = torch.Generator().manual_seed(1)
    points = (torch.rand(args.points, 2, generator=gen) * 2 - 1).to(device)
    predictors = {
        "geodbk dbk-rbf": lambda: geodbk_predict(dbk, points, args.predict_batch),
        "GPyTorch SVGP": lambda: gpytorch_predict(gp, lik, points, args.predict_batch),
    }
    for run in predictors.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in predictors}
    for _ in range(args.repeats):
        for name, run in predictors.items():
            seconds[name].append(timed(run, device))
    return ms, {name: args.points / min(ts) for name, ts in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    parser.add_argument("--configs", default="128x64,1024x256", help="comma-separated RANKxHIDDEN pairs")
    parser.add_argument("--steps", type=int, default=50, help="batches of 1024 per timed epoch")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs / prediction passes per model")
    parser.add_argument("--points", type=int, default=None, help="prediction points (1e6 cpu, 2e7 cuda)")
    parser.add_argument("--predict-batch", type=int, default=None,
                        help="rows per prediction batch (65536 cpu, 2^20 cuda)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--data", choices=["pr", "synthetic"], default="pr")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    args.points = args.points or (20_000_000 if on_gpu else 1_000_000)
    args.predict_batch = args.predict_batch or (1 << 20 if on_gpu else 65536)
    configs = [tuple(int(v) for v in pair.split("x")) for pair in args.configs.split(",")]

    X, y, label = load_data(args.data, device)
    name = torch.cuda.get_device_name(device) if on_gpu else f"cpu, {torch.get_num_threads()} threads"
    print(f"data: {label}, n = {len(y):,}, d = 2; batch {BATCH}, {args.steps} steps per timed epoch; "
          f"device {name}; torch {torch.__version__}, gpytorch {gpytorch.__version__}")

    results = [(r, h, *bench_config(X, y, r, h, args, device)) for r, h in configs]

    print(f"\nms per training step (min / median of {args.repeats} epochs of {args.steps} steps)")
    for r, h, ms, _ in results:
        print(f"  r = {r}, h = {h}")
        for model_name, values in ms.items():
            print(f"    {model_name:26s} {min(values):9.3f} {statistics.median(values):9.3f}")
        best = {model_name: min(values) for model_name, values in ms.items()}
        for model_name in best:
            if model_name != "GPyTorch SVGP":
                print(f"    ratio GPyTorch SVGP / {model_name:26s} {best['GPyTorch SVGP'] / best[model_name]:6.2f}")

    print(f"\nprediction, {args.points:,} points (mean + variance), points/s (best of {args.repeats}), "
          f"batch {args.predict_batch:,}")
    for r, h, _, rates in results:
        print(f"  r = {r}, h = {h}")
        for model_name, rate in rates.items():
            print(f"    {model_name:26s} {rate:14,.0f}")
        print(f"    ratio geodbk dbk-rbf / GPyTorch SVGP  {rates['geodbk dbk-rbf'] / rates['GPyTorch SVGP']:6.2f}")


if __name__ == "__main__":
    main()
