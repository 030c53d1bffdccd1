"""Tables the viewer shows: the polygon area summary and a run's test metrics."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

#: Columns of the summary table, in order (``{u}`` is the data unit in lower case).
SUMMARY_COLUMNS = ("median_{u}", "lower_{u}", "upper_{u}", "share_below", "sd_log10", "cells", "observed_tiles")
#: Polygon columns tried, in order, as the table's name column.
NAME_COLUMNS = ("NAME", "name", "NAMELSAD", "Name", "GEOID", "geoid", "id")


def name_column(frame: pd.DataFrame) -> str | None:
    """The polygons' name column, if they have one of :data:`NAME_COLUMNS`."""
    return next((c for c in NAME_COLUMNS if c in frame.columns), None)


def summary_table(summary: pd.DataFrame, units: str) -> pd.DataFrame:
    """The :func:`geodbk.maps.summaries.summarize_polygons` output as shown: one row per polygon,
    its name, the area's median and 95% interval in data units (``units``, e.g. ``"Mbps"``),
    the share below the threshold and the cell counts, sorted from the slowest median up."""
    key = units.lower()
    columns = [c.format(u=key) for c in SUMMARY_COLUMNS]
    name = name_column(summary)
    table = pd.DataFrame(summary[[c for c in columns if c in summary.columns]])
    if name is not None:
        table.insert(0, name, summary[name].astype(str))
    table = table.sort_values(f"median_{key}") if f"median_{key}" in table else table
    return table.round({f"median_{key}": 1, f"lower_{key}": 1, f"upper_{key}": 1, "share_below": 3, "sd_log10": 3})


def metrics_tables(path: Path, kind: str, target: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(rows of model kind, all rows)`` of a run's ``metrics.csv``, indexed by
    ``(model, group)`` (``(model, target, group)`` where the file has a ``target`` column; the
    kind's rows then of ``target`` alone, when given) and rounded to 3 decimals (log10 units)."""
    table = pd.read_csv(path)
    keys = ["model", "target", "group"] if "target" in table else ["model", "group"]
    table = table.set_index(keys).round(3)
    if kind not in table.index.get_level_values(0):
        return table.iloc[:0], table
    mine = table.loc[[kind]]
    if target is not None and "target" in keys:
        mine = mine[mine.index.get_level_values("target") == target]
    return mine, table
