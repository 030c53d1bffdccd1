"""Model size, training schedule, and the named presets that set both.

:class:`ModelConfig` (architecture and numerics) and :class:`TrainConfig` (optimisation) are
shared by every entry of the model zoo; the objectives read ``alpha`` and ``beta`` from the
train config. Their defaults are the ``cpu`` preset; :data:`PRESETS` is the one home of the
named schedules (``cpu``: the README's CPU default; ``paper``: the paper's spatial-task size
and schedule, a GPU job), and :meth:`RunPreset.configs` lets explicit settings win.

Size guards, checked before any tensor is allocated:

* :func:`check_model_size` (``geodbk fit``): the rank may not exceed the training rows
  (unless it is at most the CPU preset's 128), and without ``--allow-large-model`` the width
  is at most :data:`MAX_HIDDEN` = 4096 (16x the paper's 256), the encoding has at most
  :data:`MAX_ENCODING_SCALES` = 64 wavelengths (each adds 4 input columns, and 64 already
  span 2^64 between the shortest and the longest), and the weights
  (:func:`parameter_count`) take at most :data:`MAX_MODEL_BYTES` = 2 GiB.
* :func:`stored_model_config` (loading a model file): the stored sizes may not ask for more
  weights than the file holds (4x plus 16 M, for buffers the file does not store), so a
  tampered ``hidden = 1e9`` is refused instead of allocating 140 GB.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from numbers import Integral
from typing import Any

import torch

from geodbk.errors import InputDataError, ResourceLimitError

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: Widest backbone accepted without ``--allow-large-model`` (16x the paper's h = 256).
MAX_HIDDEN = 4096
#: Most positional-encoding wavelengths accepted without ``--allow-large-model``.
MAX_ENCODING_SCALES = 64
#: Largest weight memory accepted without ``--allow-large-model``, bytes (2 GiB).
MAX_MODEL_BYTES = 2 << 30
#: A model file may declare at most this many times the weights it stores, plus :data:`_STORED_SLACK`.
_STORED_FACTOR = 4
#: Weights a model file may declare beyond what it stores (buffers rebuilt at load), count.
_STORED_SLACK = 1 << 24


@dataclass(frozen=True)
class RunPreset:
    """A named model size and training schedule.

    Attributes:
        name: ``"cpu"`` or ``"paper"``.
        hidden: backbone width h.
        rank: basis rank / inducing points r.
        epochs: maximum training epochs (fewer with ``row_passes``).
        lr: AdamW learning rate.
        batch_size: mini-batch size b (the smallest, with ``min_steps_per_epoch``).
        note: where the numbers come from.
        min_steps_per_epoch: when set and the training rows are known, the batch doubles from
            ``batch_size`` (up to ``max_batch_size``) while an epoch keeps at least this many
            steps, and the learning rate grows with the square root of the batch
            (:meth:`schedule`); ``None``: fixed.
        max_batch_size: the largest batch :meth:`schedule` doubles to.
        min_steps: when set and the training rows are known, the epochs grow until the fit
            takes at least this many optimiser steps (a small region's epoch is a few steps);
            ``row_passes`` still caps them.
        row_passes: when set and the training rows are known, the epochs are cut to the fewest
            that pass this many rows through the network (at least one epoch).
    """

    name: str
    hidden: int
    rank: int
    epochs: int
    lr: float
    batch_size: int
    note: str
    min_steps_per_epoch: int | None = None
    max_batch_size: int = 8192
    min_steps: int | None = None
    row_passes: int | None = None

    def schedule(self, n_rows: int | None = None) -> tuple[int, float, int]:
        """``(batch_size, lr, epochs)`` for ``n_rows`` training rows (``None``: unknown, the
        preset's own)."""
        batch, epochs = self.batch_size, self.epochs
        if self.min_steps_per_epoch is not None and n_rows is not None:
            while 2 * batch <= self.max_batch_size and n_rows / (2 * batch) >= self.min_steps_per_epoch:
                batch *= 2
        if self.min_steps is not None and n_rows:
            epochs = max(epochs, math.ceil(self.min_steps / math.ceil(n_rows / batch)))
        if self.row_passes is not None and n_rows:
            epochs = max(1, min(epochs, math.ceil(self.row_passes / n_rows)))
        return batch, self.lr * math.sqrt(batch / self.batch_size), epochs

    def configs(self, n_rows: int | None = None, **explicit: Any) -> tuple[ModelConfig, TrainConfig]:
        """``(ModelConfig, TrainConfig)`` of this preset for ``n_rows`` training rows (see
        :meth:`schedule`); ``explicit`` settings win (an explicit batch keeps the preset's lr).

        ``explicit`` may name any field of either config; ``None`` values are ignored, so
        unset CLI flags can be passed through as they are.
        """
        given = {k: v for k, v in explicit.items() if v is not None}
        model_fields = set(ModelConfig.__dataclass_fields__)
        train_fields = set(TrainConfig.__dataclass_fields__)
        unknown = sorted(set(given) - model_fields - train_fields)
        if unknown:
            raise ValueError(f"unknown settings {unknown} for preset {self.name!r}")
        size = {"hidden": self.hidden, "rank": self.rank}
        batch, lr, epochs = self.schedule(n_rows)
        if "batch_size" in given:
            lr = self.lr
        schedule = {"epochs": epochs, "lr": lr, "batch_size": batch}
        model = ModelConfig(**{**size, **{k: v for k, v in given.items() if k in model_fields}})
        train = TrainConfig(**{**schedule, **{k: v for k, v in given.items() if k in train_fields}})
        return model, train


#: The CPU default of ``geodbk fit``, the demo, the benchmarks, ``ModelConfig()`` and
#: ``TrainConfig()``.
CPU = RunPreset(
    "cpu", hidden=64, rank=128, epochs=20, lr=1e-2, batch_size=1024, min_steps_per_epoch=25, min_steps=500,
    row_passes=1_500_000,
    note="chosen on PR and HI validation data (benchmarks/bench_training_schedule.py): with the "
    "residual field and the conjugate refit, the map's validation NLL no longer needs the 40 epochs "
    "of batch 1024 that the network's own NLL kept improving over. PR (113k rows: batch 4096, "
    "lr 2e-2, 20 epochs, 0.13x the steps): random 0.4569 vs 0.4582, spatial-block 0.7319 vs 0.7388; "
    "HI (27k rows: batch 1024, 20 epochs, 0.5x the steps): random +0.002, spatial-block +0.006 "
    "(13 epochs: +0.003 and +0.014; batch 4096 there: +0.040, too few steps). Batch 8192 at lr 2.8e-2 "
    "on PR random: 0.4570; larger batches were not tried, hence the cap. At most 1.5 M rows through the "
    "network (PR: 14 epochs): PR at 12 and 15 epochs scored 0.4575 / 0.4568 (random) and 0.7325 / "
    "0.7325 (spatial-block); HI's 20 epochs are 0.54 M. At least 500 steps (benchmarks/bench_regions.py, "
    "six crops of 1-6k rows, "
    "where 20 epochs were 20-120 steps and the best epoch was mostly one of the last): validation NLL "
    "-0.004 random, -0.009 spatial-block (batch 512 or 256 instead: -0.004 / -0.011, -0.004 / -0.009); "
    "PR (row passes) and HI (540 steps) keep their schedules",
)
#: The paper's spatial-task size and schedule (h = 256, r = 1024, 400 epochs at lr 1e-3).
PAPER = RunPreset(
    "paper", hidden=256, rank=1024, epochs=400, lr=1e-3, batch_size=1024,
    note="the paper's spatial-task setting; a GPU job",
)
PRESETS: dict[str, RunPreset] = {p.name: p for p in (CPU, PAPER)}


def run_preset(name: str) -> RunPreset:
    """The preset called ``name`` (``"cpu"`` or ``"paper"``); ``ValueError`` otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None


@dataclass
class ModelConfig:
    """Architecture settings.

    Attributes:
        hidden: h, width of the ResNet backbone (default the CPU preset's 64; paper: 256).
        rank: r, number of basis functions / inducing points (CPU preset 128; paper: 1024).
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
            :func:`geodbk.fit.fitting.fit_dataset`).
        test_noise: learn the noise sigma0^2 + sigma1^2 / tests (``tests`` = the number of
            speed tests a row averages) instead of one sigma^2.
        input_columns: the input columns the backbone reads, by position (``None``: all).
            The map model's kriging part reads the quarter alone (:func:`geodbk.fit.fitting.fit_dataset`).
        options: kind-specific extras, read by the kind's builder (documented there).
    """

    hidden: int = CPU.hidden
    rank: int = CPU.rank
    n_blocks: int = 2
    dtype: str = "float32"
    noise_init: float | None = None
    noise_floor: float = 1e-6
    jitter: float | None = None
    encoding_scales: int = 0
    encoding_min_wavelength: float = 0.01
    encoding_max_wavelength: float = 4.0
    test_noise: bool = False
    input_columns: tuple[int, ...] | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.input_columns is not None:  # a model file stores the tuple as a list
            self.input_columns = tuple(self.input_columns)
            if not self.input_columns or not all(isinstance(c, Integral) and not isinstance(c, bool) and c >= 0
                                                 for c in self.input_columns):
                raise ValueError(f"input_columns must be positions of input columns, got {self.input_columns!r}")
        for name in ("hidden", "rank", "n_blocks", "encoding_scales"):
            value = getattr(self, name)
            if not isinstance(value, Integral) or isinstance(value, bool):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.hidden < 1 or self.rank < 1:
            raise ValueError(f"hidden and rank must be positive, got {self.hidden}, {self.rank}")
        if self.encoding_scales < 0 or not 0 < self.encoding_min_wavelength <= self.encoding_max_wavelength:
            raise ValueError(
                "encoding_scales must be >= 0 and 0 < encoding_min_wavelength <= encoding_max_wavelength, got "
                f"{self.encoding_scales}, {self.encoding_min_wavelength}, {self.encoding_max_wavelength}"
            )

    def noise_init_or(self, kind_default: float) -> float:
        """``noise_init`` if set, else the model kind's default."""
        return kind_default if self.noise_init is None else self.noise_init

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        return cls(**d)


@dataclass
class TrainConfig:
    """Optimisation settings.

    Attributes:
        epochs: maximum passes over the training data (full-batch kinds: gradient steps);
            default the CPU preset's 40.
        batch_size: mini-batch size b (1024).
        lr: AdamW learning rate; default the CPU preset's 1e-2 (the paper's is 1e-3).
        weight_decay: AdamW weight decay on the backbone only (1e-2).
        alpha: dPPGP trace-regulariser weight (0.1).
        beta: dPPGP / PPGP KL weight (0.01).
        patience: stop after this many epochs without a better validation NLL; ``None``
            never stops early.
        seed: seeds the initial weights and the batch order.
        device: "auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:1", ...
        progress: show a tqdm bar with the loss and validation NLL.
        checkpoint_path: if set, write a resumable checkpoint there after every epoch.
        resume_from: a checkpoint to continue from (same kind and configs).
        full_batch_max: row cap per step for full-batch objectives; above it each step
            uses a fresh random subset of this size.
        eval_batch_size: rows per batch when computing validation predictions.
        coordinate_jitter: sd of the Gaussian noise added to the two coordinate columns (the
            first two input columns) of every training batch, in input units; 0 adds none.
            Training on jittered places fits the regression of y on a place blurred by that
            much (input noise acts as a smoothness penalty), so the deep kernel learns the
            regional surface and leaves tile-scale detail to the local residual field. The
            space-time protocol sets it from metres (:data:`geodbk.dataset.protocols.COORDINATE_JITTER_M`).
    """

    epochs: int = CPU.epochs
    batch_size: int = CPU.batch_size
    lr: float = CPU.lr
    weight_decay: float = 1e-2
    alpha: float = 0.1
    beta: float = 0.01
    patience: int | None = 50
    seed: int = 0
    device: str = "auto"
    progress: bool = True
    checkpoint_path: str | None = None
    resume_from: str | None = None
    full_batch_max: int = 100_000
    eval_batch_size: int = 65536
    coordinate_jitter: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parameter_count(config: ModelConfig, input_dim: int) -> int:
    """Upper estimate of the weights of a model of any kind built from ``config`` on
    ``input_dim`` input columns: the ResNet backbone (encoding to ``input_dim + 4 *
    encoding_scales`` columns, stem, ``n_blocks`` blocks of two h x h layers and a norm, final
    norm), an h x r basis and two r x r covariance factors."""
    h, r = int(config.hidden), int(config.rank)
    width = int(input_dim) + 4 * int(config.encoding_scales)
    backbone = (width + 1) * h + int(config.n_blocks) * (2 * h * h + 4 * h) + 2 * h
    return backbone + (h + 2) * r + 2 * r * r


def weight_bytes(config: ModelConfig, input_dim: int) -> int:
    """Bytes of :func:`parameter_count` weights at the config's dtype."""
    return parameter_count(config, input_dim) * torch.empty(0, dtype=config.torch_dtype).element_size()


def check_model_size(config: ModelConfig, input_dim: int, n_rows: int, *, allow_large: bool = False) -> None:
    """Refuse, before building anything, a model too large for its data or for memory
    (the rule is in the module docstring).

    Args:
        config: the model's architecture.
        input_dim: model input columns (2 or 3).
        n_rows: training rows.
        allow_large: lift the width, encoding and memory caps (``--allow-large-model``).

    Raises:
        ResourceLimitError: a limit is exceeded; the message names the option to change.
    """
    if config.rank > max(n_rows, CPU.rank):
        raise ResourceLimitError(
            f"--rank {config.rank} is more than the {n_rows:,} training rows; a rank-r basis needs at least "
            "r rows: lower --rank"
        )
    if allow_large:
        return
    if config.hidden > MAX_HIDDEN:
        raise ResourceLimitError(f"--hidden {config.hidden} is above the limit of {MAX_HIDDEN}; "
                                 "pass --allow-large-model to fit it anyway")
    if config.encoding_scales > MAX_ENCODING_SCALES:
        raise ResourceLimitError(f"--encoding-scales {config.encoding_scales} is above the limit of "
                                 f"{MAX_ENCODING_SCALES}; pass --allow-large-model to fit it anyway")
    size = weight_bytes(config, input_dim)
    if size > MAX_MODEL_BYTES:
        raise ResourceLimitError(
            f"a model of hidden {config.hidden}, rank {config.rank} has {size / 2**30:.1f} GiB of weights, above "
            f"the limit of {MAX_MODEL_BYTES / 2**30:g} GiB; lower --hidden/--rank or pass --allow-large-model"
        )


def stored_model_config(stored: Any, input_dim: Any, state_dict: Any) -> ModelConfig:
    """The :class:`ModelConfig` stored in a model file, checked against the weights it holds
    before any model is built (see the module docstring).

    Args:
        stored: the file's ``model_config`` mapping.
        input_dim: the file's ``input_dim``.
        state_dict: the file's weights, ``{name: tensor}``.

    Raises:
        InputDataError: the config is not a valid one, or declares far more weights than stored.
    """
    try:
        config = ModelConfig.from_dict(dict(stored))
        columns = int(input_dim)
        held = sum(int(t.numel()) for t in state_dict.values() if isinstance(t, torch.Tensor))
    except (TypeError, ValueError, AttributeError) as err:
        raise InputDataError(f"the model file's configuration is damaged: {err}") from err
    declared = parameter_count(config, columns)
    if config.input_columns is not None and max(config.input_columns) >= columns:
        raise InputDataError(f"the model file's network reads input column {max(config.input_columns)} of "
                             f"{columns}: it is damaged or tampered")
    if not 0 < columns <= 16 or declared > _STORED_FACTOR * held + _STORED_SLACK:
        raise InputDataError(
            f"the model file declares hidden {config.hidden}, rank {config.rank}, {config.encoding_scales} encoding "
            f"scales on {columns} inputs ({declared:,} weights) but holds {held:,}: it is damaged or tampered"
        )
    return config
