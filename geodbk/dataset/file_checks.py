"""Load-time checks of a dataset file: what :meth:`geodbk.dataset.spatial_dataset.SpatialDataset.load`
refuses, in one line, so that a damaged or tampered file is never used.

:func:`dataset_fields` reads and checks the file's ``geodbk`` metadata; :func:`check_rows` checks
its rows by ingest's own rules (:mod:`geodbk.ingest.validation`), with :func:`dropped_by_ingest`
the rule for target values, which model files' target scaling is checked by too
(:meth:`geodbk.dataset.model_info.ModelInfo.check_scaling`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import shapely
import shapely.errors

from geodbk.dataset.coords import CoordinateTransform
from geodbk.dataset.splits import DEFAULT_BLOCK_M, SPLIT_PROTOCOLS, SPLITS
from geodbk.dataset.targets import TARGETS, parse_targets, target_column
from geodbk.errors import InputDataError
from geodbk.ingest.regions import Region
from geodbk.ingest.urbanrural import RURAL, URBAN
from geodbk.ingest.validation import KEY_COLUMNS, check_duplicates, invalid_rows
from geodbk.quarters import Quarter

#: Geometry types a region may have.
POLYGONAL = ("Polygon", "MultiPolygon")


def dataset_fields(path: Path, raw: bytes) -> dict[str, Any]:
    """The :class:`~geodbk.dataset.spatial_dataset.SpatialDataset` fields other than the frame,
    from a file's ``geodbk`` metadata (JSON), checked: known targets in their units, a non-empty
    polygonal region, a known split protocol, a positive block side and a non-negative buffer.

    Raises:
        InputDataError: in one line, for metadata that is not that (a tampered or damaged file).
    """
    try:
        meta = json.loads(raw)
        region = meta["region"]
        fields: dict[str, Any] = {
            "transform": CoordinateTransform.from_dict(meta["transform"]),
            "region": Region(str(region["name"]), shapely.from_wkb(region["wkb_hex"]), region["code"]),
            "target": str(meta["target"]),
            "units": str(meta["units"]),
            "urban_route": str(meta["urban_route"]),
            "dropped": {str(reason): int(count) for reason, count in meta["dropped"].items()},
            "seed": int(meta["seed"]),
            "buffer_deg": float(meta["buffer_deg"]),
            "split_protocol": str(meta.get("split_protocol", "random")),
            "block_m": float(meta.get("block_m", DEFAULT_BLOCK_M)),
            "block_choice": str(meta.get("block_choice", "given")),
            "extra_targets": tuple(str(t) for t in meta.get("extra_targets", ())),
        }
        parse_targets((fields["target"], *fields["extra_targets"]))
    except (ValueError, KeyError, TypeError, AttributeError, shapely.errors.ShapelyError) as err:
        reason = f"no {err.args[0]!r}" if isinstance(err, KeyError) else str(err)
        raise InputDataError(f"dataset file {path} has damaged geodbk metadata ({reason}); write it again with "
                             "geodbk ingest") from None
    shape, block_m, buffer_deg = fields["region"].geometry, fields["block_m"], fields["buffer_deg"]
    problems = [
        (fields["units"] != TARGETS[fields["target"]][2], f"units {fields['units']!r} for {fields['target']}"),
        (shape is None or shape.is_empty or shape.geom_type not in POLYGONAL, "a region that is not a polygon"),
        (fields["split_protocol"] not in SPLIT_PROTOCOLS, f"split protocol {fields['split_protocol']!r}"),
        (not (math.isfinite(block_m) and block_m > 0), f"block side {block_m!r} m"),
        (not (math.isfinite(buffer_deg) and buffer_deg >= 0), f"region buffer {buffer_deg!r} degrees"),
    ]
    for found, problem in problems:
        if found:
            raise InputDataError(f"dataset file {path} has damaged geodbk metadata ({problem}); write it again with "
                                 "geodbk ingest")
    return fields


def dropped_by_ingest(
    y: Mapping[str, np.ndarray], tests: np.ndarray | None = None, devices: np.ndarray | None = None
) -> np.ndarray:
    """``(n,)`` bool: rows whose targets ingest would have dropped, by its own rule
    (:func:`geodbk.ingest.validation.invalid_rows`, and no missing or non-positive value).

    Args:
        y: ``{target: (n,) log10 values}``; each is taken back to its Ookla column's units
            (``10**y`` times the divisor of :data:`geodbk.dataset.targets.TARGETS`).
        tests, devices: ``(n,)`` counts of the rows; ``None``: not checked.
    """
    n = len(next(iter(y.values())))
    values = {column: np.full(n, np.nan) for column, _, _ in TARGETS.values()}
    values["tests"] = np.ones(n) if tests is None else np.asarray(tests, dtype=np.float64)
    values["devices"] = np.full(n, np.nan) if devices is None else np.asarray(devices, dtype=np.float64)
    dropped = np.zeros(n, dtype=bool)
    for target, logs in y.items():
        column, divisor, _ = TARGETS[target]
        with np.errstate(over="ignore", invalid="ignore"):
            values[column] = 10.0 ** np.asarray(logs, dtype=np.float64) * divisor
            dropped |= ~(values[column] > 0)  # NaN (missing) or 0 (an underflow of y = -inf or -1e300)
    return dropped | np.logical_or.reduce(list(invalid_rows(values).values()))


def check_rows(frame: pd.DataFrame, targets: Sequence[str]) -> None:
    """Refuse rows that ``geodbk ingest`` would not have written, in one line, by ingest's own
    rules: two rows of one (quadkey, year, quarter, service)
    (:func:`geodbk.ingest.validation.check_duplicates`), a target or count ingest drops
    (:func:`dropped_by_ingest`), an ``urban_rural`` label other than ingest's two, or a
    ``split`` label other than :data:`geodbk.dataset.splits.SPLITS`.

    Args:
        frame: the dataset's rows (:data:`geodbk.dataset.spatial_dataset.COLUMNS`).
        targets: its targets, the first in ``value``/``y`` (``("download", "upload")``).

    Raises:
        InputDataError: naming the first problem found.
    """
    for column, labels in (("split", SPLITS), ("urban_rural", (URBAN, RURAL))):
        unknown = sorted(set(frame[column].astype(str).unique()) - set(labels))
        if unknown:
            raise InputDataError(f"the {column} column holds {', '.join(map(repr, unknown[:3]))}, not only "
                                 f"{', '.join(labels)}")
    check_duplicates(frame[list(KEY_COLUMNS)])
    columns = {t: target_column(targets[0], t) for t in targets}
    try:
        y = {t: frame[column].to_numpy(np.float64) for t, column in columns.items()}
        tests, devices = (frame[column].to_numpy(np.float64) for column in ("tests", "devices"))
    except (TypeError, ValueError) as err:
        raise InputDataError(f"a target or count column is not numeric ({err})") from None
    bad = np.flatnonzero(dropped_by_ingest(y, tests, devices))
    if len(bad):
        row = frame.iloc[bad[0]]
        shown = ", ".join(f"{column} {row[column]}" for column in (*columns.values(), "tests", "devices"))
        raise InputDataError(f"{len(bad):,} row(s) hold a target or count that ingest drops, e.g. quadkey "
                             f"{row['quadkey']} in {Quarter(int(row['year']), int(row['quarter']))} ({shown})")


__all__ = ["POLYGONAL", "check_rows", "dataset_fields", "dropped_by_ingest"]
