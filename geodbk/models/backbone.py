"""Backbones g: R^d -> R^h that feed an expansion layer.

:class:`ResNetBackbone` is the Gorishniy-style residual MLP used by every deep model in
geodbk; :class:`IdentityBackbone` passes raw inputs through (for SV-RBF, a plain
inducing-point GP on the coordinates).
"""

from __future__ import annotations

import torch
from torch import nn


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
    """Linear(d -> h), ``n_blocks`` residual blocks, final LayerNorm + SiLU.

    Args:
        input_dim: d, the number of input features.
        hidden: h, the representation width (the paper uses 256 for the spatial task).
        n_blocks: number of residual blocks (2 in the paper).

    Shapes: ``(n, d) -> (n, h)``.
    """

    def __init__(self, input_dim: int, hidden: int, n_blocks: int = 2) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = hidden
        self.stem = nn.Linear(input_dim, hidden)
        self.blocks = nn.Sequential(*(ResidualBlock(hidden) for _ in range(n_blocks)))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.norm(self.blocks(self.stem(x))))


class IdentityBackbone(nn.Module):
    """g(x) = x, with no parameters. Shapes: ``(n, d) -> (n, d)``."""

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = input_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
