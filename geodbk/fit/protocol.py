"""The fitting protocols as values: :class:`Protocol` carries a protocol's input space, its
model-config defaults and its residual policy, so that :func:`geodbk.fit.fitting.fit_dataset`
is the one place that assembles a fit's settings.

The space-time protocol's settings were chosen on validation data: positional encoding, noise
initialisation, test-count noise, the local residual field and the conjugate posterior.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

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


def with_encoding_wavelength(
    config: ModelConfig, inputs: InputSpace, min_wavelength_m: float = MIN_WAVELENGTH_M
) -> ModelConfig:
    """``config`` with the positional encoding's shortest wavelength set to ``min_wavelength_m``
    metres in ``inputs``' unit coordinates (projected inputs with an encoding only)."""
    if not isinstance(inputs.coords, ProjectedTransform) or config.encoding_scales == 0:
        return config
    shortest = min(inputs.coords.metres_to_units(min_wavelength_m), config.encoding_max_wavelength)
    return replace(config, encoding_min_wavelength=shortest)


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
    """

    name: str
    model_defaults: tuple[tuple[str, Any], ...]
    local_residuals: bool
    conjugate_posterior: bool

    def input_space(self, dataset: Any) -> InputSpace:
        """The inputs of a :class:`~geodbk.dataset.spatial_dataset.SpatialDataset` under this protocol."""
        return InputSpace.for_dataset(dataset, self.name)

    def configs(self, preset: str = "cpu", **overrides: Any) -> tuple[ModelConfig, TrainConfig]:
        """``(ModelConfig, TrainConfig)``: this protocol's defaults, then the preset's size and
        schedule (``"cpu"`` or ``"paper"``), then ``overrides`` (fields of either config; ``None``
        values are ignored)."""
        given = {key: value for key, value in overrides.items() if value is not None}
        defaults = {key: value for key, value in self.model_defaults if key not in given}
        model, train = run_preset(preset).configs(**given)
        return replace(model, **defaults), train

    def model_config(self, preset: str = "cpu", **overrides: Any) -> ModelConfig:
        """The ModelConfig half of :meth:`configs`."""
        return self.configs(preset, **overrides)[0]


SPACE_TIME = Protocol(
    "space-time",
    (("noise_init", MAP_NOISE_INIT), ("encoding_scales", ENCODING_SCALES), ("test_noise", True)),
    local_residuals=True,
    conjugate_posterior=True,
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
