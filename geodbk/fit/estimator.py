"""A scikit-learn estimator over the model zoo: :class:`DBKRegressor`.

``DBKRegressor(kind="dbk-rbf").fit(X, y)`` trains any zoo kind on plain arrays with
:func:`geodbk.fit.train.fit_arrays` and keeps the fitted :class:`~geodbk.fit.regressor.Regressor`
in ``regressor_``; ``predict(X, return_std=True)`` has the signature of scikit-learn's
``GaussianProcessRegressor.predict``. The estimator works in whatever units ``X`` and ``y``
come in: it standardises ``y`` (inside the regressor) but not ``X``, so put a
``StandardScaler`` in front of it for inputs that are not already of order one, as for any
neural network in scikit-learn. Maps from lon/lat and quarters are the job of
:func:`geodbk.fit.fitting.fit_dataset`, which builds the inputs for you.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from geodbk.fit.regressor import Regressor
from geodbk.fit.train import fit_arrays
from geodbk.models.config import run_preset
from geodbk.models.zoo import available_models
from geodbk.prediction import Prediction


class DBKRegressor(RegressorMixin, BaseEstimator):
    """A Deep Basis Kernel GP (or any zoo kind) as a scikit-learn regressor.

    ``fit(X, y)`` holds out ``validation_fraction`` of the rows (chosen with
    ``random_state``) for early stopping and to pick the epoch whose weights are kept (best
    validation NLL), or uses the ``X_val, y_val`` given to :meth:`fit`. The fitted model
    sees the rows it trained on only; refit on everything with ``validation_fraction`` small
    if the held-out rows matter.

    Parameters
    ----------
    kind : str, default="dbk-rbf"
        A model-zoo name (:func:`geodbk.models.available_models`): ``dbk-rbf``, ``sv-dkl``,
        ``knn``, ...
    preset : str, default="cpu"
        The named size and schedule (:func:`geodbk.models.run_preset`) that ``hidden``,
        ``rank``, ``epochs``, ``lr`` and ``batch_size`` default to: ``"cpu"`` (h = 64,
        r = 128, 20 epochs of batch 1024 at lr 1e-2, the batch doubled and the epochs cut for more rows:
        :meth:`~geodbk.models.config.RunPreset.schedule`) or ``"paper"``.
    hidden, rank : int or None, default=None
        Backbone width h and basis rank r; ``None`` takes the preset's.
    epochs, batch_size : int or None, default=None
        Maximum passes over the training rows and mini-batch size; ``None``: the preset's.
    lr : float or None, default=None
        AdamW learning rate; ``None``: the preset's.
    patience : int or None, default=50
        Stop after this many epochs without a better validation NLL; ``None`` never stops early.
    validation_fraction : float, default=0.1
        Share of the rows held out for validation when :meth:`fit` gets no ``X_val``
        (at least one row, and at least two rows are left to train on).
    noise_init : float or None, default=None
        Initial noise variance on the standardised target scale; ``None``: the kind's default.
    dtype : {"float32", "float64"}, default="float32"
        Precision of the network.
    random_state : int, RandomState instance or None, default=None
        Seeds the validation split, the initial weights and the batch order; an int makes
        :meth:`fit` reproducible.
    device : str, default="auto"
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
    verbose : bool, default=False
        Show a progress bar with the loss and validation NLL.

    Attributes
    ----------
    regressor_ : Regressor
        The fitted model (:class:`geodbk.fit.regressor.Regressor`), with the weights of the
        best validation epoch.
    n_features_in_ : int
        d, the number of input columns.
    history_ : list of dict
        One entry per epoch: ``epoch``, ``loss`` (training objective) and ``val_nll`` (mean
        validation NLL in the units of ``y``).
    best_epoch_ : int
        The epoch whose weights were kept.

    Notes
    -----
    Every scikit-learn ``check_estimator`` check passes for the network kinds
    (tests/test_estimator.py runs them on ``dbk-rbf``; ``check_array_api_input`` is skipped
    by scikit-learn unless ``SCIPY_ARRAY_API`` is set, and the estimator takes NumPy input).
    Two do not apply to ``kind="knn"``, the k-nearest-tiles map baseline, which reads
    columns 0-1 as planar coordinates and column 2 as time and ignores the rest:

    * ``check_regressors_train``: its target depends on all 10 features, so knn's R^2 is
      below the check's 0.5;
    * ``check_fit2d_1feature``: knn needs two coordinate columns; its error says so
      rather than using the check's wording.

    Examples
    --------
    >>> from sklearn.pipeline import make_pipeline                          # doctest: +SKIP
    >>> from sklearn.preprocessing import StandardScaler                    # doctest: +SKIP
    >>> model = make_pipeline(StandardScaler(), DBKRegressor(random_state=0)).fit(X, y)  # doctest: +SKIP
    >>> mean, sd = model.predict(X_new, return_std=True)                    # doctest: +SKIP
    """

    def __init__(
        self,
        kind: str = "dbk-rbf",
        *,
        preset: str = "cpu",
        hidden: int | None = None,
        rank: int | None = None,
        epochs: int | None = None,
        lr: float | None = None,
        batch_size: int | None = None,
        patience: int | None = 50,
        validation_fraction: float = 0.1,
        noise_init: float | None = None,
        dtype: str = "float32",
        random_state: int | np.random.RandomState | None = None,
        device: str = "auto",
        verbose: bool = False,
    ) -> None:
        self.kind = kind
        self.preset = preset
        self.hidden = hidden
        self.rank = rank
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.patience = patience
        self.validation_fraction = validation_fraction
        self.noise_init = noise_init
        self.dtype = dtype
        self.random_state = random_state
        self.device = device
        self.verbose = verbose

    def fit(
        self,
        X: Any,
        y: Any,
        *,
        tests: Any = None,
        X_val: Any = None,
        y_val: Any = None,
        tests_val: Any = None,
    ) -> DBKRegressor:
        """Train on ``X`` (n, d) and ``y`` (n,); returns self.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        tests : array-like of shape (n_samples,), optional
            How many measurements each row of ``y`` averages (>= 1), as for Ookla tiles. When
            given, the noise is learned as sigma0^2 + sigma1^2 / tests instead of one sigma^2
            (and ``tests_val`` is needed with ``X_val``).
        X_val, y_val, tests_val : optional
            Validation rows for early stopping; without them ``validation_fraction`` of
            ``X`` is held out.
        """
        if self.kind not in available_models():
            raise ValueError(f"unknown kind {self.kind!r}; known: {', '.join(available_models())}")
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction!r}")
        own_split = X_val is None
        if not own_split and y_val is None:
            raise ValueError("X_val needs y_val")
        if own_split and (y_val is not None or tests_val is not None):
            raise ValueError("y_val and tests_val need X_val")
        # two rows to train on and one to validate on when the split is ours
        X, y = validate_data(self, X, y, y_numeric=True, dtype=np.float64, ensure_min_samples=3 if own_split else 2)
        counts = None if tests is None else check_array(tests, ensure_2d=False, dtype=np.float64)
        rng = check_random_state(self.random_state)
        if own_split:
            n_val = max(1, int(round(self.validation_fraction * len(X))))
            if len(X) - n_val < 2:
                raise ValueError(
                    f"validation_fraction {self.validation_fraction} leaves fewer than 2 of {len(X)} rows to train on"
                )
            order = rng.permutation(len(X))
            held, kept = order[:n_val], order[n_val:]
            X, X_val, y, y_val = X[kept], X[held], y[kept], y[held]
            if counts is not None:
                counts, tests_val = counts[kept], counts[held]
        else:
            X_val = validate_data(self, X_val, reset=False, dtype=np.float64)
            y_val = check_array(y_val, ensure_2d=False, dtype=np.float64)
            if tests_val is not None:
                tests_val = check_array(tests_val, ensure_2d=False, dtype=np.float64)
        model_config, train_config = run_preset(self.preset).configs(
            len(X),
            hidden=self.hidden,
            rank=self.rank,
            epochs=self.epochs,
            lr=self.lr,
            batch_size=self.batch_size,
            noise_init=self.noise_init,
            dtype=self.dtype,
            test_noise=counts is not None,
            device=self.device,
            progress=self.verbose,
            seed=int(rng.randint(np.iinfo(np.int32).max)),
        )
        train_config = replace(train_config, patience=self.patience)
        self.regressor_: Regressor = fit_arrays(
            self.kind, X, y, X_val, y_val, tests=counts, tests_val=tests_val,
            model_config=model_config, train_config=train_config,
        )
        self.history_: list[dict[str, float]] = list(self.regressor_.history)
        self.best_epoch_: int = self.regressor_.best_epoch
        return self

    def predict_distribution(self, X: Any, *, tests: Any = None) -> Prediction:
        """The Gaussian predictive distribution at ``X`` (n, d) in the units of ``y``.

        Returns a :class:`~geodbk.prediction.Prediction` (``mean``, ``sd``, ``lower``,
        ``upper``, ``pi_width``, each (n,)). Its ``sd`` is that of a noisy observation of y;
        for a model fitted with ``tests``, of a tile mean of many measurements, and
        ``tests`` (n,) here adds ``measurement_sd`` for observations of that many.
        """
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        counts = None if tests is None else check_array(tests, ensure_2d=False, dtype=np.float64)
        return self.regressor_.predict(X, tests=counts)

    def predict(
        self, X: Any, return_std: bool = False, *, tests: Any = None
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean (n,) at ``X`` (n, d), and with ``return_std`` its sd (n,), units of ``y``.

        The sd is that of a new observation of y (function uncertainty plus noise); for a
        model fitted with ``tests``, of an observation averaging ``tests`` (n,) measurements,
        or, without ``tests``, of the mean of many (sigma0^2 is the only noise left).
        """
        prediction = self.predict_distribution(X, tests=tests).measurement()
        if return_std:
            return prediction.mean, prediction.sd
        return prediction.mean


__all__ = ["DBKRegressor"]
