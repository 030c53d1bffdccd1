"""The fitting protocols as values: :class:`Protocol` carries a protocol's input space, its
model-config defaults and its residual policy, so that :func:`geodbk.fit.fitting.fit_dataset`
is the one place that assembles a fit's settings.

The space-time protocol's settings were chosen on validation data: positional encoding, noise
initialisation, test-count noise, coordinate jitter, the local residual field and the
conjugate posterior.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from geodbk.dataset.coords import ProjectedTransform
from geodbk.dataset.inputs import InputSpace
from geodbk.errors import InputDataError
from geodbk.models.config import ModelConfig, TrainConfig, run_preset

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


def with_encoding_wavelength(
    config: ModelConfig, inputs: InputSpace, min_wavelength_m: float = MIN_WAVELENGTH_M
) -> ModelConfig:
    """``config`` with the positional encoding's shortest wavelength set to ``min_wavelength_m``
    metres in ``inputs``' unit coordinates (projected inputs with an encoding only)."""
    if not isinstance(inputs.coords, ProjectedTransform) or config.encoding_scales == 0:
        return config
    shortest = min(inputs.coords.metres_to_units(min_wavelength_m), config.encoding_max_wavelength)
    return replace(config, encoding_min_wavelength=shortest)


def with_coordinate_jitter(config: TrainConfig, inputs: InputSpace, jitter_m: float) -> TrainConfig:
    """``config`` with its coordinate jitter set to ``jitter_m`` metres in ``inputs``' unit
    coordinates (projected inputs only; others are returned unchanged)."""
    if not isinstance(inputs.coords, ProjectedTransform):
        return config
    return replace(config, coordinate_jitter=inputs.coords.metres_to_units(jitter_m))


@dataclass(frozen=True)
class Protocol:
    """A fitting protocol.

    Attributes:
        name: ``"space-time"`` or ``"paper"`` (:data:`geodbk.dataset.inputs.PROTOCOLS`).
        model_defaults: ModelConfig fields this protocol sets before the preset and the caller's
            overrides (:meth:`configs`).
        local_residuals: whether GP kinds get a local residual field
            (:class:`~geodbk.fit.residuals.ResidualField`).
        conjugate_posterior: whether kinds whose zoo spec asks for it get the conjugate
            posterior of their weights given the learned basis.
        coordinate_jitter_m: the training batches' coordinate jitter, metres (0 = none).
        measurement_tails: whether a new measurement's family (Student-t degrees of freedom
            and sd scale, :mod:`geodbk.fit.tails`) is chosen on the validation rows; else Gaussian.
    """

    name: str
    model_defaults: tuple[tuple[str, Any], ...]
    local_residuals: bool
    conjugate_posterior: bool
    coordinate_jitter_m: float = 0.0
    measurement_tails: bool = False

    def input_space(self, dataset: Any, density_tiles: pd.DataFrame | None = None) -> InputSpace:
        """The inputs of a :class:`~geodbk.dataset.spatial_dataset.SpatialDataset` under this
        protocol, with another layer's test density when ``density_tiles`` are given."""
        return InputSpace.for_dataset(dataset, self.name, density_tiles)

    def configs(
        self, preset: str = "cpu", n_rows: int | None = None, **overrides: Any
    ) -> tuple[ModelConfig, TrainConfig]:
        """``(ModelConfig, TrainConfig)``: this protocol's defaults, then the preset's size and
        schedule (``"cpu"`` or ``"paper"``) for ``n_rows`` training rows
        (:meth:`~geodbk.models.config.RunPreset.schedule`), then ``overrides`` (fields of either
        config; ``None`` values are ignored)."""
        given = {key: value for key, value in overrides.items() if value is not None}
        defaults = {key: value for key, value in self.model_defaults if key not in given}
        model, train = run_preset(preset).configs(n_rows, **given)
        return replace(model, **defaults), train

    def fit_configs(
        self,
        inputs: InputSpace,
        preset: str = "cpu",
        *,
        n_rows: int | None = None,
        min_wavelength_m: float = MIN_WAVELENGTH_M,
        coordinate_jitter_m: float | None = None,
        **overrides: Any,
    ) -> tuple[ModelConfig, TrainConfig]:
        """:meth:`configs` for a fit on ``inputs`` of ``n_rows`` training rows, with the settings
        given in metres put into its unit coordinates: the encoding's shortest wavelength ``min_wavelength_m`` and the
        coordinate jitter ``coordinate_jitter_m`` (``None`` = this protocol's; a
        ``coordinate_jitter`` override in input units wins)."""
        model, train = self.configs(preset, n_rows, **overrides)
        model = with_encoding_wavelength(model, inputs, min_wavelength_m)
        if overrides.get("coordinate_jitter") is None:
            jitter_m = self.coordinate_jitter_m if coordinate_jitter_m is None else coordinate_jitter_m
            train = with_coordinate_jitter(train, inputs, jitter_m)
        return model, train

    def model_config(self, preset: str = "cpu", **overrides: Any) -> ModelConfig:
        """The ModelConfig half of :meth:`configs`."""
        return self.configs(preset, **overrides)[0]


SPACE_TIME = Protocol(
    "space-time",
    (("noise_init", MAP_NOISE_INIT), ("encoding_scales", ENCODING_SCALES), ("test_noise", True)),
    local_residuals=True,
    conjugate_posterior=True,
    coordinate_jitter_m=COORDINATE_JITTER_M,
    measurement_tails=True,
)
PAPER = Protocol("paper", (("noise_init", MAP_NOISE_INIT),), local_residuals=False, conjugate_posterior=False)
#: The protocols by name.
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
