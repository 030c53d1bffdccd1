"""Deep basis maps, the low-rank GP on them, training objectives and the model zoo.

Every zoo model is a :class:`ZooModel`; those with a Gaussian-process prior (a kernel and a
joint posterior) are :class:`KernelModel`, and those trained with a KL term are
:class:`VariationalModel` (see :mod:`geodbk.models.base`).
"""

from geodbk.models.backbone import IdentityBackbone, ResidualBlock, ResNetBackbone
from geodbk.models.base import GPOutput, KernelModel, Noise, PosteriorFactors, VariationalModel, ZooModel
from geodbk.models.basis_gp import BasisGP, BasisMap, PointNetwork
from geodbk.models.config import PRESETS, ModelConfig, RunPreset, TrainConfig, run_preset
from geodbk.models.expansions import RBFInducingExpansion, SiLUExpansion, jittered_cholesky
from geodbk.models.objectives import (
    DPPGP,
    PPGP,
    SVGPELBO,
    VBLLELBO,
    ExactMarginalLikelihood,
    MeanSquaredError,
    Objective,
    exact_posterior,
    gaussian_nll,
    woodbury_log_marginal,
)
from geodbk.models.zoo import ModelSpec, available_models, get_model_spec, register_model, unregister_model

__all__ = [
    "BasisGP", "BasisMap", "DPPGP", "ExactMarginalLikelihood", "GPOutput", "IdentityBackbone", "KernelModel",
    "MeanSquaredError", "ModelConfig", "ModelSpec", "Noise", "Objective", "PPGP", "PRESETS", "PointNetwork",
    "PosteriorFactors",
    "RBFInducingExpansion", "ResNetBackbone", "ResidualBlock", "RunPreset", "SVGPELBO", "SiLUExpansion", "TrainConfig",
    "VBLLELBO", "VariationalModel", "ZooModel", "available_models", "exact_posterior", "gaussian_nll", "get_model_spec",
    "jittered_cholesky", "register_model", "run_preset", "unregister_model", "woodbury_log_marginal",
]

# The knn baseline and the related models from the literature register their zoo names on import.
from geodbk.models import knn, related  # noqa: E402,F401
