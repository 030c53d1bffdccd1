"""The k-nearest-tiles baseline: local mean and variance plus a global linear time trend.

The honest baseline a GP map has to beat. With inputs ``X`` (n, d) whose columns 0-1 are
the isotropic spatial coordinates and, when d >= 3, column 2 is time (further columns are
ignored), and standardised targets ``y``:

* a global trend ``a + b t`` is fitted by least squares (``a`` alone when d < 3);
* the prediction at ``x`` is the trend plus the mean of the residuals of the k training
  rows nearest to ``x`` in (Euclidean) coordinate space;
* the predictive variance is ``s^2 (1 + 1 / k)``: the unbiased sample variance ``s^2`` of
  those k residuals plus the variance ``s^2 / k`` of their mean, floored at a small positive
  value;
* k is the member of :data:`K_GRID` (clipped to n - 1) with the lowest Gaussian NLL on the
  validation set.

The neighbour search uses :class:`scipy.spatial.cKDTree`: a kd-tree is the standard index
for exact nearest neighbours in two dimensions (O(log n) per query), and torch has no kNN
index (brute-force ``torch.cdist`` would cost O(n) memory and time per query row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy.spatial import cKDTree

from geodbk.blocks import blocks
from geodbk.models.base import GPOutput, ZooModel
from geodbk.models.config import ModelConfig
from geodbk.models.objectives import gaussian_nll
from geodbk.models.zoo import ModelSpec, register_model

if TYPE_CHECKING:
    from geodbk.models.config import TrainConfig

#: Candidate neighbour counts, tried in this order; clipped to n - 1 training rows.
K_GRID: tuple[int, ...] = (5, 10, 20, 40, 80, 160)

#: Query rows per kd-tree call, which bounds the temporary (rows, k) index arrays.
QUERY_CHUNK = 65536

#: Buffers whose length is the number of training rows, unknown until fitted or loaded.
_SIZED_BUFFERS = ("spatial", "residual")


def _local_moments(residuals: torch.Tensor, floor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (m,) and predictive variance (m,) of the neighbour residuals (m, k), k >= 2.

    The variance is ``s^2 (1 + 1 / k)`` with ``s^2`` the unbiased sample variance, at least
    ``floor`` (a 0-d tensor).
    """
    k = residuals.shape[1]
    var = residuals.var(dim=1, correction=1) * (1.0 + 1.0 / k)
    return residuals.mean(dim=1), torch.maximum(var, floor)


class NearestTilesModel(ZooModel):
    """k-nearest-tiles predictor: ``forward(x)`` (n, d) -> :class:`GPOutput` (target units).

    All its state is in persistent buffers, so a ``state_dict`` round trip restores it:

    * ``spatial``: (n_train, 2) training coordinates (columns 0-1 of X);
    * ``residual``: (n_train,) training targets minus the trend;
    * ``trend``: (2,) intercept a and time slope b (b = 0 without a time column);
    * ``k``: 0-d int64 neighbour count (0 until fitted);
    * ``var_floor``: 0-d lower bound on the predictive variance.

    An unfitted model has size-0 ``spatial`` and ``residual``; :meth:`load_state_dict`
    resizes them to the incoming shapes. The kd-tree over ``spatial`` is built on first use
    and cached on the instance (not state).

    Attributes:
        input_dim: d; column 2 is time when d >= 3.
        validation_nll: mean validation NLL per candidate k from :func:`fit_nearest_tiles`
            (standardised units), for reporting; not saved in the state dict.
    """

    # persistent buffers (see above)
    spatial: torch.Tensor
    residual: torch.Tensor
    trend: torch.Tensor
    k: torch.Tensor
    var_floor: torch.Tensor

    def __init__(self, input_dim: int, var_floor: float = 1e-6) -> None:
        super().__init__()
        if input_dim < 2:
            raise ValueError(f"knn needs two spatial columns, got input_dim={input_dim}")
        if not var_floor > 0:
            raise ValueError(f"the variance floor must be positive, got {var_floor}")
        self.input_dim = input_dim
        self.register_buffer("spatial", torch.empty(0, 2))
        self.register_buffer("residual", torch.empty(0))
        self.register_buffer("trend", torch.zeros(2))
        self.register_buffer("k", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("var_floor", torch.tensor(var_floor))
        self.validation_nll: dict[int, float] = {}
        self._tree: cKDTree | None = None

    @property
    def has_time(self) -> bool:
        return self.input_dim >= 3

    @torch.no_grad()
    def set_training_data(self, spatial: torch.Tensor, residual: torch.Tensor) -> None:
        """Store (n, 2) training coordinates and their (n,) residuals; drops the cached tree."""
        self.spatial = spatial.detach().to(self.trend, copy=True)
        self.residual = residual.detach().to(self.trend, copy=True)
        self._tree = None

    def trend_at(self, x: torch.Tensor) -> torch.Tensor:
        """(n,) trend ``a + b t`` at inputs ``x`` (n, d), in x's dtype and device."""
        a, b = self.trend.to(x)
        if self.has_time:
            return a + b * x[:, 2]
        return a.expand(len(x))

    def neighbour_residuals(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """(n, k) residuals of the k training rows nearest to each row of ``x`` (n, d), nearest first.

        The query runs on CPU in float64, in chunks of :data:`QUERY_CHUNK` rows; the result
        is in the buffers' dtype and device.
        """
        if self._tree is None:
            self._tree = cKDTree(self.spatial.detach().cpu().double().numpy())
        points = x[:, :2].detach().cpu().double().numpy()
        chunks = [self._tree.query(points[block], k=k, workers=-1)[1] for block in blocks(len(points), QUERY_CHUNK)]
        index = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)
        rows = torch.from_numpy(index.astype(np.int64).reshape(-1, k))
        return self.residual[rows.to(self.residual.device)]

    def forward(self, x: torch.Tensor, tests: torch.Tensor | None = None) -> GPOutput:
        """Prediction at ``x`` (n, d); ``tests`` (per-row test counts) is ignored.

        Returns:
            GPOutput with mean (n,) = trend + local mean, var_f (n,) zeros, and noise =
            tile_noise (n,) = the floored local variance ``s^2 (1 + 1 / k)``.
        """
        k = int(self.k)
        if k < 2:
            raise RuntimeError("the knn model is not fitted (k < 2); use fit_nearest_tiles")
        local_mean, local_var = _local_moments(self.neighbour_residuals(x, k), self.var_floor)
        mean = self.trend_at(x) + local_mean.to(x)
        noise = local_var.to(x)
        return GPOutput(mean=mean, var_f=torch.zeros_like(mean), noise=noise, tile_noise=noise)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Resize the training-set buffers to the incoming shapes, then load as usual."""
        for name in _SIZED_BUFFERS:
            incoming = state_dict.get(prefix + name)
            if isinstance(incoming, torch.Tensor):
                own = self._buffers[name]
                assert own is not None  # registered in __init__
                self._buffers[name] = torch.empty(incoming.shape, dtype=own.dtype, device=own.device)
        self._tree = None
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


def _least_squares_trend(t: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """(2,) intercept and slope of ``y ~ a + b t`` (both (n,)); (mean y, 0) when ``t`` is None.

    Solved on CPU in float64; returned in y's dtype and device.
    """
    if t is None:
        return torch.stack([y.mean(), torch.zeros_like(y[0])])
    design = torch.stack([torch.ones_like(t), t], dim=1).cpu().double()
    solution = torch.linalg.lstsq(design, y.cpu().double().unsqueeze(1)).solution
    return solution.squeeze(1).to(y)


def fit_nearest_tiles(
    X: torch.Tensor,
    y: torch.Tensor,
    X_val: torch.Tensor,
    y_val: torch.Tensor,
    model_config: ModelConfig,
    train_config: TrainConfig,
) -> NearestTilesModel:
    """Fit the trend, store the residuals and pick k by validation NLL.

    Args:
        X: (n, d) training inputs; n >= 3.
        y: (n,) standardised training targets.
        X_val: (m, d) validation inputs.
        y_val: (m,) standardised validation targets.
        model_config: reads ``noise_floor`` (the variance floor).
        train_config: unused; part of the :attr:`ModelSpec.fit` signature.

    Returns:
        The fitted model, in X's dtype and device, with ``validation_nll`` set for every
        candidate k; ties go to the smaller k.
    """
    n, d = X.shape
    if n < 3:
        raise ValueError(f"knn needs at least 3 training rows, got {n}")
    model = NearestTilesModel(d, model_config.noise_floor).to(device=X.device, dtype=X.dtype)
    model.trend.copy_(_least_squares_trend(X[:, 2] if d >= 3 else None, y))
    model.set_training_data(X[:, :2], y - model.trend_at(X))

    candidates = sorted({min(k, n - 1) for k in K_GRID})
    residuals = model.neighbour_residuals(X_val, candidates[-1])
    trend_val = model.trend_at(X_val)
    for k in candidates:
        local_mean, local_var = _local_moments(residuals[:, :k], model.var_floor)
        model.validation_nll[k] = float(gaussian_nll(y_val, trend_val + local_mean, local_var).mean())
    model.k.fill_(min(model.validation_nll, key=model.validation_nll.__getitem__))
    return model


def build_nearest_tiles(input_dim: int, cfg: ModelConfig) -> NearestTilesModel:
    """An empty model for ``input_dim`` inputs, to be filled by ``load_state_dict``."""
    return NearestTilesModel(input_dim, cfg.noise_floor)


def _register() -> None:
    register_model("knn", ModelSpec(
        build=build_nearest_tiles,
        objective=None,
        fit=fit_nearest_tiles,
        description="local mean/variance of the k nearest training tiles plus a linear time trend (baseline)",
    ))


_register()
