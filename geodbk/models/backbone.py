"""Backbones g: R^d -> R^h that feed an expansion layer.

:class:`ResNetBackbone` is the Gorishniy-style residual MLP used by every deep model in
geodbk, optionally behind a :class:`SinusoidalEncoding` of the coordinates;
:class:`IdentityBackbone` passes raw inputs through (for SV-RBF, a plain inducing-point GP
on the coordinates).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn


class SinusoidalEncoding(nn.Module):
    """Multi-resolution positional encoding of the first ``dims`` input columns.

    ``x -> [x, sin(2 pi x_j / l_s), cos(2 pi x_j / l_s)]`` for j < ``dims`` and wavelengths
    l_s geometrically spaced from ``max_wavelength`` down to ``min_wavelength`` (input
    units), s = 1..``n_scales``; the other columns (e.g. time) pass through unencoded.
    An MLP on raw coordinates is biased to smooth functions (spectral bias); these
    features let it represent detail down to ``min_wavelength`` (for maps, about a tile).

    Args:
        input_dim: d, the number of input columns.
        n_scales: number of wavelengths.
        min_wavelength, max_wavelength: shortest and longest wavelength, input units.
        dims: how many leading columns are coordinates to encode.

    Shapes: ``(n, d) -> (n, d + 2 * dims * n_scales)``.
    """

    angular_frequency: torch.Tensor  # buffer, (n_scales,)

    def __init__(
        self, input_dim: int, n_scales: int, min_wavelength: float, max_wavelength: float, dims: int = 2
    ) -> None:
        super().__init__()
        if n_scales < 1 or not 0 < min_wavelength <= max_wavelength:
            raise ValueError(
                f"need n_scales >= 1 and 0 < min_wavelength <= max_wavelength, got {n_scales}, "
                f"{min_wavelength}, {max_wavelength}"
            )
        self.input_dim = input_dim
        self.dims = min(dims, input_dim)
        self.output_dim = input_dim + 2 * self.dims * n_scales
        ratio = (min_wavelength / max_wavelength) ** (1.0 / max(n_scales - 1, 1))
        wavelengths = [max_wavelength * ratio**s for s in range(n_scales)]
        angular = torch.tensor([2.0 * math.pi / w for w in wavelengths])
        self.register_buffer("angular_frequency", angular, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phase = x[:, : self.dims, None] * self.angular_frequency  # (n, dims, n_scales)
        phase = phase.flatten(1)
        return torch.cat([x, torch.sin(phase), torch.cos(phase)], dim=-1)


class ResidualBlock(nn.Module):
    """``x + Linear(SiLU(Linear(LayerNorm(x))))`` with width ``h`` kept fixed."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.inner = nn.Linear(width, width)
        self.outer = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.outer(nn.functional.silu(self.inner(self.norm(x))))


class ResNetBackbone(nn.Module):
    """[encoding], Linear(d -> h), ``n_blocks`` residual blocks, final LayerNorm + SiLU.

    Args:
        input_dim: d, the number of input features.
        hidden: h, the representation width (the paper uses 256 for the spatial task).
        n_blocks: number of residual blocks (2 in the paper).
        encoding: an optional input encoding with ``output_dim`` (e.g.
            :class:`SinusoidalEncoding`) applied before the stem.

    Shapes: ``(n, d) -> (n, h)``.
    """

    def __init__(self, input_dim: int, hidden: int, n_blocks: int = 2, encoding: nn.Module | None = None) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = hidden
        self.encoding = encoding if encoding is not None else nn.Identity()
        self.stem = nn.Linear(input_dim if encoding is None else cast(int, encoding.output_dim), hidden)
        self.blocks = nn.Sequential(*(ResidualBlock(hidden) for _ in range(n_blocks)))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.norm(self.blocks(self.stem(self.encoding(x)))))


class ColumnSelection(nn.Module):
    """A backbone that reads only some input columns: ``inner(x[:, columns])``.

    Args:
        inner: the backbone, built on ``len(columns)`` inputs.
        columns: positions of the columns it reads.
        input_dim: d, the number of input columns the model is given.

    Shapes: ``(n, d) -> (n, inner.output_dim)``.
    """

    def __init__(self, inner: nn.Module, columns: tuple[int, ...], input_dim: int) -> None:
        super().__init__()
        if max(columns) >= input_dim:
            raise ValueError(f"input column {max(columns)} does not exist in {input_dim} inputs")
        self.inner = inner
        self.columns = list(columns)
        self.input_dim = input_dim
        self.output_dim = cast(int, inner.output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.inner(x[:, self.columns]))


class IdentityBackbone(nn.Module):
    """g(x) = x, with no parameters. Shapes: ``(n, d) -> (n, d)``."""

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = input_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
