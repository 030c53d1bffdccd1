"""Model size and numeric settings shared by every entry of the model zoo."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class ModelConfig:
    """Architecture settings.

    Attributes:
        hidden: h, width of the ResNet backbone (paper: 256; CPU default 64).
        rank: r, number of basis functions / inducing points (paper: 1024; CPU default 128).
        n_blocks: residual blocks in the backbone (2).
        dtype: "float32" (default) or "float64".
        noise_init: initial sigma^2 on the standardised scale; ``None`` = the kind's
            default: 1e-2 for the DBK kinds (the method spec), 0.693 (softplus(0), GPyTorch's
            Gaussian-likelihood default) for the inducing-point baselines sv-rbf, sv-dkl
            and pp-dkl, whose ELBO barely moves sigma^2 up from 1e-2 in a short schedule.
        noise_floor: lower bound on sigma^2 (1e-6).
        jitter: relative jitter on K_ZZ; ``None`` = 1e-4 (float32) / 1e-6 (float64).
        encoding_scales: wavelengths of the backbone's sinusoidal encoding of the first
            two input columns (0 = no encoding, the paper's design). Every ResNet kind uses it.
        encoding_min_wavelength, encoding_max_wavelength: its shortest and longest
            wavelength in input units (maps set the shortest from metres, see
            :func:`geodbk.geomodel.fit_dataset`).
        test_noise: learn the noise sigma0^2 + sigma1^2 / tests (``tests`` = the number of
            speed tests a row averages) instead of one sigma^2.
        options: kind-specific extras, read by the kind's builder (documented there).
    """

    hidden: int = 64
    rank: int = 128
    n_blocks: int = 2
    dtype: str = "float32"
    noise_init: float | None = None
    noise_floor: float = 1e-6
    jitter: float | None = None
    encoding_scales: int = 0
    encoding_min_wavelength: float = 0.01
    encoding_max_wavelength: float = 4.0
    test_noise: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.hidden < 1 or self.rank < 1:
            raise ValueError(f"hidden and rank must be positive, got {self.hidden}, {self.rank}")
        if self.encoding_scales < 0 or not 0 < self.encoding_min_wavelength <= self.encoding_max_wavelength:
            raise ValueError(
                "encoding_scales must be >= 0 and 0 < encoding_min_wavelength <= encoding_max_wavelength, got "
                f"{self.encoding_scales}, {self.encoding_min_wavelength}, {self.encoding_max_wavelength}"
            )

    @classmethod
    def paper_size(cls, **overrides: Any) -> "ModelConfig":
        """The spatial-task size of the paper: h = 256, r = 1024."""
        return cls(**{"hidden": 256, "rank": 1024, **overrides})

    def noise_init_or(self, kind_default: float) -> float:
        """``noise_init`` if set, else the model kind's default."""
        return kind_default if self.noise_init is None else self.noise_init

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        return cls(**d)
