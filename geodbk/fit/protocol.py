"""The torch side of a fitting protocol (:class:`~geodbk.dataset.protocols.Protocol`, whose
registry is :mod:`geodbk.dataset.protocols`): its model and training configs for a fit, so that
:func:`geodbk.fit.fitting.fit_dataset` is the one place that assembles a fit's settings.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from geodbk.dataset.coords import ProjectedTransform
from geodbk.dataset.inputs import InputSpace
from geodbk.dataset.protocols import MIN_WAVELENGTH_M, Protocol
from geodbk.models.config import ModelConfig, TrainConfig, run_preset


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


def configs(
    protocol: Protocol, preset: str = "cpu", n_rows: int | None = None, **overrides: Any
) -> tuple[ModelConfig, TrainConfig]:
    """``(ModelConfig, TrainConfig)``: ``protocol``'s defaults, then the preset's size and
    schedule (``"cpu"`` or ``"paper"``) for ``n_rows`` training rows
    (:meth:`~geodbk.models.config.RunPreset.schedule`), then ``overrides`` (fields of either
    config; ``None`` values are ignored)."""
    given = {key: value for key, value in overrides.items() if value is not None}
    defaults = {key: value for key, value in protocol.model_defaults if key not in given}
    model, train = run_preset(preset).configs(n_rows, **given)
    return replace(model, **defaults), train


def fit_configs(
    protocol: Protocol,
    inputs: InputSpace,
    preset: str = "cpu",
    *,
    n_rows: int | None = None,
    min_wavelength_m: float = MIN_WAVELENGTH_M,
    coordinate_jitter_m: float | None = None,
    **overrides: Any,
) -> tuple[ModelConfig, TrainConfig]:
    """:func:`configs` for a fit on ``inputs`` of ``n_rows`` training rows, with the settings
    given in metres put into its unit coordinates: the encoding's shortest wavelength ``min_wavelength_m`` and the
    coordinate jitter ``coordinate_jitter_m`` (``None`` = ``protocol``'s; a
    ``coordinate_jitter`` override in input units wins)."""
    model, train = configs(protocol, preset, n_rows, **overrides)
    model = with_encoding_wavelength(model, inputs, min_wavelength_m)
    if overrides.get("coordinate_jitter") is None:
        jitter_m = protocol.coordinate_jitter_m if coordinate_jitter_m is None else coordinate_jitter_m
        train = with_coordinate_jitter(train, inputs, jitter_m)
    return model, train
