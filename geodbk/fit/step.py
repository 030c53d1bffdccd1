"""One training epoch with no host sync inside a step: :class:`TrainingStep` and :func:`train_epoch`.

Batches are gathered on the device, the loss sum and the Cholesky failure counters stay on
the device and are read once per epoch, and on CUDA the whole step (forward, backward,
AdamW) is replayed from a CUDA graph. That one read per epoch is where a non-finite loss
raises :class:`~geodbk.errors.TrainingError` and where a failed Cholesky factor makes the
epoch run again with ten times the jitter. The loop around it (early stopping,
checkpoints) is :func:`geodbk.fit.train.fit_arrays`.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
from torch import nn

from geodbk.errors import TrainingError
from geodbk.fit.distributed import DataParallel
from geodbk.models.base import ZooModel
from geodbk.models.config import TrainConfig
from geodbk.models.expansions import MAX_JITTER_LEVEL, DeferredCholesky, deferred_cholesky_checks
from geodbk.models.objectives import Objective

#: Eager steps per batch size before :class:`TrainingStep` captures that size as a CUDA graph.
WARMUP_STEPS = 2


class TrainingStep:
    """AdamW steps on batches of the training rows, with no host sync inside a step.

    One step gathers its batch on the device (``index_select`` with device indices), runs
    the objective, backward and ``optimizer.step()``, and adds ``loss * rows`` to the
    device scalar :attr:`loss_sum` (float64).

    On CUDA (``capture`` true, the default there) each batch size is captured as one CUDA
    graph after :data:`WARMUP_STEPS` eager steps of that size, and later steps of that size
    replay it, so a step costs one graph launch instead of hundreds of kernel launches.
    The capture is explicit (``torch.cuda.graph`` around forward, backward and a
    ``capturable`` AdamW step): ``torch.cuda.make_graphed_callables`` graphs forward and
    backward but not the optimizer, and ``torch.compile(mode="reduce-overhead")`` adds
    compile time (tens of seconds per shape) and recompiles when a Cholesky jitter level
    changes, for the same single-graph result. The last partial batch of an epoch is
    neither dropped nor padded: its size (n mod b) is fixed for a fit, so it gets a graph
    of its own and every epoch sees every row, exactly as the eager path does. Each graph
    has its own memory pool. A model whose warm-up step synchronises with the host (a
    ``.item()`` or a blocking copy in its forward) cannot be captured; the step then stays
    eager, as it always does on CPU.

    Data-parallel (``data_parallel`` given, see :mod:`geodbk.fit.distributed`): the model runs
    on this rank's shard of each batch, the objective on the gathered whole batch, and the
    gradients are averaged over the ranks between backward and ``optimizer.step()``; the step
    is then the single-process step on the whole batch, and :attr:`loss_sum` the whole
    batches' sum on every rank. It is never captured (the gather is a collective).

    Args:
        model: the module; ``objective(model, x, y, n, tests)`` gives the loss.
        objective: the training loss.
        optimizer: the optimizer of ``model``'s parameters (see :func:`make_optimizer`).
        X: (n, d) training inputs, on the model's device.
        y: (n,) standardised targets.
        tests: (n,) test counts, or ``None``.
        capture: use CUDA graphs; ``None`` = when ``X`` is on CUDA and not data-parallel.
        data_parallel: this process's place in a process group, for data-parallel steps.
        coordinate_jitter: sd of the Gaussian noise added to the first two columns of the rows
            a step uses (:attr:`~geodbk.models.config.TrainConfig.coordinate_jitter`); 0 = none.
            One draw per row and epoch (:meth:`draw_place_noise`, on the epoch's CPU generator),
            so that every rank of a data-parallel fit and a one-process fit see the same noise,
            and a captured step reads it from a fixed buffer.
    """

    def __init__(
        self,
        model: ZooModel,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        X: torch.Tensor,
        y: torch.Tensor,
        tests: torch.Tensor | None = None,
        *,
        capture: bool | None = None,
        data_parallel: DataParallel | None = None,
        coordinate_jitter: float = 0.0,
    ) -> None:
        if not (math.isfinite(coordinate_jitter) and coordinate_jitter >= 0.0):
            raise ValueError(f"coordinate_jitter must be a finite number >= 0, got {coordinate_jitter}")
        self.coordinate_jitter = float(coordinate_jitter)
        self.model, self.objective, self.optimizer = model, objective, optimizer
        self.X, self.y, self.tests = X, y, tests
        self.n = len(X)
        #: (n, 2) this epoch's noise on each row's place, or ``None`` without jitter
        self.place_noise = torch.zeros(self.n, 2, dtype=X.dtype, device=X.device) if coordinate_jitter > 0 else None
        self.data_parallel = data_parallel
        self.capture = (X.is_cuda and data_parallel is None) if capture is None else capture
        if self.capture and not X.is_cuda:
            raise ValueError("CUDA-graph capture needs the training data on a CUDA device")
        if self.capture and data_parallel is not None:
            raise ValueError("CUDA-graph capture is not available in data-parallel training")
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=X.device)
        #: graph replays so far (steps that were not eager)
        self.replays = 0
        #: why capture was turned off (the host-sync warning of a warm-up step), or ``None``
        self.eager_reason: str | None = None
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._eager_steps: dict[int, int] = {}
        if self.capture:
            _make_capturable(optimizer)

    def step(self, index: torch.Tensor | None) -> None:
        """One eager step on the rows ``index`` (b,) (device int64), or on all rows (``None``)."""
        if index is None:
            xb, yb, tb = self.X, self.y, self.tests
        else:
            xb, yb = self.X.index_select(0, index), self.y.index_select(0, index)
            tb = None if self.tests is None else self.tests.index_select(0, index)
        if self.place_noise is not None:
            noise = self.place_noise if index is None else self.place_noise.index_select(0, index)
            xb = torch.cat([xb[:, :2] + noise, xb[:, 2:]], dim=1)
        parallel = self.data_parallel
        with contextlib.nullcontext() if parallel is None else parallel.sharded_rows(self.model):
            loss = self.objective(self.model, xb, yb, self.n, tb)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if parallel is not None:
            parallel.average_gradients([p for group in self.optimizer.param_groups for p in group["params"]])
        self.optimizer.step()
        self.loss_sum.add_(loss.detach().to(torch.float64) * len(yb))

    def draw_place_noise(self, generator: torch.Generator) -> None:
        """Draw this epoch's place noise (n, 2), sd :attr:`coordinate_jitter`, from the CPU
        ``generator`` into :attr:`place_noise` (in place: captured steps read that buffer).
        Does nothing, and draws nothing, without jitter."""
        if self.place_noise is not None:
            noise = torch.randn(self.n, 2, generator=generator, dtype=self.X.dtype) * self.coordinate_jitter
            self.place_noise.copy_(noise)

    def run(self, order: torch.Tensor, batch_size: int) -> None:
        """One step per consecutive ``batch_size`` rows of ``order`` (n,) (device int64)."""
        for index in order.split(batch_size):
            if self.capture:
                self._graphed_step(index)
            else:
                self.step(index)

    def reset(self) -> None:
        """Drop the captured graphs (after the jitter or the optimizer state was replaced)."""
        self._graphs.clear()
        self._eager_steps.clear()

    def _graphed_step(self, index: torch.Tensor) -> None:
        size = len(index)
        if size in self._graphs:
            graph, static_index = self._graphs[size]
            static_index.copy_(index)
            graph.replay()
            self.replays += 1
            return
        if self._eager_steps.get(size, 0) < WARMUP_STEPS:
            self._warmup_step(index)
            return
        static_index = index.clone()
        graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            self.step(static_index)
        self._graphs[size] = (graph, static_index)
        graph.replay()  # capturing records the step without running it
        self.replays += 1

    def _warmup_step(self, index: torch.Tensor) -> None:
        """An eager step on a side stream (as capture requires); a host sync in it turns capture off."""
        side = torch.cuda.Stream(device=index.device)
        side.wait_stream(torch.cuda.current_stream(index.device))
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught, torch.cuda.stream(side):
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                self.step(index)
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.current_stream(index.device).wait_stream(side)
        self._eager_steps[len(index)] = self._eager_steps.get(len(index), 0) + 1
        syncs = [str(w.message) for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
        if syncs:
            self.capture, self.eager_reason = False, syncs[0]


def _make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Switch an Adam-type optimizer to ``capturable`` (its step counts on the parameters' device).

    Needed when its state came from a checkpoint written without CUDA.
    """
    for group in optimizer.param_groups:
        group["capturable"] = True
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            if torch.is_tensor(state.get("step")) and state["step"].device != param.device:
                state["step"] = state["step"].to(param.device, torch.float32)


class _EpochStart:
    """What a training step changes, as it was at the start of an epoch: parameters, buffers,
    the optimizer state (kept in place, so that tensor addresses stay valid) and the batch order."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> None:
        self.optimizer, self.generator = optimizer, generator
        self.live = list(model.state_dict(keep_vars=True).values())
        self.live += [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
        self.saved = [t.detach().clone() for t in self.live]
        self.had_state = {id(p) for p in optimizer.state}
        self.generator_state = generator.get_state()

    @torch.no_grad()
    def restore(self) -> None:
        for tensor, value in zip(self.live, self.saved, strict=True):
            tensor.copy_(value)
        for param in [p for p in self.optimizer.state if id(p) not in self.had_state]:
            del self.optimizer.state[param]  # first-epoch state is created again by the next step
        self.generator.set_state(self.generator_state)


def train_epoch(
    step: TrainingStep,
    cfg: TrainConfig,
    full_batch: bool,
    generator: torch.Generator,
    *,
    kind: str,
    epoch: int,
) -> float:
    """One pass in shuffled mini-batches, or one full-batch step; returns the mean loss.

    Full-batch steps use all rows, or a random ``cfg.full_batch_max`` of them when more.
    The batch order is drawn on the CPU ``generator`` and moved to the device once. The
    loss sum and the Cholesky failure counters are read once, at the end: if a
    :class:`~geodbk.models.expansions.DeferredCholesky` failed, the model, optimizer and
    generator are put back as they were at the start and the epoch runs again with ten
    times that factor's jitter (at most ``MAX_JITTER_LEVEL`` times in a fit). Data-parallel, the
    loss sum and the counters are all-reduced (max) first, so that every rank redoes the epoch
    together (the loss sum is already the same on every rank).

    Args:
        step: the training step, holding the model, objective, optimizer and data.
        cfg: batch size and the full-batch row cap.
        full_batch: one step on (a subset of) all rows instead of mini-batches.
        generator: CPU generator for the batch order.
        kind: the model kind, for error messages.
        epoch: the epoch number (1-based), for error messages.

    Raises:
        TrainingError: the mean loss is NaN or infinite, or a Cholesky factor fails at the
            largest jitter.
    """
    model, n = step.model, step.n
    with deferred_cholesky_checks(model) as guards:
        start = _EpochStart(model, step.optimizer, generator) if guards else None
        while True:
            model.train()
            step.draw_place_noise(generator)  # before the batch order; a retried epoch draws both again
            step.loss_sum.zero_()
            for guard in guards:
                guard.failures.zero_()
            if full_batch and n > cfg.full_batch_max:
                step.step(torch.randperm(n, generator=generator)[: cfg.full_batch_max].to(step.X.device))
                rows = cfg.full_batch_max
            elif full_batch:
                step.step(None)
                rows = n
            else:
                step.run(torch.randperm(n, generator=generator).to(step.X.device), cfg.batch_size)
                rows = n
            read = torch.stack([step.loss_sum, *(guard.failures.to(torch.float64) for guard in guards)])
            if step.data_parallel is not None:
                step.data_parallel.all_reduce_(read, "max")
            totals = read.tolist()
            failed = [guard for guard, count in zip(guards, totals[1:], strict=True) if count > 0]
            if not failed:
                break
            _retry_with_more_jitter(failed, start, step, kind, epoch)
    loss = totals[0] / rows
    if not math.isfinite(loss):
        raise TrainingError(
            f"{kind}: the training loss ({step.objective.name}) became {loss} in epoch {epoch}; "
            f"try a lower lr (now {step.optimizer.param_groups[0]['lr']:g}) or dtype='float64'"
        )
    return loss


def _retry_with_more_jitter(
    failed: list[DeferredCholesky], start: _EpochStart | None, step: TrainingStep, kind: str, epoch: int
) -> None:
    """Put the epoch's starting state back and raise the failed factors' jitter tenfold."""
    if any(guard.level >= MAX_JITTER_LEVEL for guard in failed):
        raise TrainingError(
            f"{kind}: a Cholesky factor failed in epoch {epoch} even with its jitter raised "
            f"{10**MAX_JITTER_LEVEL}-fold; try dtype='float64' or a lower lr"
        )
    assert start is not None  # taken whenever the model has DeferredCholesky factors
    start.restore()
    for guard in failed:
        guard.level += 1
    step.reset()  # the captured graphs hold the old jitter
