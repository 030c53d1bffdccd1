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

Run: ``python benchmarks/bench_dppgp_vs_gpytorch.py [--rank 128] [--hidden 64] [--threads 2]``
"""

from __future__ import annotations

import argparse
import time

import gpytorch
import torch

from geodbk.dataset import load_sample_dataset
from geodbk.models import ModelConfig, get_model_spec
from geodbk.train import TrainConfig, make_optimizer, train_epoch


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


def time_geodbk_epoch(kind: str, X: torch.Tensor, y: torch.Tensor, cfg: ModelConfig, epochs: int):
    spec = get_model_spec(kind)
    tc = TrainConfig(batch_size=1024)
    torch.manual_seed(0)
    model = spec.build(X.shape[1], cfg)
    objective = spec.objective(tc)
    optimizer = make_optimizer(model, tc)  # AdamW(1e-3), weight decay on the backbone only
    generator = torch.Generator().manual_seed(0)
    train_epoch(model, objective, optimizer, X[:4096], y[:4096], tc, False, generator)  # warm-up
    start = time.perf_counter()
    for _ in range(epochs):
        train_epoch(model, objective, optimizer, X, y, tc, spec.full_batch, generator)
    return (time.perf_counter() - start) / epochs, model


def time_gpytorch_epoch(X: torch.Tensor, y: torch.Tensor, rank: int, epochs: int):
    torch.manual_seed(0)
    model = GPyTorchSVGP(torch.rand(rank, X.shape[1]) * 2 - 1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(y))
    params = list(model.parameters()) + list(likelihood.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)  # no backbone, so no decay
    generator = torch.Generator().manual_seed(0)
    model.train()
    likelihood.train()

    def epoch(Xe: torch.Tensor, ye: torch.Tensor) -> None:
        for idx in torch.randperm(len(Xe), generator=generator).split(1024):
            optimizer.zero_grad(set_to_none=True)
            loss = -mll(model(Xe[idx]), ye[idx])
            loss.backward()
            optimizer.step()

    epoch(X[:4096], y[:4096])  # warm-up
    start = time.perf_counter()
    for _ in range(epochs):
        epoch(X, y)
    return (time.perf_counter() - start) / epochs, model, likelihood


@torch.no_grad()
def geodbk_throughput(model: torch.nn.Module, points: torch.Tensor, batch: int = 65536) -> float:
    model.eval()
    start = time.perf_counter()
    for chunk in points.split(batch):
        out = model(chunk)
        out.mean, out.predictive_var  # noqa: B018 - both are what a map needs
    return len(points) / (time.perf_counter() - start)


@torch.no_grad()
def gpytorch_throughput(model, likelihood, points: torch.Tensor, batch: int = 65536) -> float:
    model.eval()
    likelihood.eval()
    start = time.perf_counter()
    with gpytorch.settings.fast_pred_var():
        for chunk in points.split(batch):
            pred = likelihood(model(chunk))
            pred.mean, pred.variance  # noqa: B018
    return len(points) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=128, help="inducing points / basis functions r")
    parser.add_argument("--hidden", type=int, default=64, help="geodbk backbone width h")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per model")
    parser.add_argument("--points", type=int, default=1_000_000, help="prediction points")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    dataset = load_sample_dataset("PR")
    X_np, y_np, _ = dataset.arrays("train")
    X = torch.as_tensor(X_np, dtype=torch.float32)
    y = torch.as_tensor((y_np - y_np.mean()) / y_np.std(), dtype=torch.float32)
    points = torch.rand(args.points, 2) * 2 - 1
    cfg = ModelConfig(hidden=args.hidden, rank=args.rank)
    print(f"data: Puerto Rico train split, n = {len(y):,}, d = 2; r = {args.rank}, h = {args.hidden}, "
          f"batch 1024, {torch.get_num_threads()} threads, device cpu")

    t_dbk, dbk = time_geodbk_epoch("dbk-rbf", X, y, cfg, args.epochs)
    t_sv, sv = time_geodbk_epoch("sv-rbf", X, y, cfg, args.epochs)
    t_gp, gp, lik = time_gpytorch_epoch(X, y, args.rank, args.epochs)
    print("\nseconds per epoch")
    print(f"  geodbk dbk-rbf (dPPGP)      {t_dbk:8.2f}")
    print(f"  geodbk sv-rbf  (SVGP)       {t_sv:8.2f}")
    print(f"  GPyTorch SVGP               {t_gp:8.2f}")
    print(f"  ratio GPyTorch SVGP / geodbk dbk-rbf  {t_gp / t_dbk:6.2f}")
    print(f"  ratio GPyTorch SVGP / geodbk sv-rbf   {t_gp / t_sv:6.2f}")

    print(f"\nprediction throughput, {args.points:,} points (mean + variance), points/s")
    rates = {
        "geodbk dbk-rbf": geodbk_throughput(dbk, points),
        "geodbk sv-rbf": geodbk_throughput(sv, points),
        "GPyTorch SVGP": gpytorch_throughput(gp, lik, points),
    }
    for name, rate in rates.items():
        print(f"  {name:26s}  {rate:12,.0f}")
    print(f"  ratio geodbk dbk-rbf / GPyTorch SVGP  {rates['geodbk dbk-rbf'] / rates['GPyTorch SVGP']:6.2f}")


if __name__ == "__main__":
    main()
