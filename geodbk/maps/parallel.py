"""Row blocks on a Dask cluster: ``predict_grid(..., client=...)`` and ``geodbk predict --dask-scheduler``.

:func:`connect` turns a :class:`distributed.Client`, a scheduler address or ``"local[:N]"``
into a client; :func:`map_blocks` runs one job over the row blocks of a grid on it.
How, and why:

* **The job goes to every worker once.** :func:`map_blocks` scatters the job (model, grid,
  layers and the Zarr writer; :class:`geodbk.maps.predict.GridJob`) with
  ``Client.scatter(broadcast=True, hash=False)``; each block task names it instead of
  carrying the model, and a worker keeps one copy for all of its blocks. A fitted GeoModel
  pickles in about 10 ms to a few tens of kB (hidden=8, rank=8), so this costs nothing next
  to one block (``hash=False``: no tokenizing of a torch model).
* **Workers write their own blocks.** A task predicts one row block with the very function
  the serial path uses and writes it into the staged Zarr store
  (:class:`geodbk.maps.stores.ZarrRegions`); a block is a whole number of Zarr chunks (checked
  on every write), so no two tasks write one file. Tasks return only the warnings they caught.
  The store must be on a filesystem every worker sees at the same path, which
  :func:`check_visible` checks before the first block.
* **Failures abort cleanly.** At most two tasks per worker thread are in flight. On a task's
  exception, a KeyboardInterrupt or an early stop, no further block is submitted and the
  tasks in flight are waited for (cancelling one would not stop it once it runs, and it
  could then write into the staged store after it is removed); the exception then
  propagates and ``predict_grid`` removes the staged store, leaving an older store as it was.
* **One torch thread per worker.** Workers started by a Nanny (every ``LocalCluster``
  worker, and ``dask worker`` by default) get ``OMP_NUM_THREADS=1`` from Dask's
  ``distributed.nanny.pre-spawn-environ``, so torch uses one thread each and two workers do
  not oversubscribe two cores. A block's values do not depend on that: the row-partitioned
  float32 matrix products give the same bits on 1, 2 or 4 threads, so the grid equals the
  serial one exactly.

* **Bounded by the machine and the clock.** ``"local:N"`` is refused above the machine's
  cores (:func:`check_scheduler`; at least the default 2): each worker is a process of a few
  hundred MB, and more workers than cores only share them. A scheduler address must answer a
  Dask ``identity`` call within :data:`CONNECT_TIMEOUT` seconds, whole (:func:`check_reachable`):
  ``Client(timeout=...)`` bounds each step of its handshake, not the handshake, and an HTTP
  server on the port kept it waiting until the server closed the connection.

``distributed`` is imported here only inside functions, so importing this module is cheap.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tqdm.auto import tqdm

from geodbk.errors import InputDataError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from distributed import Client

#: Workers of ``"local"``: one process each, one thread per process.
DEFAULT_LOCAL_WORKERS = 2
#: How long to try to reach a scheduler given by address, seconds.
CONNECT_TIMEOUT = 20.0
#: Tasks in flight per worker thread: one running and one queued keeps every thread busy.
TASKS_PER_THREAD = 2

Item = TypeVar("Item")
Result = TypeVar("Result")


def parse_scheduler(spec: str) -> int | str:
    """``"local"`` -> 2 and ``"local:N"`` -> N workers of a local cluster; anything else is a
    scheduler address (``"tcp://10.0.0.5:8786"``), returned stripped."""
    text = spec.strip()
    name, colon, count = text.partition(":")
    if not text:
        raise InputDataError("give a Dask scheduler address (tcp://host:8786), 'local' or 'local:N'")
    if name != "local":
        return text
    if not colon:
        return DEFAULT_LOCAL_WORKERS
    if not count.isdigit() or int(count) < 1:
        raise InputDataError(f"a local Dask cluster is 'local' or 'local:N' with N >= 1 workers, got {spec!r}")
    return int(count)


def machine_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_scheduler(spec: str) -> int | str:
    """:func:`parse_scheduler`, with ``"local:N"`` refused above :func:`machine_cores` (or the
    default of 2 workers, if that is more)."""
    target = parse_scheduler(spec)
    most = max(DEFAULT_LOCAL_WORKERS, machine_cores())
    if isinstance(target, int) and target > most:
        raise InputDataError(
            f"a local Dask cluster of {target} workers is more than this machine's {machine_cores()} CPU cores; "
            f"use local:{most} or fewer"
        )
    return target


def check_reachable(address: str, timeout: float) -> None:
    """Raise unless a Dask scheduler at ``address`` answers an ``identity`` call within
    ``timeout`` seconds, connection and reply together (the module docstring). Runs its own
    event loop in a thread, so it also works under a running loop (a notebook)."""
    from distributed.comm import connect as open_comm

    async def identity() -> object:
        comm = await open_comm(address, timeout=timeout)
        try:
            await comm.write({"op": "identity"})
            return await comm.read()
        finally:
            comm.abort()

    async def within_deadline() -> object:
        return await asyncio.wait_for(identity(), timeout)

    unreachable = f"cannot reach the Dask scheduler at {address}"
    with ThreadPoolExecutor(max_workers=1) as pool:
        try:
            reply = pool.submit(asyncio.run, within_deadline()).result()
        except TimeoutError:
            raise InputDataError(f"{unreachable}: no answer within {timeout:g} s") from None
        except OSError as err:
            raise InputDataError(f"{unreachable}: {err}") from None
        except Exception:  # whatever listens there sends anything: a frame length of exabytes, garbage
            reply = None
    if not (isinstance(reply, dict) and reply.get("type") == "Scheduler"):
        raise InputDataError(f"{unreachable}: what answers there is not a scheduler")


@contextmanager
def connect(scheduler: Client | str) -> Iterator[Client]:
    """A client on ``scheduler``, closed on exit unless it was given as a client.

    ``"local"`` / ``"local:N"`` start a :class:`distributed.LocalCluster` of N (default 2,
    at most :func:`check_scheduler` allows) worker processes with one thread each and no
    dashboard, shut down on exit; an address connects to a running scheduler (its workers need
    geodbk installed) once :func:`check_reachable` has heard it answer.
    """
    from distributed import Client, LocalCluster

    if isinstance(scheduler, Client):
        yield scheduler
        return
    target = check_scheduler(scheduler)
    if isinstance(target, int):
        with (
            LocalCluster(n_workers=target, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
            Client(cluster) as client,
        ):
            yield client
        return
    check_reachable(target, CONNECT_TIMEOUT)
    try:
        client = Client(target, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError, ValueError) as err:
        raise InputDataError(f"cannot reach the Dask scheduler at {target}: {err}") from None
    with client:
        yield client


def check_visible(client: Client, folder: Path) -> None:
    """Raise unless every worker of ``client`` sees ``folder`` (a shared filesystem)."""
    import os

    seen = client.run(os.path.isdir, str(folder))
    blind = sorted(worker for worker, ok in seen.items() if not ok)
    if blind:
        raise InputDataError(
            f"Dask worker(s) {', '.join(blind)} cannot see {folder.parent}: "
            "the store must be on a filesystem every worker shares"
        )


def _call(job: Callable[[Item], Result], item: Item) -> Result:
    return job(item)


def map_blocks(
    client: Client,
    job: Callable[[Item], Result],
    items: Sequence[Item],
    *,
    progress: bool = True,
    desc: str = "blocks",
) -> Iterator[tuple[int, Result]]:
    """``(index, job(items[index]))`` for every item, computed on the cluster, in order of completion.

    ``job`` (picklable) is sent once to every worker; at most ``TASKS_PER_THREAD`` tasks per
    worker thread are in flight. A tqdm bar counts finished items. On a task's exception (re-raised
    here), a KeyboardInterrupt or the caller closing the iterator, nothing more is submitted and
    the tasks in flight are waited for before the exception propagates, so none still runs after.
    """
    from distributed import as_completed, wait

    job_future = client.scatter(job, broadcast=True, hash=False)
    slots = TASKS_PER_THREAD * max(1, sum(client.nthreads().values()))
    queue = iter(enumerate(items))
    in_flight: dict = {}  # Future -> item index
    finished = as_completed()

    def submit_next() -> None:
        nxt = next(queue, None)
        if nxt is not None:
            future = client.submit(_call, job_future, nxt[1], pure=False)
            in_flight[future] = nxt[0]
            finished.add(future)

    try:
        for _ in range(slots):
            submit_next()
        with tqdm(total=len(items), desc=desc, unit="block", disable=not progress) as bar:
            for future in finished:
                result = future.result()
                index = in_flight.pop(future)
                submit_next()
                bar.update()
                yield index, result
    except BaseException:
        wait(list(in_flight))
        raise
    finally:
        client.cancel([job_future])


__all__ = [
    "check_reachable", "check_scheduler", "check_visible", "connect", "machine_cores", "map_blocks",
    "parse_scheduler",
]
