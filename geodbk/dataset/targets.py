"""What a dataset row measures: the targets (download, upload, latency), their Ookla columns and
units, and the columns that hold them in a dataset of several targets."""

from __future__ import annotations

from collections.abc import Sequence

from geodbk.errors import InputDataError

#: target name -> (source column, divisor to the unit, unit)
TARGETS: dict[str, tuple[str, float, str]] = {
    "download": ("avg_d_kbps", 1000.0, "Mbps"),
    "upload": ("avg_u_kbps", 1000.0, "Mbps"),
    "latency": ("avg_lat_ms", 1.0, "ms"),
}


def target_column(first: str, target: str, column: str = "y") -> str:
    """The column of ``target``'s ``column`` (``"y"``, log10, or ``"value"``) in a frame whose first
    target is ``first``: ``y`` for the first, ``y_<target>`` for the others."""
    return column if target == first else f"{column}_{target}"


def parse_targets(target: str | Sequence[str]) -> tuple[str, ...]:
    """``"download,upload"`` or ``["download", "upload"]`` -> ``("download", "upload")``: known,
    distinct targets of one unit (speeds or latency; a dataset's rows hold one unit).

    Raises:
        InputDataError: otherwise, in one line.
    """
    names = [t.strip() for t in target.split(",")] if isinstance(target, str) else [str(t) for t in target]
    unknown = [t for t in names if t not in TARGETS]
    if not names or unknown:
        raise InputDataError(f"target must be one or more of {sorted(TARGETS)} separated by commas, got {target!r}")
    if len(set(names)) != len(names):
        raise InputDataError(f"target names a target twice: {target!r}")
    if len({TARGETS[t][2] for t in names}) > 1:
        raise InputDataError(f"targets {', '.join(names)} have different units; ingest them as separate datasets")
    return tuple(names)


__all__ = ["TARGETS", "parse_targets", "target_column"]
