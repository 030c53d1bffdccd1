"""Coordinate jitter: the training batches' places get Gaussian noise of the configured sd, the
fit learns the regression on the blurred place (the analytic convolution), and the space-time
protocol sets the sd from metres."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch import nn

from geodbk.dataset.protocols import COORDINATE_JITTER_M, PAPER, SPACE_TIME
from geodbk.dataset.spatial_dataset import load_sample_dataset
from geodbk.fit.protocol import fit_configs
from geodbk.fit.step import TrainingStep
from geodbk.models.objectives import Objective


class _Squares(Objective):
    """Mean squared error of a plain module, remembering every batch it was given."""

    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def __call__(self, model, x, y, n, tests=None):
        self.seen.append(x.detach().clone())
        return (model(x).squeeze(-1) - y).pow(2).mean()


def _step(X: torch.Tensor, y: torch.Tensor, jitter: float, model: nn.Module | None = None, lr: float = 1e-2):
    torch.manual_seed(0)
    model = model if model is not None else nn.Linear(X.shape[1], 1)
    objective = _Squares()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return TrainingStep(model, objective, optimizer, X, y, coordinate_jitter=jitter), objective


def test_each_batch_sees_its_places_moved_by_noise_of_the_given_sd_and_its_time_as_it_is():
    gen = torch.Generator().manual_seed(1)
    X, y = torch.rand(20_000, 3, generator=gen, dtype=torch.float64), torch.zeros(20_000, dtype=torch.float64)
    step, objective = _step(X, y, 0.05, nn.Linear(3, 1, dtype=torch.float64))
    step.draw_place_noise(torch.Generator().manual_seed(3))
    step.step(None)
    step.step(torch.arange(0, 20_000, 2))
    step.draw_place_noise(torch.Generator().manual_seed(4))  # the next epoch
    step.step(torch.arange(0, 20_000, 2))
    whole, half, next_epoch = objective.seen
    moved = whole[:, :2] - X[:, :2]
    assert moved.std().item() == pytest.approx(0.05, rel=0.02)
    assert abs(moved.mean().item()) < 0.05 * 4 / math.sqrt(moved.numel())
    assert abs(np.corrcoef(moved[:, 0], moved[:, 1])[0, 1]) < 0.03  # independent per coordinate
    assert torch.equal(whole[:, 2], X[:, 2]) and torch.equal(next_epoch[:, 2], X[::2, 2])
    assert torch.equal(half, whole[::2])  # a row keeps its place for the epoch
    again = next_epoch[:, :2] - X[::2, :2]
    assert abs(np.corrcoef(again[:, 0], moved[::2, 0])[0, 1]) < 0.05  # fresh noise every epoch


def test_the_noise_depends_only_on_the_epochs_generator():
    """So the ranks of a data-parallel fit, each with the same generator, jitter alike."""
    X, y = torch.rand(500, 3), torch.zeros(500)
    seen = []
    for _ in range(2):
        step, objective = _step(X, y, 0.1)
        torch.manual_seed(len(seen))  # torch's global generator differs between the two
        step.draw_place_noise(torch.Generator().manual_seed(7))
        step.step(torch.arange(100, 200))
        seen.append(objective.seen[0])
    assert torch.equal(seen[0], seen[1]) and not torch.equal(seen[0], X[100:200])


def test_no_jitter_gives_the_batches_unchanged():
    X, y = torch.rand(100, 3), torch.zeros(100)
    step, objective = _step(X, y, 0.0)
    step.step(torch.arange(10))
    assert torch.equal(objective.seen[0], X[:10])


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_a_negative_or_non_finite_jitter_is_refused(bad):
    with pytest.raises(ValueError, match="coordinate_jitter"):
        _step(torch.rand(10, 3), torch.zeros(10), bad)


def _fit_step_function(sd: float) -> np.ndarray:
    """A small network fitted by least squares to y = sign(u), u ~ U(-1, 1), with places jittered
    by ``sd``; its values at :data:`_AT`."""
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(8192, 1, generator=gen) * 2 - 1
    X, y = torch.cat([u, torch.zeros_like(u)], dim=1), torch.sign(u[:, 0])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    step, _ = _step(X, y, sd, net, lr=EPOCHS_LR[1])
    order = torch.Generator().manual_seed(2)
    for _ in range(EPOCHS_LR[0]):
        step.draw_place_noise(order)
        step.run(torch.randperm(len(X), generator=order), 256)
    with torch.no_grad():
        return net(torch.stack([_AT, torch.zeros_like(_AT)], dim=1)).squeeze(-1).numpy()


_AT = torch.tensor([-0.2, -0.1, -0.05, 0.05, 0.1, 0.2])
EPOCHS_LR = (200, 1e-2)


def test_the_fit_is_the_regression_on_the_blurred_place():
    """Trained on places jittered by sd, the least-squares fit to y = sign(u), u ~ U(-1, 1), is
    E[sign(U) | U + e = u] = 2 Phi(u / sd) - 1 away from the ends; with no jitter it is the step."""
    blurred = 2 * norm.cdf(_AT.numpy() / 0.1) - 1
    jittered, sharp = _fit_step_function(0.1), _fit_step_function(0.0)
    assert np.abs(jittered - blurred).max() < 0.07, (jittered, blurred)  # SGD on noisy places wobbles a little
    assert np.abs(sharp - np.sign(_AT.numpy())).max() < 0.1 < np.abs(sharp - blurred).max()


def test_the_space_time_protocol_jitters_by_three_km_in_the_datas_units_and_the_paper_protocol_not_at_all():
    dataset = load_sample_dataset("PR", "download")
    inputs = SPACE_TIME.input_space(dataset)
    _, train = fit_configs(SPACE_TIME, inputs)
    assert COORDINATE_JITTER_M == 3000.0
    assert train.coordinate_jitter == pytest.approx(inputs.coords.metres_to_units(3000.0))
    assert inputs.coords.metres_to_units(3000.0) > 0
    assert fit_configs(SPACE_TIME, inputs, coordinate_jitter_m=500.0)[1].coordinate_jitter == pytest.approx(
        inputs.coords.metres_to_units(500.0))
    assert fit_configs(SPACE_TIME, inputs, coordinate_jitter=0.25)[1].coordinate_jitter == 0.25  # units win
    assert fit_configs(PAPER, PAPER.input_space(dataset))[1].coordinate_jitter == 0.0


@pytest.mark.parametrize("given, metres", [((), COORDINATE_JITTER_M), (("--coordinate-jitter", "1500"), 1500.0),
                                           (("--coordinate-jitter", "0"), 0.0)])
def test_geodbk_fit_trains_with_the_jitter_it_is_given(tmp_path, pr_dataset, monkeypatch, given, metres):
    """``geodbk fit --coordinate-jitter METRES`` reaches the training step in the data's units."""
    import dataclasses

    import geodbk.fit.train as train_module
    from geodbk.cli import main
    from geodbk.fit.geomodel import GeoModel

    used = []

    class Recording(TrainingStep):
        def __init__(self, *args, **kwargs):
            used.append(kwargs.get("coordinate_jitter", 0.0))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(train_module, "TrainingStep", Recording)
    dataset = tmp_path / "dataset.parquet"
    # every fifth row: 134 validation and 119 test rows, over the 100 each that geodbk fit needs
    dataclasses.replace(pr_dataset, frame=pr_dataset.frame.iloc[::5].copy()).save(dataset)
    argv = ["fit", "--dataset", str(dataset), "--out", str(tmp_path / "run"), "--models", "dbk-rbf", "--epochs", "1",
            "--no-progress", *given]
    assert main(argv) == 0
    model = GeoModel.load(tmp_path / "run" / "models" / "dbk-rbf.pt")
    # the deep part trains with it; the kriging part reads no places, so it has none
    assert used == [pytest.approx(model.inputs.coords.metres_to_units(metres)), 0.0]
