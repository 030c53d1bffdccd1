"""A fitted model on plain arrays: :class:`Regressor` (its outputs are :class:`Prediction`).

The regressor owns the target standardisation: the network sees ``(y - y_mean) / y_std``
and everything it returns is converted back to the original target units
(log10 of Mbps or ms for geodbk datasets).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geodbk.blocks import blocks
from geodbk.errors import InputDataError
from geodbk.fileio import atomic_path
from geodbk.models.base import KernelModel, PosteriorFactors, WeightedFactors, ZooModel
from geodbk.models.basis_gp import BasisGP
from geodbk.models.config import ModelConfig, stored_model_config
from geodbk.models.conjugate import ConjugateFit, fit_conjugate_posterior
from geodbk.models.precision import Precision, check_precision
from geodbk.models.zoo import available_models, get_model_spec
from geodbk.prediction import Prediction


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; anything else -> ``torch.device(device)``."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def as_inputs(X: Any, input_dim: int | None = None, name: str = "X") -> np.ndarray:
    """Check and convert inputs to a finite, writable float64 (n, d) array (a copy)."""
    arr = np.array(X, dtype=np.float64)
    if arr.ndim == 1 and input_dim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise InputDataError(f"{name} must be a 2-D array (n, d), got shape {arr.shape}")
    if input_dim is not None and arr.shape[1] != input_dim:
        raise InputDataError(f"{name} has {arr.shape[1]} columns, the model expects {input_dim}")
    if not np.isfinite(arr).all():
        raise InputDataError(f"{name} contains NaN or infinite values")
    return arr


def as_test_counts(tests: Any, n: int, name: str = "tests") -> np.ndarray:
    """Check and convert the speed tests behind each of ``n`` rows to a float64 (n,) array (>= 1)."""
    arr = np.asarray(tests, dtype=np.float64).reshape(-1)
    if arr.shape[0] != n:
        raise InputDataError(f"{name} has {arr.shape[0]} values but its inputs have {n} rows")
    if not (np.isfinite(arr).all() and (arr >= 1).all()):
        raise InputDataError(f"{name} must be finite test counts >= 1")
    return arr


@dataclass
class Regressor:
    """A fitted model of kind ``kind`` on ``input_dim``-dimensional inputs.

    Attributes:
        kind: the zoo name the model was built from.
        model: the zoo model (returns :class:`~geodbk.models.GPOutput`); a
            :class:`~geodbk.models.KernelModel` also has a kernel and a joint posterior.
        model_config: the architecture settings.
        input_dim: d.
        y_mean, y_std: the target standardisation (original units).
        history: per-epoch training log (epoch, loss, val_nll in original units).
        best_epoch: the epoch whose weights were kept (best validation NLL).
        train_config: the training settings, as a dict.
    """

    kind: str
    model: ZooModel
    model_config: ModelConfig
    input_dim: int
    y_mean: float
    y_std: float
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    train_config: dict[str, Any] = field(default_factory=dict)

    @property
    def prediction_precision(self) -> Precision:
        """Precision of the backbone in :meth:`predict`: ``"float32"`` (default), ``"tf32"`` or
        ``"bf16"``; measured error bounds in :mod:`geodbk.models.precision`. Not saved.

        Raises:
            InputDataError: on setting an unknown precision, a reduced one for a kind without a
                deep-basis backbone (knn, dnn, exact-dbk, ...) or for a float64 model.
        """
        return self.model.backbone_precision if isinstance(self.model, BasisGP) else "float32"

    @prediction_precision.setter
    def prediction_precision(self, precision: str) -> None:
        try:
            checked = check_precision(precision)
        except ValueError as err:
            raise InputDataError(str(err)) from None
        if checked != "float32" and not isinstance(self.model, BasisGP):
            raise InputDataError(f"{self.kind} has no reduced-precision prediction; use float32")
        if checked != "float32" and self.dtype != torch.float32:
            raise InputDataError(f"{checked} prediction needs a float32 model; this {self.kind} is {self.dtype}")
        if isinstance(self.model, BasisGP):
            self.model.backbone_precision = checked

    @property
    def device(self) -> torch.device:
        """Where the model's tensors live (parameters, or buffers for closed-form kinds like knn)."""
        return next(itertools.chain(self.model.parameters(), self.model.buffers())).device

    @property
    def dtype(self) -> torch.dtype:
        return self.model_config.torch_dtype

    def _tensor(self, X: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(X, dtype=self.dtype, device=self.device)

    def _batched(
        self, n: int, batch_size: int, compute: Callable[[slice], torch.Tensor], width: int | None = None
    ) -> np.ndarray:
        """``compute(rows)`` for consecutive slices of ``batch_size`` of ``n`` rows, the model in
        eval mode, each (b,) or (b, width), joined in float64: (n,) or (n, width)."""
        self.model.eval()
        parts = [compute(rows).double().cpu().numpy() for rows in blocks(n, batch_size)]
        return np.concatenate(parts) if parts else np.empty((0,) if width is None else (0, width))

    @property
    def has_kernel(self) -> bool:
        """Whether the model is a :class:`~geodbk.models.KernelModel` (GP kinds): :meth:`kernel`,
        :meth:`difference_variance` and :meth:`weighted_sum_variance` need one."""
        return isinstance(self.model, KernelModel)

    def _kernel_model(self) -> KernelModel:
        if not isinstance(self.model, KernelModel):
            raise TypeError(f"the {self.kind} model is not a GP and has no kernel")
        return self.model

    @torch.no_grad()
    def predict(self, X: np.ndarray, tests: np.ndarray | None = None, batch_size: int = 65536) -> Prediction:
        """Predictive distributions at ``X`` (n, d), in batches of ``batch_size`` rows.

        ``tests`` (n,), the speed tests behind a new measurement at each point, adds
        ``measurement_sd`` to the result; the tile-mean ``sd`` never depends on it.
        """
        X = as_inputs(X, self.input_dim)
        counts = None if tests is None else as_test_counts(tests, len(X))

        def moments(rows: slice) -> torch.Tensor:
            out = self.model(self._tensor(X[rows]), None if counts is None else self._tensor(counts[rows]))
            return torch.stack([out.mean, out.tile_var, out.predictive_var], dim=-1)

        mean, tile_var, measurement_var = self._batched(len(X), batch_size, moments, width=3).T
        measurement_sd = None if counts is None else np.sqrt(measurement_var) * self.y_std
        return Prediction(mean * self.y_std + self.y_mean, np.sqrt(tile_var) * self.y_std, measurement_sd)

    @torch.no_grad()
    def kernel(
        self, X: np.ndarray, X_ref: np.ndarray | None = None, diag: bool = False, batch_size: int = 65536
    ) -> np.ndarray:
        """Prior kernel k(x, x_ref) in target units^2: (n, k) for X (n, d) and X_ref (k, d)
        (``None``: X itself); with ``diag``, the prior variance k(x, x), (n,) (X_ref must be ``None``).

        Raises:
            TypeError: for a model that is not a :class:`~geodbk.models.KernelModel`.
        """
        model = self._kernel_model()
        X = as_inputs(X, self.input_dim)
        if diag:
            model.diagonal_only(X_ref)
        ref = None if diag else self._tensor(X if X_ref is None else as_inputs(X_ref, self.input_dim, name="X_ref"))

        def block(rows: slice) -> torch.Tensor:
            x = self._tensor(X[rows])
            return model.kernel(x, diag=True) if ref is None else model.kernel(x, ref)

        return self._batched(len(X), batch_size, block, None if ref is None else len(ref)) * self.y_std**2

    def refit_posterior(
        self, X: np.ndarray, y: np.ndarray, tests: np.ndarray | None = None, tiles: np.ndarray | None = None
    ) -> ConjugateFit:
        """Replace q(w), the noise and the constant mean by the conjugate posterior given the learned
        basis (:func:`geodbk.models.conjugate.fit_conjugate_posterior`), so that the joint
        covariance of f is a posterior. ``X`` (n, d) training inputs, ``y`` (n,) targets in data
        units, ``tests`` (n,) their test counts, ``tiles`` (n,) labels of the rows' tiles (rows
        of one tile share an offset); the fit's variances are in standardised units.

        Raises:
            InputDataError: for a kind that is not a basis GP without a Nystrom residual.
        """
        if not isinstance(self.model, BasisGP) or self.model.include_residual:
            raise InputDataError(f"{self.kind} has no conjugate weight posterior (it is not a plain basis GP)")
        X = as_inputs(X, self.input_dim)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        counts = None if tests is None else self._tensor(as_test_counts(tests, len(X)))
        standardised = self._tensor((y - self.y_mean) / self.y_std)
        tile_index = None
        if tiles is not None:
            labels = np.unique(np.asarray(tiles).reshape(-1), return_inverse=True)[1]
            if len(labels) != len(X):
                raise InputDataError(f"tiles has {len(labels)} values but X has {len(X)} rows")
            tile_index = torch.as_tensor(labels, dtype=torch.int64)
        return fit_conjugate_posterior(self.model, self._tensor(X), standardised, counts, tile_index)

    @torch.no_grad()
    def tile_noise_variance(self, X: np.ndarray, batch_size: int = 65536) -> np.ndarray:
        """The noise left in a tile mean of many tests, (n,) in target units^2 for X (n, d):
        sigma0^2, plus the input-dependent part of a conjugate refit's noise where there is one."""
        X = as_inputs(X, self.input_dim)

        def tile_noise(rows: slice) -> torch.Tensor:
            fitted = self.model(self._tensor(X[rows]))
            return fitted.tile_noise_var.expand(len(fitted.mean))

        return self._batched(len(X), batch_size, tile_noise) * self.y_std**2

    # --- joint posterior of linear functionals of f ----------------------------------------
    def _factors(self, X: np.ndarray) -> PosteriorFactors:
        """:class:`~geodbk.models.PosteriorFactors` of ``X`` (n, d) in float64 (standardised units)."""
        if not isinstance(self.model, KernelModel):
            raise InputDataError(f"the {self.kind} model has no joint posterior (it is not a GP)")
        self.model.eval()
        return self.model.posterior_factors(self._tensor(X)).double()

    @torch.no_grad()
    def low_rank_factor(self, X: np.ndarray, batch_size: int = 65536) -> np.ndarray:
        """U (n, p) with Cov_q(f(X_i), f(X_j)) = U_i . U_j for i != j, in target units (for a basis
        GP, ``y_std L^T phi(x)``): the part of the joint posterior that places share.

        Raises:
            InputDataError: for a model whose posterior is not purely low-rank (knn, dnn, or an
                inducing-point kind with a Nystrom residual).
        """
        X = as_inputs(X, self.input_dim)
        probe = self._factors(X[:1])
        if probe.minus is not None or probe.rbf_inputs is not None:
            raise InputDataError(f"the {self.kind} model's joint posterior is not low-rank; use a basis GP (dbk-*)")
        width = probe.plus.shape[-1]
        return self._batched(len(X), batch_size, lambda rows: self._factors(X[rows]).plus, width) * self.y_std

    @torch.no_grad()
    def difference_variance(self, X_from: np.ndarray, X_to: np.ndarray, batch_size: int = 65536) -> np.ndarray:
        """Var_q[f(X_to_i) - f(X_from_i)] of the latent function, (n,) in target units^2.

        Exact under the fitted posterior (for a basis GP ``||L^T (phi(x_to) - phi(x_from))||^2``;
        inducing-point kinds add their residual covariance):
        :meth:`~geodbk.models.PosteriorFactors.difference_variance`. Rows are paired; X (n, d).
        """
        X_from, X_to = as_inputs(X_from, self.input_dim, "X_from"), as_inputs(X_to, self.input_dim, "X_to")
        if X_from.shape != X_to.shape:
            raise InputDataError(f"X_from {X_from.shape} and X_to {X_to.shape} must pair up row by row")

        def variance(rows: slice) -> torch.Tensor:
            return self._factors(X_to[rows]).difference_variance(self._factors(X_from[rows]))

        return self._batched(len(X_from), batch_size, variance) * self.y_std**2

    @torch.no_grad()
    def weighted_sum_variance(
        self, X: np.ndarray, weights: np.ndarray, groups: np.ndarray, n_groups: int, batch_size: int = 16384
    ) -> np.ndarray:
        """Var_q[sum_{i in g} w_i f(X_i)] of the latent function for each group g, (n_groups,)
        in target units^2.

        ``X`` (n, d); ``weights`` (n,); ``groups`` (n,) integers in [0, n_groups). Exact: the
        low-rank parts cost O(n r) (for a basis GP, ``||L^T sum_i w_i phi(x_i)||^2``); the
        Nystrom residual of inducing-point kinds adds pairwise sums within each group
        (:meth:`~geodbk.models.PosteriorFactors.grouped_variance`).
        """
        X = as_inputs(X, self.input_dim)
        weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        groups = np.asarray(groups, dtype=np.int64).reshape(-1)
        if not (len(weights) == len(groups) == len(X)):
            raise InputDataError(
                f"X, weights and groups need one row each, got {len(X)}, {len(weights)}, {len(groups)}"
            )
        if len(groups) and (groups.min() < 0 or groups.max() >= n_groups):
            raise InputDataError(f"groups must be integers in [0, {n_groups})")
        device = self.device

        def batches() -> Iterator[WeightedFactors]:
            for rows in blocks(len(X), batch_size):
                w = torch.as_tensor(weights[rows], dtype=torch.float64, device=device)
                yield self._factors(X[rows]), w, torch.as_tensor(groups[rows], device=device)

        var = PosteriorFactors.grouped_variance(batches(), n_groups, batch_size)
        return var.cpu().numpy() * self.y_std**2

    # --- persistence -----------------------------------------------------------------------
    def to_payload(self) -> dict[str, Any]:
        """Everything needed to rebuild the regressor, as a torch-saveable dict."""
        return {
            "format": "geodbk.fit.regressor/1",
            "kind": self.kind,
            "model_config": self.model_config.to_dict(),
            "input_dim": self.input_dim,
            "y_mean": self.y_mean,
            "y_std": self.y_std,
            "state_dict": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "history": self.history,
            "best_epoch": self.best_epoch,
            "train_config": self.train_config,
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any], device: str | torch.device = "cpu") -> Regressor:
        """Rebuild from :meth:`to_payload` output on ``device`` ("auto" allowed), checked first: a
        known kind, a configuration no larger than the weights held (:func:`stored_model_config`),
        weights that are finite and exactly those of the kind's model, and a usable target scaling.

        Raises:
            InputDataError: the payload fails a check (a damaged, tampered or relabelled file).
        """
        if payload.get("format") != "geodbk.fit.regressor/1":
            raise InputDataError("not a geodbk regressor file (missing format tag)")
        missing = [key for key in _PAYLOAD_KEYS if key not in payload]
        if missing:
            raise InputDataError(f"its regressor has no {', '.join(missing)}: it is damaged")
        kind, state = payload["kind"], payload["state_dict"]
        if kind not in available_models():
            raise InputDataError(f"it names an unknown model kind {kind!r}; known: {', '.join(available_models())}")
        config = stored_model_config(payload["model_config"], payload["input_dim"], state)
        y_mean, y_std = _target_scaling(payload["y_mean"], payload["y_std"])
        model = build_model(kind, payload["input_dim"], config)
        _load_weights(kind, model, state)
        model.to(resolve_device(device)).eval()
        return cls(
            kind=kind,
            model=model,
            model_config=config,
            input_dim=payload["input_dim"],
            y_mean=y_mean,
            y_std=y_std,
            history=payload["history"],
            best_epoch=payload["best_epoch"],
            train_config=payload["train_config"],
        )

    def save(self, path: str | Path) -> None:
        """Write weights, configs, kind and y scaling to ``path`` (a torch .pt file)."""
        write_payload(self.to_payload(), path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> Regressor:
        """Read a file written by :meth:`save`; tensors are mapped to ``device``. A file that is not a
        geodbk regressor or fails a check of :meth:`from_payload` raises InputDataError naming ``path``."""
        payload = read_payload(path, device)
        try:
            return cls.from_payload(payload, device)
        except InputDataError as err:
            raise InputDataError(f"model file {path}: {err}") from None


def write_payload(payload: dict[str, Any], path: str | Path, *, overwrite: bool = False) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename: never half-written; a folder
    at ``path`` is replaced only with ``overwrite`` (:func:`geodbk.fileio.atomic_path`)."""
    with atomic_path(path, overwrite=overwrite) as tmp:
        torch.save(payload, tmp)


def read_payload(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a geodbk model file (weights only, no pickled code) with tensors on ``device``.

    Raises:
        InputDataError: if the file is missing or is not a readable torch file.
    """
    path = Path(path)
    if not path.exists():
        raise InputDataError(f"no model file at {path}")
    if not path.is_file():  # opening a FIFO would block until a writer comes
        raise InputDataError(f"{path} is not a regular file (a folder, FIFO or device); give a model file")
    try:
        with warnings.catch_warnings():  # torch warns about foreign pickle protocols before failing
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location=resolve_device(device), weights_only=True)
    except Exception as err:  # torch raises several types, with multi-paragraph messages, for foreign files
        raise InputDataError(
            f"{path} is not a geodbk model file (torch could not read it as weights: {type(err).__name__})"
        ) from err
    if not isinstance(payload, dict):
        raise InputDataError(f"{path} is not a geodbk model file")
    return payload


#: The entries of a regressor payload besides its format tag (:meth:`Regressor.to_payload`).
_PAYLOAD_KEYS = ("kind", "model_config", "input_dim", "y_mean", "y_std", "state_dict", "history", "best_epoch",
                 "train_config")


def _target_scaling(y_mean: Any, y_std: Any) -> tuple[float, float]:
    """A model file's target standardisation as floats: finite numbers, ``y_std`` positive.

    Raises:
        InputDataError: otherwise (a tampered file: ``y_std = -1`` flipped and scaled every map).
    """
    numbers = all(isinstance(v, Real) and not isinstance(v, bool) for v in (y_mean, y_std))
    if not (numbers and math.isfinite(y_mean) and math.isfinite(y_std) and y_std > 0):
        raise InputDataError(f"its target scaling y_mean {y_mean!r}, y_std {y_std!r} is not a finite mean and a "
                             "positive, finite sd: the file is damaged or tampered")
    return float(y_mean), float(y_std)


def _load_weights(kind: str, model: ZooModel, state: Any) -> None:
    """Load stored weights ``state`` into ``model``, a fresh ``kind`` model, refusing weights that
    are not exactly its tensors (other names, or shapes its loader does not take: a file whose kind
    was changed fails here) or that hold NaN or infinite values (an all-NaN model mapped all-NaN).

    Raises:
        InputDataError: naming the first offending weight.
    """
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise InputDataError("its weights are not a table of tensors: it is damaged")
    expected = model.state_dict()
    missing = [name for name in expected if name not in state]
    extra = [name for name in state if name not in expected]
    if missing or extra:
        found = "; ".join(f"{len(names)} {what}, e.g. {names[0]!r}" for names, what in (
            (missing, "missing"), (extra, "unexpected")) if names)
        raise InputDataError(f"its weights are not those of a {kind} model ({found}): it is damaged or its kind "
                             "was changed")
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InputDataError(f"its {kind} weight {name!r} holds NaN or infinite values: it is damaged; fit the "
                                 "model again")
    try:
        model.load_state_dict(state)
    except RuntimeError:  # torch lists every size mismatch over many lines
        raise InputDataError(f"its weights are not those of a {kind} model (some have other shapes): it is damaged "
                             "or its kind was changed") from None


def build_model(kind: str, input_dim: int, config: ModelConfig) -> ZooModel:
    """Instantiate the zoo model ``kind`` for ``input_dim`` inputs in the config's dtype."""
    return get_model_spec(kind).build(input_dim, config).to(config.torch_dtype)
