"""Seconds per training epoch and prediction throughput: geodbk vs GPyTorch's SVGP.

Times, on the same data in one run:

* geodbk ``dbk-rbf`` (ResNet + whitened RBF expansion, dPPGP loss),
* geodbk ``sv-rbf`` (the same model class as GPyTorch's SVGP: whitened ARD-RBF inducing
  points on raw inputs, SVGP ELBO),
* GPyTorch ``ApproximateGP`` + ``VariationalStrategy(learn_inducing_locations=True)``
  (whitened) + ``CholeskyVariationalDistribution``, ARD RBF, ``VariationalELBO``,

all with the same rank r, batch size 1024 and AdamW(lr=1e-3), then prediction of the
predictive mean and variance at 1e6 points. Data: the train split of the shipped Puerto
Rico sample (``geodbk.dataset.load_sample_dataset``), standardised targets.

Epochs are timed interleaved across the three models and the minimum is reported, which is
the least disturbed by other load on a shared machine.

Run: ``python benchmarks/bench_dppgp_vs_gpytorch.py [--rank 128] [--hidden 64] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import gpytorch
import torch

from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.models import ModelConfig, get_model_spec
from geodbk.models.config import TrainConfig
from geodbk.fit.train import make_optimizer, train_epoch


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


def geodbk_trainer(kind: str, X: torch.Tensor, y: torch.Tensor, cfg: ModelConfig):
    """(model, run-one-epoch) for a geodbk zoo kind, using geodbk's own training step."""
    spec = get_model_spec(kind)
    tc = TrainConfig(batch_size=1024)
    torch.manual_seed(0)
    model = spec.build(X.shape[1], cfg)
    objective = spec.objective(tc)
    optimizer = make_optimizer(model, tc)  # AdamW(1e-3), weight decay on the backbone only
    generator = torch.Generator().manual_seed(0)

    def epoch(Xe: torch.Tensor, ye: torch.Tensor) -> None:
        train_epoch(model, objective, optimizer, Xe, ye, tc, spec.full_batch, generator)

    return model, epoch


def gpytorch_trainer(X: torch.Tensor, y: torch.Tensor, rank: int):
    """(model, likelihood, run-one-epoch) for GPyTorch's SVGP."""
    torch.manual_seed(0)
    model = GPyTorchSVGP(torch.rand(rank, X.shape[1]) * 2 - 1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(y))
    params = list(model.parameters()) + list(likelihood.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)  # no backbone, so no decay
    generator = torch.Generator().manual_seed(0)

    def epoch(Xe: torch.Tensor, ye: torch.Tensor) -> None:
        model.train()
        likelihood.train()
        for idx in torch.randperm(len(Xe), generator=generator).split(1024):
            optimizer.zero_grad(set_to_none=True)
            loss = -mll(model(Xe[idx]), ye[idx])
            loss.backward()
            optimizer.step()

    return model, likelihood, epoch


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


@torch.no_grad()
def geodbk_predict(model: torch.nn.Module, points: torch.Tensor, batch: int = 65536) -> None:
    model.eval()
    for chunk in points.split(batch):
        out = model(chunk)
        out.mean, out.predictive_var  # noqa: B018 - both are what a map needs


@torch.no_grad()
def gpytorch_predict(model, likelihood, points: torch.Tensor, batch: int = 65536) -> None:
    model.eval()
    likelihood.eval()
    with gpytorch.settings.fast_pred_var():
        for chunk in points.split(batch):
            pred = likelihood(model(chunk))
            pred.mean, pred.variance  # noqa: B018


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=128, help="inducing points / basis functions r")
    parser.add_argument("--hidden", type=int, default=64, help="geodbk backbone width h")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs / prediction passes per model")
    parser.add_argument("--points", type=int, default=1_000_000, help="prediction points")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dataset = load_sample_dataset("PR")
    X_np, y_np, _ = dataset.arrays("train")
    X = torch.tensor(X_np, dtype=torch.float32)
    y = torch.tensor((y_np - y_np.mean()) / y_np.std(), dtype=torch.float32)
    points = torch.rand(args.points, 2) * 2 - 1
    cfg = ModelConfig(hidden=args.hidden, rank=args.rank)
    print(f"data: Puerto Rico train split, n = {len(y):,}, d = 2; r = {args.rank}, h = {args.hidden}, "
          f"batch 1024, {torch.get_num_threads()} threads, device cpu")

    dbk, dbk_epoch = geodbk_trainer("dbk-rbf", X, y, cfg)
    sv, sv_epoch = geodbk_trainer("sv-rbf", X, y, cfg)
    gp, lik, gp_epoch = gpytorch_trainer(X, y, args.rank)
    epochs = {"geodbk dbk-rbf (dPPGP)": dbk_epoch, "geodbk sv-rbf (SVGP)": sv_epoch, "GPyTorch SVGP": gp_epoch}
    for run in epochs.values():  # warm-up
        run(X[:4096], y[:4096])
    # interleaved repeats; the minimum is the least disturbed by other load on the machine
    times: dict[str, list[float]] = {name: [] for name in epochs}
    for _ in range(args.repeats):
        for name, run in epochs.items():
            times[name].append(timed(run, X, y))
    print(f"\nseconds per epoch (min / median of {args.repeats})")
    for name, ts in times.items():
        print(f"  {name:26s} {min(ts):8.2f} {statistics.median(ts):8.2f}")
    best = {name: min(ts) for name, ts in times.items()}
    print(f"  ratio GPyTorch SVGP / geodbk dbk-rbf   {best['GPyTorch SVGP'] / best['geodbk dbk-rbf (dPPGP)']:6.2f}")
    print(f"  ratio GPyTorch SVGP / geodbk sv-rbf    {best['GPyTorch SVGP'] / best['geodbk sv-rbf (SVGP)']:6.2f}")

    predictors = {
        "geodbk dbk-rbf": lambda: geodbk_predict(dbk, points),
        "geodbk sv-rbf": lambda: geodbk_predict(sv, points),
        "GPyTorch SVGP": lambda: gpytorch_predict(gp, lik, points),
    }
    seconds: dict[str, list[float]] = {name: [] for name in predictors}
    for _ in range(args.repeats):
        for name, run in predictors.items():
            seconds[name].append(timed(run))
    print(f"\nprediction throughput, {args.points:,} points (mean + variance), points/s (best of {args.repeats})")
    rates = {name: args.points / min(ts) for name, ts in seconds.items()}
    for name, rate in rates.items():
        print(f"  {name:26s} {rate:12,.0f}")
    print(f"  ratio geodbk dbk-rbf / GPyTorch SVGP   {rates['geodbk dbk-rbf'] / rates['GPyTorch SVGP']:6.2f}")


if __name__ == "__main__":
    main()
