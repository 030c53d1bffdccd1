"""The fitting protocols, the one registry of them: :class:`Protocol` says what a protocol's model
inputs are and which of a fit's steps it takes, and every decision that depends on the protocol
reads one of its attributes (:func:`get_protocol`).

This module imports no torch, so that the command line can offer :data:`PROTOCOLS` as choices
before anything is fitted; the torch side of a protocol (its model and training configs) is in
:mod:`geodbk.fit.protocol`.

The space-time protocol's settings were chosen on validation data: positional encoding, noise
initialisation, test-count noise, coordinate jitter, the local residual field and the
conjugate posterior.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from geodbk.dataset.inputs import InputSpace
from geodbk.errors import InputDataError

#: Positional-encoding wavelengths of the space-time protocol: the shortest, metres, and how
#: many. On PR validation data (30 epochs) 1000 m / 8 scales, 500 m / 8 and 300 m / 10 scored
#: within 0.005 NLL of each other (0.696, 0.698, 0.693); the cheapest was kept.
MIN_WAVELENGTH_M = 1000.0
ENCODING_SCALES = 8
#: Initial noise variance (standardised y, one test) of every kind in map fits, both
#: protocols. From the spec's 1e-2, dbk-rbf sometimes put the whole signal into predictive
#: variance for many epochs. At the CPU schedule, from 0.3 instead: HI space-time validation
#: NLL 0.649 vs 0.722; HI paper test NLL 0.967 vs 0.979 (validation 0.946); PR space-time
#: validation 0.498.
MAP_NOISE_INIT = 0.3
#: Coordinate jitter of the space-time protocol, metres (the sd of the noise added to each
#: training batch's places, :attr:`~geodbk.models.config.TrainConfig.coordinate_jitter`).
#: Without it the deep kernel learns tile-scale detail that does not carry to new places: on
#: the spatial-block split the validation NLL of the trained GP is lowest at epoch 5 of 40
#: (PR 0.80, HI 0.86) and climbs to 1.0-1.16 by epoch 40. Final validation NLL (after the
#: conjugate posterior and the residual field; PR and HI, spatial-block and random, seed 0)
#: for jitter 0 / 1.5 / 2 / 3 / 5 / 8 km, summed over the four: 2.749 / 2.692 / 2.705 /
#: 2.691 / 2.690 / 2.715. The middle of the flat 1.5-5 km stretch is kept; at 3 km, PR
#: spatial-block 0.769 -> 0.746, HI 0.855 -> 0.824, PR random 0.493 -> 0.495, HI 0.633 -> 0.627.
COORDINATE_JITTER_M = 3000.0


@dataclass(frozen=True)
class Protocol:
    """A fitting protocol.

    Attributes:
        name: ``"space-time"`` or ``"paper"`` (the keys of :data:`PROTOCOLS`).
        space_time: whether the inputs are the data-scaled projected coordinates plus time, which
            may take a density layer (:meth:`InputSpace.projected`); else the region box alone,
            time-free (:meth:`InputSpace.region_box`).
        model_defaults: ModelConfig fields this protocol sets before the preset and the caller's
            overrides (:func:`geodbk.fit.protocol.configs`).
        local_residuals: whether GP kinds get a local residual field
            (:class:`~geodbk.fit.residuals.ResidualField`).
        conjugate_posterior: whether kinds whose zoo spec asks for it get the conjugate
            posterior of their weights given the learned basis.
        coordinate_jitter_m: the training batches' coordinate jitter, metres (0 = none).
        measurement_tails: whether a new measurement's family (its skewed shape, sd scale
            and test-count shift, :mod:`geodbk.fit.tails`) is chosen on the validation rows; else Gaussian.
    """

    name: str
    space_time: bool
    model_defaults: tuple[tuple[str, Any], ...]
    local_residuals: bool
    conjugate_posterior: bool
    coordinate_jitter_m: float = 0.0
    measurement_tails: bool = False

    def input_space(self, dataset: Any, density_tiles: pd.DataFrame | None = None) -> InputSpace:
        """The inputs of a :class:`~geodbk.dataset.spatial_dataset.SpatialDataset` under this
        protocol, with another layer's test density when ``density_tiles`` are given (space-time
        protocols only)."""
        if self.space_time:
            return InputSpace.projected(dataset, self.name, density_tiles)
        if density_tiles is not None:
            raise InputDataError(
                f"the {self.name} protocol takes no density tiles (its inputs are the coordinates alone)"
            )
        return InputSpace.region_box(dataset, self.name)


SPACE_TIME = Protocol(
    "space-time",
    True,
    (("noise_init", MAP_NOISE_INIT), ("encoding_scales", ENCODING_SCALES), ("test_noise", True)),
    local_residuals=True,
    conjugate_posterior=True,
    coordinate_jitter_m=COORDINATE_JITTER_M,
    measurement_tails=True,
)
PAPER = Protocol("paper", False, (("noise_init", MAP_NOISE_INIT),), local_residuals=False, conjugate_posterior=False)
#: The protocols by name, the default (space-time) first.
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (SPACE_TIME, PAPER)}


def get_protocol(name: str | Protocol) -> Protocol:
    """The protocol called ``name`` (a :class:`Protocol` is returned as it is).

    Raises:
        InputDataError: for an unknown name.
    """
    if isinstance(name, Protocol):
        return name
    if name not in PROTOCOLS:
        raise InputDataError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {name!r}")
    return PROTOCOLS[name]
