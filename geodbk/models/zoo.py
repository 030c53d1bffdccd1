"""The model zoo: a registry from a model name to how to build and train it.

A :class:`ModelSpec` pairs a builder (input dimension + :class:`ModelConfig` ->
:class:`~geodbk.models.base.ZooModel`, whose ``forward(x, tests=None)`` returns a
:class:`~geodbk.models.base.GPOutput`) with
an objective factory (train settings -> :class:`~geodbk.models.objectives.Objective`), or,
for closed-form kinds such as ``knn``, with a ``fit`` function that replaces the gradient
loop. A model with a Gaussian-process prior is a :class:`~geodbk.models.base.KernelModel`.

Registering a new kind is one call, e.g. from another module::

    from geodbk.models import BasisGP, ModelSpec, register_model

    register_model("my-model", ModelSpec(
        build=lambda d, cfg: BasisGP(my_basis(d, cfg)),
        objective=lambda tc: MyObjective(tc.alpha),
        description="what it is, in one line",
    ))

after which ``fit_arrays("my-model", ...)`` and ``geodbk fit --models my-model`` work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from geodbk.models.backbone import ColumnSelection, IdentityBackbone, ResNetBackbone, SinusoidalEncoding
from geodbk.models.base import ZooModel
from geodbk.models.basis_gp import BasisGP, BasisMap, PointNetwork
from geodbk.models.config import ModelConfig
from geodbk.models.expansions import RBFInducingExpansion, SiLUExpansion
from geodbk.models.objectives import (
    DPPGP,
    PPGP,
    SVGPELBO,
    VBLLELBO,
    ExactMarginalLikelihood,
    MeanSquaredError,
    Objective,
)


@dataclass(frozen=True)
class ModelSpec:
    """How to build and train one kind of model.

    Attributes:
        build: ``(input_dim, model_config) -> ZooModel``.
        objective: ``(train_config) -> Objective``; reads e.g. ``alpha`` and ``beta``.
            ``None`` for kinds fitted in closed form by ``fit``.
        description: one line for listings.
        full_batch: the objective needs the whole training set per step (exact MML).
        prepare: optional ``(model, X, y, X_val, y_val, model_config, train_config, *, fit)
            -> None`` run once on the freshly built model, with the standardised training
            and validation tensors, before the optimiser is made (not when resuming); ``fit``
            is the trainer's ``fit_arrays``, so a kind that needs another kind fitted first
            (VaLLA fits and freezes its mean network here) does not import the trainer.
        fit: optional ``(X, y, X_val, y_val, model_config, train_config) -> ZooModel`` on
            the standardised tensors: a closed-form fit that replaces the gradient loop.
        conjugate_posterior: map fits replace the trained q(w) by the conjugate posterior given
            the learned basis (:mod:`geodbk.models.conjugate`): for objectives whose q(w) is
            not a posterior (dPPGP), so that area and change variances are.
    """

    build: Callable[[int, ModelConfig], ZooModel]
    objective: Callable[[Any], Objective] | None
    description: str = ""
    full_batch: bool = False
    prepare: Callable[..., None] | None = None
    fit: Callable[..., ZooModel] | None = None
    conjugate_posterior: bool = False

    def __post_init__(self) -> None:
        if (self.objective is None) == (self.fit is None):
            raise ValueError("a ModelSpec needs exactly one of objective (gradient training) and fit (closed form)")


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(name: str, spec: ModelSpec, *, overwrite: bool = False) -> None:
    """Add ``spec`` to the zoo under ``name``.

    Raises:
        ValueError: if ``name`` is taken and ``overwrite`` is false.
    """
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = spec


def unregister_model(name: str) -> ModelSpec:
    """Remove ``name`` from the zoo and return its spec (``KeyError`` if absent)."""
    spec = get_model_spec(name)
    del _REGISTRY[name]
    return spec


def get_model_spec(name: str) -> ModelSpec:
    """The spec registered under ``name``.

    Raises:
        KeyError: with the list of known names.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(available_models())}") from None


def available_models() -> list[str]:
    """Registered model names, in registration order."""
    return list(_REGISTRY)


# --- builders ---------------------------------------------------------------------------------
def _read_width(input_dim: int, cfg: ModelConfig) -> int:
    """How many input columns a backbone reads: ``cfg.input_columns``'s, or all ``input_dim``."""
    return input_dim if cfg.input_columns is None else len(cfg.input_columns)


_Backbone = TypeVar("_Backbone", ResNetBackbone, IdentityBackbone)


def _on_columns(backbone: _Backbone, input_dim: int, cfg: ModelConfig) -> _Backbone | ColumnSelection:
    """``backbone`` (built on :func:`_read_width` columns) given ``input_dim`` columns: behind a
    :class:`ColumnSelection` when ``cfg.input_columns`` are set, else as it is."""
    return backbone if cfg.input_columns is None else ColumnSelection(backbone, cfg.input_columns, input_dim)


def resnet(input_dim: int, cfg: ModelConfig) -> ResNetBackbone | ColumnSelection:
    """The ResNet backbone of every deep kind, behind the sinusoidal encoding when
    ``cfg.encoding_scales > 0`` (so comparisons between kinds stay fair), reading only
    ``cfg.input_columns`` when they are set."""
    width = _read_width(input_dim, cfg)
    encoding = None
    if cfg.encoding_scales > 0:
        encoding = SinusoidalEncoding(
            width, cfg.encoding_scales, cfg.encoding_min_wavelength, cfg.encoding_max_wavelength
        )
    return _on_columns(ResNetBackbone(width, cfg.hidden, cfg.n_blocks, encoding), input_dim, cfg)


def deep_rbf_basis(input_dim: int, cfg: ModelConfig) -> BasisMap:
    """ResNet + whitened RBF inducing expansion (DBK-RBF, SV-DKL, PP-DKL)."""
    return BasisMap(resnet(input_dim, cfg), RBFInducingExpansion(cfg.hidden, cfg.rank, cfg.jitter))


def deep_silu_basis(input_dim: int, cfg: ModelConfig) -> BasisMap:
    """ResNet + SiLU expansion (DBK-SiLU, VBLL)."""
    return BasisMap(resnet(input_dim, cfg), SiLUExpansion(cfg.hidden, cfg.rank))


def raw_rbf_basis(input_dim: int, cfg: ModelConfig) -> BasisMap:
    """Identity backbone + whitened RBF inducing expansion on raw x (SV-RBF), on ``cfg.input_columns``
    when they are set."""
    width = _read_width(input_dim, cfg)
    backbone = _on_columns(IdentityBackbone(width), input_dim, cfg)
    return BasisMap(backbone, RBFInducingExpansion(width, cfg.rank, cfg.jitter))


#: sigma^2 at initialisation (standardised y): the method spec's value for DBK kinds, and
#: GPyTorch's likelihood default for the SVGP/PPGP baselines it is compared with.
DBK_NOISE_INIT = 1e-2
GPYTORCH_NOISE_INIT = 0.693


def _gp(basis_builder: Callable[[int, ModelConfig], BasisMap], *, include_residual: bool = False):
    kind_noise = GPYTORCH_NOISE_INIT if include_residual else DBK_NOISE_INIT

    def build(input_dim: int, cfg: ModelConfig) -> BasisGP:
        return BasisGP(
            basis_builder(input_dim, cfg),
            include_residual=include_residual,
            noise_init=cfg.noise_init_or(kind_noise),
            noise_floor=cfg.noise_floor,
            test_noise=cfg.test_noise,
        )

    return build


def _network(input_dim: int, cfg: ModelConfig) -> PointNetwork:
    return PointNetwork(resnet(input_dim, cfg), cfg.noise_init_or(DBK_NOISE_INIT), cfg.noise_floor)


register_model("dbk-rbf", ModelSpec(
    _gp(deep_rbf_basis), lambda tc: DPPGP(tc.alpha, tc.beta),
    "DBK with a whitened RBF inducing expansion, trained with dPPGP", conjugate_posterior=True))
register_model("dbk-silu", ModelSpec(
    _gp(deep_silu_basis), lambda tc: DPPGP(tc.alpha, tc.beta),
    "DBK with a SiLU expansion, trained with dPPGP", conjugate_posterior=True))
register_model("exact-dbk", ModelSpec(
    _gp(deep_silu_basis), lambda tc: ExactMarginalLikelihood(),
    "DBK-SiLU trained by exact marginal likelihood (Woodbury), exact posterior", full_batch=True))
register_model("sv-rbf", ModelSpec(
    _gp(raw_rbf_basis, include_residual=True), lambda tc: SVGPELBO(),
    "SVGP with an ARD RBF kernel on the coordinates"))
register_model("sv-dkl", ModelSpec(
    _gp(deep_rbf_basis, include_residual=True), lambda tc: SVGPELBO(),
    "SVGP with an RBF kernel on ResNet features (deep kernel learning)"))
register_model("pp-dkl", ModelSpec(
    _gp(deep_rbf_basis, include_residual=True), lambda tc: PPGP(tc.beta),
    "PPGP with an RBF kernel on ResNet features"))
register_model("vbll", ModelSpec(
    _gp(deep_silu_basis), lambda tc: VBLLELBO(),
    "variational Bayesian last layer: the DBK-SiLU basis trained by its ELBO"))
register_model("dnn", ModelSpec(
    _network, lambda tc: MeanSquaredError(),
    "ResNet + linear head trained by MSE, homoscedastic noise"))
