"""Options and checks shared by several ``geodbk`` subcommands.

Every check raises :class:`geodbk.errors.InputDataError`, which :func:`geodbk.cli.main`
prints as one line with exit status 2; :func:`finite_float` and :func:`input_file` are argparse
types, so a non-finite value or an input path that is not a regular file is an argparse error (one
line, exit status 2) too. Every option that names an input file other than a vector file takes
:func:`input_file` as its type; vector files (tiles, regions, polygons: paths or URLs) are checked
by their reader, :func:`geodbk.ingest.vectorfiles.checked_path`. Heavy modules (torch,
geopandas) are imported inside the functions, so ``geodbk --help`` stays fast.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from geodbk.errors import InputDataError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from geodbk.fit.geomodel import GeoModel
    from geodbk.quarters import Quarter


def finite_float(text: str) -> float:
    """argparse type: a finite number (``nan``, ``inf`` and non-numbers are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"needs a finite number, got {text!r}")
    return value


#: What :func:`input_file` calls a path that is not a regular file, by its ``stat`` test.
_NOT_FILES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def input_file(text: str) -> str:
    """argparse type of an input path option: a regular file (a symlink to one is fine), checked
    before anything opens it, since opening a FIFO blocks until a writer comes (``fit --dataset``
    on a FIFO hung, deaf to SIGTERM); ``text`` is returned unchanged.

    Raises:
        argparse.ArgumentTypeError: no such path, or a folder, FIFO, device or socket.
    """
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"no file at {text}") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise argparse.ArgumentTypeError(f"cannot read {text}: {getattr(err, 'strerror', None) or err}") from None
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _NOT_FILES if test(mode)), "special")
        raise argparse.ArgumentTypeError(f"{text} is {what}, not a regular file")
    return text


def check_device(text: str, *, flag: str = "--device", allow_auto: bool = False) -> None:
    """Raise unless torch can use device ``text`` here (``auto`` too if ``allow_auto``): a known
    device type, and CUDA present with that many GPUs for ``cuda``/``cuda:N``."""
    import torch

    if allow_auto and text == "auto":
        return
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise InputDataError(f"{flag} {text!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputDataError(f"{flag} {text}: CUDA is not available (this torch build or machine has no "
                                 "usable GPU); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputDataError(f"{flag} {text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise InputDataError(f"{flag} {text}: Apple MPS is not available here; use --device cpu")
    elif device.type != "cpu":
        raise InputDataError(f"{flag} {text}: geodbk runs on cpu, cuda or mps devices")


def check_listen_address(address: str, port: int) -> None:
    """Raise unless this machine can listen on ``address:port`` (a name or IP address of its own,
    and the port free); warn that the dashboard has no authentication when ``address`` is reachable
    from other machines (anything but loopback)."""
    import ipaddress
    import socket
    import warnings

    if not address.strip():
        raise InputDataError("--address is empty; give a host name or IP address, e.g. 127.0.0.1")
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise InputDataError(f"--address {address!r} is not a host name or IP address here ({reason})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as err:
            raise InputDataError(f"cannot listen on {address}:{port}: {err.strerror or err}") from None
    if not ipaddress.ip_address(sockaddr[0]).is_loopback:
        warnings.warn(f"--address {address} lets other machines open the dashboard, which has no authentication; "
                      "anyone who can reach this port sees the run folders", UserWarning, stacklevel=2)


def add_split_options(p: argparse.ArgumentParser, *, keep: bool = False) -> None:
    """--split, --block-km and --seed (ingest and fit)."""
    default = "the dataset's own split" if keep else "random"
    p.add_argument("--split", choices=("random", "spatial-block", "forecast"),
                   help=f"train/val/test protocol (default: {default}). random: 8:1:1 over (tile, quarter) rows, "
                   "so a test tile's other quarters can be in training (optimistic); spatial-block: whole "
                   "blocks of --block-km held out (unseen places); forecast: test on the last quarter")
    add_block_option(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the split (and of the fits) (default 0)")


def add_block_option(p: argparse.ArgumentParser) -> None:
    """--block-km (ingest, fit and demo)."""
    from geodbk.dataset.splits import BLOCK_LADDER_M, GOAL_HELD_OUT_BLOCKS, MIN_HELD_OUT_BLOCKS, MIN_HELD_OUT_ROWS

    p.add_argument("--block-km", type=finite_float, default=None, metavar="KM",
                   help="block side of the spatial-block split, km (default: chosen from the tiles for the seed, the "
                   f"largest of {BLOCK_LADDER_M[0] / 1000:g} km down to {BLOCK_LADDER_M[-1] / 1000:g} km that holds "
                   f"out {GOAL_HELD_OUT_BLOCKS} validation and {GOAL_HELD_OUT_BLOCKS} test blocks, and "
                   f"{MIN_HELD_OUT_ROWS} rows in each; failing that, the largest that holds out {MIN_HELD_OUT_BLOCKS} "
                   f"blocks and {MIN_HELD_OUT_ROWS} rows in each)")


def check_split_options(args: argparse.Namespace) -> None:
    """A positive --block-km, where given."""
    if args.block_km is not None and not args.block_km > 0:
        raise InputDataError(f"--block-km must be positive, got {args.block_km}")


def block_metres(args: argparse.Namespace) -> float | None:
    """--block-km in metres, or None (chosen from the data)."""
    return None if args.block_km is None else 1000.0 * args.block_km


def add_map_options(p: argparse.ArgumentParser) -> None:
    """--change, --threshold/--no-threshold and --max-distance (predict and demo)."""
    p.add_argument("--change", metavar="FROM:TO",
                   help="add change layers between two quarters, e.g. 2022Q4:2023Q4: mean change, its "
                   "joint-posterior sd, P(increase) and the change of the median in Mbps (GP models)")
    level = p.add_mutually_exclusive_group()
    level.add_argument("--threshold", type=finite_float, metavar="MBPS",
                       help="p_below layer: P(tile-mean speed < MBPS) (default: the FCC benchmark, "
                       "35/3 Mbps down/up for mobile tiles, 100/20 for fixed; none for latency)")
    level.add_argument("--no-threshold", action="store_true", help="leave the p_below layer out")
    p.add_argument("--max-distance", type=finite_float, metavar="METRES",
                   help="leave cells farther than this from any training tile empty (default: no limit)")


def add_extrapolation_option(p: argparse.ArgumentParser) -> None:
    """--allow-extrapolation (predict and summarize)."""
    p.add_argument("--allow-extrapolation", action="store_true",
                   help="map an area mostly outside the model's fitted extent, or quarters before its first or "
                   "more than one after its last fitted quarter (refused otherwise; it still warns)")


def check_map_options(args: argparse.Namespace) -> None:
    """Positive --threshold and --max-distance, where given."""
    for flag in ("threshold", "max_distance"):
        value = getattr(args, flag, None)
        if value is not None and not value > 0:
            raise InputDataError(f"--{flag.replace('_', '-')} must be positive, got {value}")


def check_positive(args: argparse.Namespace, flags: Sequence[str]) -> None:
    """Integer options of ``args`` named in ``flags`` must be >= 1 where given."""
    for flag in flags:
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise InputDataError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def parse_change(text: str | None) -> tuple[Quarter, Quarter] | None:
    """``"2022Q4:2023Q4"`` -> ``(Quarter(2022, 4), Quarter(2023, 4))``, or None."""
    from geodbk.quarters import Quarter

    if text is None:
        return None
    return Quarter.parse_span(text, "--change")


def parse_quarter(text: str, flag: str = "--quarter") -> Quarter:
    """``" 2023q4"`` -> ``Quarter(2023, 4)`` (one quarter)."""
    from geodbk.quarters import Quarter

    if "," in text:
        raise InputDataError(f"{flag} takes one quarter, e.g. 2023Q4; got {text!r}")
    return Quarter.parse(text)


def parse_quarter_list(text: str, flag: str = "--quarters") -> list[Quarter]:
    """``"2023Q1, 2023q4"`` -> ``[Quarter(2023, 1), Quarter(2023, 4)]``; at least one."""
    from geodbk.quarters import Quarter

    quarters = Quarter.parse_list(text)
    if not quarters:
        raise InputDataError(f"{flag} names no quarter")
    return quarters


def threshold_option(args: argparse.Namespace) -> float | str | None:
    """The ``threshold`` argument of grids and summaries from --threshold / --no-threshold."""
    from geodbk.maps.thresholds import DEFAULT

    return None if args.no_threshold else (DEFAULT if args.threshold is None else args.threshold)


#: How a refusal to map outside a model's fitted domain says to map it anyway.
EXTRAPOLATION_LIFT = "pass --allow-extrapolation to map it anyway"


def check_domain(
    model: GeoModel, geometry: Any, quarters: Any = "latest", change: Any = None, *, allow: bool
) -> None:
    """Refuse (unless ``allow``) to apply ``model`` to an area (lon/lat shapely geometry) mostly
    outside its fitted extent, or to quarters beyond its forecast allowance
    (:meth:`geodbk.fit.geomodel.GeoModel.check_domain`, whose one-line reason is kept and told how
    to go on). When allowed, prediction itself warns."""
    from geodbk.errors import InputDataError

    if allow:
        return
    try:
        model.check_domain(geometry, quarters, change)
    except InputDataError as err:
        raise InputDataError(f"{err}; {EXTRAPOLATION_LIFT}") from None


__all__ = [
    "EXTRAPOLATION_LIFT",
    "add_block_option",
    "add_extrapolation_option",
    "add_map_options",
    "add_split_options",
    "block_metres",
    "check_device",
    "check_listen_address",
    "check_domain",
    "check_map_options",
    "check_positive",
    "check_split_options",
    "finite_float",
    "input_file",
    "parse_change",
    "parse_quarter",
    "parse_quarter_list",
    "threshold_option",
]
