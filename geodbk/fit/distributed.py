"""Data-parallel training over a ``torch.distributed`` process group: :class:`DataParallel`.

:func:`geodbk.fit.train.fit_arrays` trains data-parallel when a process group of two or
more processes is initialised (:meth:`DataParallel.current`), PyTorch-style; ``geodbk fit
--nproc N`` starts one with torchrun on this machine (:func:`launch`), and a user's own
``torchrun --nnodes N --nproc-per-node G ... -m geodbk fit ...`` on every node starts one across
machines: each process it starts is a worker (:func:`is_worker`) that joins the group with
:func:`init_worker`, and global rank 0 writes the run (docs/multinode.md; two nodes simulated
on localhost, with c10d and static rendezvous, in tests/test_multinode.py). Every rank holds
all training and validation rows, the same parameters, q(w) and optimizer state, and draws
the same batch order from the same seed. Each global batch of b rows is split into
``world_size`` contiguous shards (sizes differ by at most one row; a shard may be empty),
and a rank runs the model's per-row work only on its own shard.

How a step stays exactly the single-process step on the whole batch. While
:meth:`DataParallel.sharded_rows` is active, a call of the model (``forward``) or of its
``basis`` module on a batch runs on this rank's rows only, and its per-row outputs are
all-gathered back into whole-batch outputs (one collective per call). The objective then
runs unchanged on the whole batch, identically on every rank, so objectives that are not
means over rows are exact too: dPPGP's ``k_b = max over the batch of ||phi||^2``, and exact
MML's Woodbury terms over the full batch. In backward, the gather hands each rank
``world_size`` times the gradient of its own rows' outputs; gradient terms computed on every
rank alike (the KL of q(w), the noise, the jitter of K_ZZ) arrive once per rank. After
backward, :meth:`DataParallel.average_gradients` all-reduces (sum) the gradients as one
flat bucket and divides by ``world_size``: the per-row parts add up over the shards and the
common parts are counted once, which is the whole-batch gradient (up to the order of the
floating-point sums). The loss is therefore already the whole-batch loss on every rank.
This needs models whose per-row entry points are row-wise (row i of an output depends only
on row i of the inputs, as with LayerNorm, never BatchNorm) and whose 0-dimensional outputs
do not depend on the rows; every zoo kind qualifies.

Why not ``torch.nn.parallel.DistributedDataParallel``: its wrapper exposes only
``forward``, while the objectives call ``model.kl_divergence()``, ``model.basis(x)`` and
``model.noise(tests)`` (an ``AttributeError`` through the wrapper); calling them on
``ddp.module`` instead leaves DDP's reducer unarmed and the next backward hangs. And DDP
averages gradients of per-shard losses, which equals the whole-batch gradient only for
means over rows: with dPPGP's batch maximum it differed by up to 0.14 (2 gloo ranks, 40
rows). The explicit gather and flat all-reduce above are exact for every objective.

Once per epoch the loss sum and the Cholesky failure counters are all-reduced (max), so all
ranks redo an epoch with more jitter together; validation NLL is summed over row shards and
all-reduced, so early stopping agrees; closed-form kinds (``knn``) and
``Objective.refresh`` run identically on every rank over all rows. On CUDA the backend is
NCCL, one GPU per rank (``cuda:LOCAL_RANK``), and CUDA-graph capture is off (the gather is a
collective inside the step); that path is untested here (no GPU).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from geodbk.fit.regressor import resolve_device
from geodbk.models.basis_gp import BasisGP


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the process group: ``rank`` of ``world_size`` (>= 2)."""

    rank: int
    world_size: int

    @classmethod
    def current(cls) -> DataParallel | None:
        """The initialised default process group, or ``None`` (not initialised, or one process)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, shows progress and writes files."""
        return self.rank == 0

    def sizes(self, rows: int) -> list[int]:
        """Rows of each rank's shard of ``rows`` rows: the first ``rows % world_size`` get one more."""
        base, extra = divmod(rows, self.world_size)
        return [base + (r < extra) for r in range(self.world_size)]

    def shard(self, rows: int) -> slice:
        """This rank's contiguous part of ``rows`` rows (see :meth:`sizes`)."""
        sizes = self.sizes(rows)
        start = sum(sizes[: self.rank])
        return slice(start, start + sizes[self.rank])

    @contextmanager
    def sharded_rows(self, model: nn.Module) -> Iterator[None]:
        """Calls of ``model`` and of ``model.basis`` on a batch run on this rank's rows and return
        the whole batch's outputs (module docstring); a call nested in one of them runs as is."""
        modules = [model, model.basis] if isinstance(model, BasisGP) else [model]
        outer: dict[nn.Module, int] = {}  # the module of the call being sharded: its batch rows

        def before(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            if outer or not args or not torch.is_tensor(args[0]):
                return None
            rows = outer[module] = len(args[0])
            return _rows(args, rows, self.shard(rows)), _rows(kwargs, rows, self.shard(rows))

        def after(module: nn.Module, args: tuple, output: Any) -> Any:
            if module not in outer:
                return None
            return self._gather(output, self.sizes(outer.pop(module)))

        handles = [m.register_forward_pre_hook(before, with_kwargs=True) for m in modules]
        handles += [m.register_forward_hook(after) for m in modules]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def average_gradients(self, parameters: Sequence[nn.Parameter]) -> None:
        """Replace each gradient by its mean over the ranks: one all-reduce of a flat bucket.

        Parameters without a gradient are left out; they are the same on every rank, as every
        rank runs the same graph (an empty shard still gives zero gradients, not ``None``).
        """
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        for grad, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            grad.copy_(part.view_as(grad))

    def all_reduce_(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """``tensor`` summed (``op="sum"``) or maximised (``"max"``) over the ranks, in place."""
        dist.all_reduce(tensor, dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return tensor

    def broadcast_(self, model: nn.Module) -> None:
        """Copy rank 0's parameters and buffers to every rank (as DDP does when it wraps a model)."""
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, 0)

    def _gather(self, output: Any, sizes: list[int]) -> Any:
        """The whole batch's ``output`` from every rank's part: a tensor, or a dataclass of tensors
        (:class:`~geodbk.models.basis_gp.GPOutput`), whose tensors with a row dimension are
        gathered in one collective; 0-dimensional ones and ``None`` are kept."""
        if torch.is_tensor(output):
            return self._gather_columns([output], sizes)[0]
        if not dataclasses.is_dataclass(output) or isinstance(output, type):
            raise TypeError(f"data-parallel training needs tensor or dataclass model outputs, got {type(output)}")
        values = {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
        names = [k for k, v in values.items() if torch.is_tensor(v) and v.ndim > 0]
        gathered = self._gather_columns([values[k] for k in names], sizes)
        return dataclasses.replace(output, **dict(zip(names, gathered, strict=True)))

    def _gather_columns(self, parts: list[torch.Tensor], sizes: list[int]) -> list[torch.Tensor]:
        """Gather tensors of this rank's rows, (b_r, ...) each, as the columns of one (b_r, k) block."""
        rows = sizes[self.rank]
        widths = [math.prod(p.shape[1:]) for p in parts]
        block = torch.cat([p.reshape(rows, w) for p, w in zip(parts, widths, strict=True)], dim=1)
        whole = _GatherRows.apply(block, sizes, self.rank)
        return [
            column.reshape(-1, *p.shape[1:]).to(p.dtype)
            for p, column in zip(parts, whole.split(widths, dim=1), strict=True)
        ]


def _rows(values: Any, rows: int, part: slice) -> Any:
    """``values`` (a tuple or dict of arguments) with every tensor of ``rows`` rows cut to ``part``."""

    def cut(v: Any) -> Any:
        return v[part] if torch.is_tensor(v) and v.ndim > 0 and len(v) == rows else v

    if isinstance(values, dict):
        return {k: cut(v) for k, v in values.items()}
    return tuple(cut(v) for v in values)


class _GatherRows(torch.autograd.Function):
    """All-gather of row blocks of unequal sizes (padded to the largest); backward returns
    ``world_size`` times this rank's rows of the gradient, with no communication, because every
    rank computes the same loss from the same gathered outputs."""

    @staticmethod
    def forward(ctx: Any, block: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor:
        padded = block.new_zeros((max(sizes), *block.shape[1:]))
        padded[: len(block)] = block
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded)
        ctx.start, ctx.stop, ctx.world_size = sum(sizes[:rank]), sum(sizes[: rank + 1]), len(sizes)
        return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad[ctx.start : ctx.stop] * ctx.world_size, None, None


def is_worker() -> bool:
    """Whether torchrun started this process as one of several workers (``RANK`` set, ``WORLD_SIZE`` > 1)."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_worker(device: str) -> str:
    """Join the torchrun job's default process group; returns the device this worker trains on.

    When ``device`` resolves to CUDA the backend is NCCL and the device is this worker's GPU on
    its own node, ``cuda:LOCAL_RANK`` (whatever index was asked for; untested here); otherwise
    gloo on the CPU. The group's address comes from torchrun's environment (``MASTER_ADDR``,
    ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), so one node or several is the same call.
    """
    if resolve_device(device).type == "cuda":
        gpu = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(gpu)
        dist.init_process_group("nccl", device_id=gpu)
        return str(gpu)
    dist.init_process_group("gloo")
    return "cpu"


def launch(nproc: int, module_args: Sequence[str]) -> int:
    """Run ``python -m <module_args>`` as ``nproc`` torchrun workers on this machine and wait.

    That is ``python -m torch.distributed.run --standalone --nproc-per-node nproc -m ...``, run
    in this process (``torch.distributed.run.run``, what the ``torchrun`` command calls) so that a
    failed worker ends in an exit status instead of torchrun's traceback. Like torchrun, it is
    meant for a command-line process: it sets ``OMP_NUM_THREADS`` (unless set: this process's
    CPU cores divided among the workers; torchrun's own default is 1) and signal handlers that
    stop the workers. When one worker fails torchrun stops the others.

    Returns:
        0, or the exit status of the first worker that failed (1 when a signal ended it).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // nproc)))
    try:
        run(parse_args(["--standalone", f"--nproc-per-node={nproc}", "-m", *module_args]))
    except ChildFailedError as failed:
        status = failed.get_first_failure()[1].exitcode
        return status if status > 0 else 1
    return 0
