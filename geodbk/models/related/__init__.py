"""Related models from the literature, as extra rows of the same model zoo.

Importing this package registers ``svdbk``, ``svdbk-c``, ``dfgp``, ``dmgp``, ``dcsvgp``,
``dcppgp`` and ``valla`` (see :mod:`geodbk.models.related.zoo`).
"""

from geodbk.models.related import zoo as _zoo  # noqa: F401  (registers the kinds)
from geodbk.models.related.decoupled import DecoupledELBO, DecoupledSVGP
from geodbk.models.related.fourier_mercer import (
    EmbeddingExactMML,
    MercerExpansion,
    RandomFourierExpansion,
    StandardizedEmbedding,
    mercer_eigenpairs,
)
from geodbk.models.related.svdbk import SVDBKELBO, CorrectedBasisGP, LinearExpansion
from geodbk.models.related.valla import BlackBoxAlpha, LastLayerVaLLA, prepare_valla

__all__ = [
    "BlackBoxAlpha", "CorrectedBasisGP", "DecoupledELBO", "DecoupledSVGP", "EmbeddingExactMML",
    "LastLayerVaLLA", "LinearExpansion", "MercerExpansion", "RandomFourierExpansion",
    "SVDBKELBO", "StandardizedEmbedding", "mercer_eigenpairs", "prepare_valla",
]
