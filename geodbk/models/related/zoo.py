"""Zoo entries for the related models: builders and their registration.

==========  =====================================================================
svdbk       ResNet + linear basis, SVDBK ELBO + trace term, corrected variance
svdbk-c     the same without the variance correction (paper's "-c" ablation)
dfgp        Deep Fourier GP: RFF on a standardised embedding, exact MML
dmgp        Deep Mercer GP: Hermite features on a standardised embedding, exact MML
dcsvgp      decoupled-conditional SVGP on raw inputs (l_mean, l_covar, Omega)
dcppgp      the same decoupling with the predictive (PPGP) likelihood
valla       last-layer variational linearized Laplace around the ``dnn`` mean
==========  =====================================================================

Kind-specific ``ModelConfig.options`` (defaults are the papers' settings):

* svdbk: none (rank = ``cfg.rank``; the earlier DBK paper used r = 128).
* dfgp: ``embed_dim`` (4), ``n_features`` (r = 40, even), ``feature_seed`` (0).
* dmgp: ``embed_dim`` (1), ``per_dim`` (m = 15; rank m^embed_dim).
* dcsvgp / dcppgp: ``num_inducing`` (``cfg.rank``), ``ard`` (False), ``beta2`` (1e-3),
  ``lengthscale_init`` (sqrt(d)).

Kind defaults of ``ModelConfig.noise_init`` (used when it is ``None``): dfgp / dmgp 1.0
(GPflow's likelihood default, which that paper used; from 1e-2 the exact posterior starts
over-confident and the network overfits before sigma^2 recovers: test NLL 2.95 vs 0.55 on
1,500 elevators rows); dcsvgp / dcppgp 0.693 (GPyTorch's default, which the paper's code
starts from; from 1e-2 this ELBO crawls for hundreds of steps); the rest 1e-2.
* valla: ``num_inducing`` (100), ``dnn_epochs`` (the train config's epochs).
"""

from __future__ import annotations

from geodbk.models.basis_gp import BasisGP, BasisMap, PointNetwork
from geodbk.models.config import ModelConfig
from geodbk.models.related.decoupled import DecoupledELBO, DecoupledSVGP
from geodbk.models.related.fourier_mercer import (
    EmbeddingExactMML,
    MercerExpansion,
    RandomFourierExpansion,
    StandardizedEmbedding,
)
from geodbk.models.related.svdbk import SVDBKELBO, CorrectedBasisGP, LinearExpansion
from geodbk.models.related.valla import BlackBoxAlpha, LastLayerVaLLA, prepare_valla
from geodbk.models.zoo import DBK_NOISE_INIT, GPYTORCH_NOISE_INIT, ModelSpec, register_model, resnet


def build_svdbk(input_dim: int, cfg: ModelConfig, *, correct: bool = True) -> CorrectedBasisGP:
    """ResNet + linear r-dim basis with q(w) = N(m, LL^T) and the DBK variance correction."""
    basis = BasisMap(resnet(input_dim, cfg), LinearExpansion(cfg.hidden, cfg.rank))
    return CorrectedBasisGP(
        basis, correct=correct, noise_init=cfg.noise_init_or(DBK_NOISE_INIT), noise_floor=cfg.noise_floor,
        test_noise=cfg.test_noise,
    )


def build_dfgp(input_dim: int, cfg: ModelConfig) -> BasisGP:
    """Deep Fourier GP: random Fourier features on z = standardise(W g(x))."""
    embed = int(cfg.options.get("embed_dim", 4))
    expansion = RandomFourierExpansion(
        embed, int(cfg.options.get("n_features", 40)), seed=int(cfg.options.get("feature_seed", 0))
    )
    basis = BasisMap(StandardizedEmbedding(resnet(input_dim, cfg), embed), expansion)
    return BasisGP(basis, noise_init=cfg.noise_init_or(1.0), noise_floor=cfg.noise_floor, test_noise=cfg.test_noise)


def build_dmgp(input_dim: int, cfg: ModelConfig) -> BasisGP:
    """Deep Mercer GP: Hermite features of the Gaussian kernel on standardised z."""
    embed = int(cfg.options.get("embed_dim", 1))
    expansion = MercerExpansion(embed, int(cfg.options.get("per_dim", 15)))
    basis = BasisMap(StandardizedEmbedding(resnet(input_dim, cfg), embed), expansion)
    return BasisGP(basis, noise_init=cfg.noise_init_or(1.0), noise_floor=cfg.noise_floor, test_noise=cfg.test_noise)


def build_dcsvgp(input_dim: int, cfg: ModelConfig) -> DecoupledSVGP:
    """Decoupled-conditional inducing-point GP on raw inputs."""
    model = DecoupledSVGP(
        input_dim,
        int(cfg.options.get("num_inducing", cfg.rank)),
        ard=bool(cfg.options.get("ard", False)),
        lengthscale_init=cfg.options.get("lengthscale_init"),
        jitter=cfg.jitter,
        noise_init=cfg.noise_init_or(GPYTORCH_NOISE_INIT),
        noise_floor=cfg.noise_floor,
    )
    model.omega_weight = float(cfg.options.get("beta2", 1e-3))
    return model


def build_valla(input_dim: int, cfg: ModelConfig) -> LastLayerVaLLA:
    """Last-layer VaLLA around a ResNet + linear-head network (fitted in ``prepare``)."""
    network = PointNetwork(resnet(input_dim, cfg), cfg.noise_init_or(DBK_NOISE_INIT), cfg.noise_floor)
    return LastLayerVaLLA(
        network, int(cfg.options.get("num_inducing", 100)), cfg.noise_init_or(DBK_NOISE_INIT), cfg.noise_floor
    )


register_model("svdbk", ModelSpec(
    build_svdbk, lambda tc: SVDBKELBO(),
    "SVDBK (earlier DBK paper): SVI ELBO + trace regulariser, corrected predictive variance"))
register_model("svdbk-c", ModelSpec(
    lambda d, cfg: build_svdbk(d, cfg, correct=False), lambda tc: SVDBKELBO(trace=False),
    "SVDBK without the variance correction (ablation)"))
register_model("dfgp", ModelSpec(
    build_dfgp, lambda tc: EmbeddingExactMML(),
    "Deep Fourier GP: random Fourier features on a learned embedding, exact MML", full_batch=True))
register_model("dmgp", ModelSpec(
    build_dmgp, lambda tc: EmbeddingExactMML(),
    "Deep Mercer GP: Hermite/Mercer features on a learned embedding, exact MML", full_batch=True))
register_model("dcsvgp", ModelSpec(
    build_dcsvgp, lambda tc: DecoupledELBO(),
    "SVGP with decoupled mean/covariance lengthscales and the Omega regulariser"))
register_model("dcppgp", ModelSpec(
    build_dcsvgp, lambda tc: DecoupledELBO(predictive=True),
    "PPGP with decoupled mean/covariance lengthscales and the Omega regulariser"))
register_model("valla", ModelSpec(
    build_valla, lambda tc: BlackBoxAlpha(alpha=1.0),
    "last-layer variational linearized Laplace around the MSE-trained network",
    prepare=prepare_valla))
