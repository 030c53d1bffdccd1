"""The spatial regression dataset: one row per (tile, quarter).

``build_dataset`` runs the ingest chain (read tiles -> select service and quarters -> clip
to the region, for files in one streaming pass of :func:`geodbk.ingest.scan.scan_tiles` ->
choose the target -> tag urban/rural -> split 8:1:1 by a protocol of :mod:`geodbk.dataset.splits`)
and returns a :class:`SpatialDataset`, which saves to and loads from one GeoParquet file with
all of its metadata in the file's key-value metadata (key ``geodbk``); loading checks the metadata
and the rows by ingest's rules, so a damaged or tampered file is refused in one line. What a model
sees of a row is decided by :class:`geodbk.dataset.inputs.InputSpace`.

Size: the class and its builder, about 580 lines together: the builder writes the columns (one
target's or several's) that the class's views, save and load read back. The checks that load
makes of a file are in :mod:`geodbk.dataset.file_checks`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import shapely
import shapely.errors

from geodbk import paths
from geodbk.dataset.coords import CoordinateTransform, ProjectedTransform
from geodbk.dataset.file_checks import check_rows, dataset_fields
from geodbk.dataset.splits import (
    DEFAULT_BLOCK_M,
    SPLITS,
    assign_split,
    block_ids,
    blocks_per_split,
    check_usable_split,
    choose_block_m,
    few_validation_rows_note,
    noisy_test_note,
    split_shares,
)
from geodbk.dataset.targets import TARGETS, parse_targets, target_column
from geodbk.errors import InputDataError, RegionError
from geodbk.fileio import atomic_path
from geodbk.ingest.names import SERVICES
from geodbk.ingest.ookla import as_tiles
from geodbk.ingest.quadkey import quadkey_centres
from geodbk.ingest.regions import DEFAULT_BUFFER_DEG, Region, clip_to_region, load_region
from geodbk.ingest.scan import check_selection, scan_tiles, select_rows
from geodbk.ingest.urbanrural import ROUTE_COUNTY_SHARE, tag_urban_rural
from geodbk.quarters import Quarter

#: The columns of every dataset file (:func:`build_dataset`; a further target adds ``value_<target>``
#: and ``y_<target>``), besides the tile polygons in ``geometry``.
COLUMNS = ("quadkey", "year", "quarter", "service", "tests", "devices", "lon", "lat", "x1", "x2", "value", "y",
           "urban_rural", "split")
_METADATA_KEY = b"geodbk"
#: Rows per batch when a dataset without its polygons is saved over the file it came from.
SAVE_BATCH_ROWS = 65536
_FORMAT_VERSION = 1
#: How a dataset's block side came about: chosen from the data for its seed, or given by the user.
BLOCK_CHOICES = ("chosen", "given")


@dataclass
class SpatialDataset:
    """A tile dataset ready for a model.

    Attributes:
        frame: one row per (tile, quarter) with columns ``quadkey, year, quarter, service,
            tests, devices, lon, lat`` (tile centre, degrees), ``x1, x2`` (scaled to [-1, 1]
            by the region box: the paper protocol's inputs),
            ``value`` (target in ``units``), ``y`` (log10 value), ``urban_rural``, ``split``
            and ``geometry`` (tile polygon, EPSG:4326).
        transform: lon/lat <-> ``x1, x2`` (the region's bounding box).
        region: the study region.
        target: ``"download"``, ``"upload"`` or ``"latency"``.
        units: ``"Mbps"`` or ``"ms"``.
        urban_route: the urban/rural route that tagged the rows.
        dropped: rows dropped on the way, by reason.
        seed: seed of the train/val/test assignment.
        buffer_deg: region buffer used when clipping, degrees.
        split_protocol: how rows were split (:data:`geodbk.dataset.splits.SPLIT_PROTOCOLS`).
        block_m: block side of the ``spatial-block`` protocol, metres.
        block_choice: ``"chosen"`` (by :func:`geodbk.dataset.splits.choose_block_m` for the seed; a
            new seed chooses again) or ``"given"`` (kept by :meth:`with_split`); files written
            before the choice read as ``"given"``.
        extra_targets: further targets of the same rows (``("upload",)`` beside download), in
            columns ``value_<target>`` and ``y_<target>``; see :meth:`for_target`.
    """

    frame: gpd.GeoDataFrame
    transform: CoordinateTransform
    region: Region
    target: str
    units: str
    urban_route: str
    dropped: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    buffer_deg: float = DEFAULT_BUFFER_DEG
    split_protocol: str = "random"
    block_m: float = DEFAULT_BLOCK_M
    block_choice: str = "given"
    extra_targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.block_choice not in BLOCK_CHOICES:
            raise InputDataError(f"block_choice must be one of {', '.join(BLOCK_CHOICES)}, got {self.block_choice!r}")

    @property
    def targets(self) -> tuple[str, ...]:
        """Every target of the rows, the first in ``value``/``y``: ``("download", "upload")``."""
        return (self.target, *self.extra_targets)

    def for_target(self, target: str) -> SpatialDataset:
        """The one-target dataset of ``target`` (its values in ``value``/``y``), same rows and split.

        Raises:
            InputDataError: for a target the dataset does not hold.
        """
        if target == self.target and not self.extra_targets:
            return self
        if target not in self.targets:
            raise InputDataError(f"the dataset holds {', '.join(self.targets)}, not {target!r}")
        columns = {column: target_column(self.target, target, column) for column in ("value", "y")}
        frame = self.frame.drop(columns=[target_column(self.target, t, c) for t in self.extra_targets for c in columns])
        for column, source in columns.items():
            frame[column] = self.frame[source]
        return replace(self, frame=frame, target=target, units=TARGETS[target][2], extra_targets=())

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def quarters(self) -> list[Quarter]:
        """Quarters present, sorted."""
        pairs = self.frame[["year", "quarter"]].drop_duplicates().sort_values(["year", "quarter"])
        return [Quarter(int(y), int(q)) for y, q in pairs.itertuples(index=False)]

    def subset(self, split: str) -> gpd.GeoDataFrame:
        """Rows of one split (``"train"``, ``"val"``, ``"test"``) or ``"all"``."""
        if split == "all":
            return self.frame
        if split not in SPLITS:
            raise InputDataError(f"split must be one of {SPLITS} or 'all', got {split!r}")
        return self.frame[self.frame["split"] == split]

    def with_split(self, protocol: str, *, seed: int | None = None, block_m: float | None = None) -> SpatialDataset:
        """A copy with rows re-split by ``protocol`` (``random``, ``spatial-block``, ``forecast``).

        ``spatial-block`` holds out whole squares of ``block_m`` metres in an equal-area
        projection centred on the tiles; ``block_m=None`` keeps a side the user gave
        (:attr:`block_choice` ``"given"``) and otherwise chooses it again for ``seed``
        (:func:`geodbk.dataset.splits.choose_block_m`). ``forecast`` tests on the last quarter.
        """
        seed = self.seed if seed is None else seed
        if block_m is None and self.block_choice == "given":
            block_m = self.block_m
        frame = self.frame.copy()
        frame["split"], side = _split_rows(
            frame[["lon", "lat"]].to_numpy(np.float64), frame["year"], frame["quarter"], protocol, seed, block_m
        )
        return replace(self, frame=frame, seed=seed, split_protocol=protocol, block_m=side,
                       block_choice="chosen" if block_m is None else "given")

    def held_out_blocks(self) -> dict[str, int]:
        """Blocks of side :attr:`block_m` that each split's rows fall in, ``{"train": .., "val": ..,
        "test": ..}``, on the projection the split was made in (:func:`_split_metres`); under the
        spatial-block protocol each block belongs to one split."""
        ids = block_ids(_split_metres(self.frame[["lon", "lat"]].to_numpy(np.float64)), self.block_m)
        return blocks_per_split(self.frame["split"].to_numpy(), ids)

    def block_line(self) -> str | None:
        """``"spatial-block split: 2.5 km squares chosen for 4,812 rows (val 9 blocks, test 11 blocks)"``;
        None under another protocol."""
        if self.split_protocol != "spatial-block":
            return None
        blocks = self.held_out_blocks()
        return (f"spatial-block split: {self.block_m / 1000:g} km squares {self.block_choice} for {len(self):,} rows "
                f"(val {blocks['val']} blocks, test {blocks['test']} blocks)")

    def check_split(self) -> None:
        """Refuse a split whose val or test set is too small to use, in one line; warn where a
        chosen side holds out few blocks (:func:`geodbk.dataset.splits.check_usable_split`)."""
        spatial = self.split_protocol == "spatial-block"
        check_usable_split(self.frame["split"].to_numpy(), self.split_protocol,
                           blocks=self.held_out_blocks() if spatial else None, block_m=self.block_m,
                           chosen=self.block_choice == "chosen")

    def test_note(self) -> str | None:
        """One line saying that the test metrics are noisy when the test set is small, else None
        (:func:`geodbk.dataset.splits.noisy_test_note`)."""
        blocks = self.held_out_blocks()["test"] if self.split_protocol == "spatial-block" else None
        return noisy_test_note(int((self.frame["split"] == "test").sum()), blocks)

    def validation_note(self) -> str | None:
        """One line saying that what a fit chooses on the validation rows rests on few of them,
        else None (:func:`geodbk.dataset.splits.few_validation_rows_note`)."""
        return few_validation_rows_note(int((self.frame["split"] == "val").sum()))

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``X`` (n, 2) region-box inputs ``x1, x2`` (the paper protocol), ``y`` (n,) log10
        target, ``urban_rural`` (n,) str. Map models build their inputs with
        :class:`geodbk.dataset.inputs.InputSpace` instead."""
        rows = self.subset(split)
        X = rows[["x1", "x2"]].to_numpy(dtype=np.float64)
        y = rows["y"].to_numpy(dtype=np.float64)
        return X, y, rows["urban_rural"].to_numpy(dtype=object).astype(str)

    def summary(self) -> str:
        """Printable overview: rows per quarter and split, urban/rural per split, target stats."""
        f = self.frame
        shares = split_shares(self.split_protocol)
        if self.split_protocol == "forecast":
            shares = f"test {self.quarters[-1]}, earlier rows {shares}"
        lines = [
            f"SpatialDataset: {self.region.name}, {' and '.join(self.targets)} ({self.units}), "
            f"y = log10({self.target})" + ("".join(f", y_{t} = log10({t})" for t in self.targets[1:])),
            f"rows: {len(f):,} in {len(self.quarters)} quarter(s) "
            f"{self.quarters[0]}..{self.quarters[-1]}; {self.split_protocol} split {shares} with seed {self.seed}",
            *filter(None, [self.block_line()]),
            "region box (W S E N): "
            + " ".join(
                f"{v:.6f}"
                for v in (self.transform.west, self.transform.south, self.transform.east, self.transform.north)
            ),
            f"urban/rural route: {self.urban_route}",
            "dropped: " + (", ".join(f"{k} {v:,}" for k, v in self.dropped.items()) or "none"),
        ]
        per_quarter = pd.crosstab([f["year"], f["quarter"]], f["split"]).reindex(columns=list(SPLITS), fill_value=0)
        per_quarter.index = [str(Quarter(int(y), int(q))) for y, q in per_quarter.index]
        per_quarter["total"] = per_quarter.sum(axis=1)
        per_quarter.loc["total"] = per_quarter.sum()
        per_quarter.index.name, per_quarter.columns.name = "quarter", None
        lines += ["", "rows per quarter and split:", per_quarter.to_string()]
        ur = pd.crosstab(f["split"], f["urban_rural"]).reindex(index=list(SPLITS), fill_value=0)
        ur = ur.reindex(columns=["urban", "rural"], fill_value=0)
        ur["urban %"] = (100.0 * ur["urban"] / ur.sum(axis=1).where(lambda s: s > 0)).round(1)
        ur.index.name, ur.columns.name = "split", None
        lines += ["", "urban/rural rows per split:", ur.to_string()]
        hint = (" (the county-share route tags whole counties; --urban-areas with the Census 2020 Urban "
                "Area polygons tags each tile)" if self.urban_route.startswith(ROUTE_COUNTY_SHARE) else "")
        for kind in ("urban", "rural"):
            if len(f) and ur[kind].sum() == 0:
                lines.append(f"no {kind} rows: the {kind} metrics will be empty{hint}")
                continue
            held = [split for split in ("val", "test")
                    if ur.loc[split, ["urban", "rural"]].sum() > 0 and ur.loc[split, kind] == 0]
            if held:
                lines.append(f"no {kind} rows in {' or '.join(held)}: the {kind} {'/'.join(held)} metrics will "
                             f"be empty ({ur.loc['train', kind]:,} {kind} rows are in train)")
        for target in self.targets:
            lines += ["", *self.for_target(target)._target_stats()]
        return "\n".join(lines)

    def _target_stats(self) -> list[str]:
        """The summary's table of the target's value and y per split (two lines)."""
        groups = self.frame.groupby("split", observed=True)
        stats = pd.DataFrame(
            {
                "n": groups.size(),
                f"mean {self.units}": groups["value"].mean(),
                f"median {self.units}": groups["value"].median(),
                f"min {self.units}": groups["value"].min(),
                f"max {self.units}": groups["value"].max(),
                "mean y": groups["y"].mean(),
                "sd y": groups["y"].std(),
                "min y": groups["y"].min(),
                "max y": groups["y"].max(),
            }
        ).reindex(list(SPLITS))
        stats.index.name = "split"
        return [f"target {self.target} ({self.units}; y = log10):", stats.round(3).to_string()]

    def metadata(self) -> dict:
        """Everything but the frame, as JSON-able values (stored with the file)."""
        return {
            "format_version": _FORMAT_VERSION,
            "transform": self.transform.to_dict(),
            "region": {
                "name": self.region.name,
                "code": self.region.code,
                "wkb_hex": shapely.to_wkb(self.region.geometry, hex=True),
            },
            "target": self.target,
            "units": self.units,
            "urban_route": self.urban_route,
            "dropped": {k: int(v) for k, v in self.dropped.items()},
            "seed": int(self.seed),
            "buffer_deg": float(self.buffer_deg),
            "split_protocol": self.split_protocol,
            "block_m": float(self.block_m),
            "block_choice": self.block_choice,
            "extra_targets": list(self.extra_targets),
        }

    def save(self, path: str | Path, *, geometry_from: str | Path | None = None) -> Path:
        """Write GeoParquet with the metadata; atomic (temp file in the same folder, then rename).

        A dataset loaded without its tile polygons (``load(..., geometry=False)``) takes them
        from ``geometry_from``, the file it was loaded from: that file is copied batch by batch
        with this dataset's columns other than the geometry, so memory stays flat.
        """
        path = Path(path)
        if "geometry" not in self.frame.columns:
            if geometry_from is None:
                raise InputDataError("this dataset was loaded without its tile polygons; give geometry_from")
            return self._save_over(Path(geometry_from), path)
        buffer = io.BytesIO()
        self.frame.to_parquet(buffer, index=False)
        table = pq.read_table(io.BytesIO(buffer.getvalue()))
        meta = dict(table.schema.metadata or {})
        meta[_METADATA_KEY] = json.dumps(self.metadata()).encode()
        table = table.replace_schema_metadata(meta)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
        return path

    def _save_over(self, source: Path, path: Path) -> Path:
        """:meth:`save` of a geometry-free dataset: ``source``'s batches (its geometry column) with
        this frame's other columns, in the same row order, and this dataset's metadata."""
        reader = pq.ParquetFile(source)
        if reader.metadata.num_rows != len(self.frame):
            raise InputDataError(f"{source} has {reader.metadata.num_rows} rows, the dataset {len(self.frame)}")
        meta = dict(reader.schema_arrow.metadata or {})
        meta[_METADATA_KEY] = json.dumps(self.metadata()).encode()
        schema = reader.schema_arrow.with_metadata(meta)
        start = 0
        with atomic_path(path) as tmp:
            writer = None
            try:
                for batch in reader.iter_batches(batch_size=SAVE_BATCH_ROWS, columns=["geometry"]):
                    rows = self.frame.iloc[start : start + batch.num_rows].reset_index(drop=True)
                    table = pa.Table.from_pandas(rows, preserve_index=False).append_column(
                        "geometry", batch.column("geometry"))
                    table = table.select(schema.names).cast(schema)  # the source's column order and types
                    if writer is None:
                        writer = pq.ParquetWriter(tmp, schema)
                    writer.write_table(table)
                    start += batch.num_rows
            finally:
                if writer is not None:
                    writer.close()
        return path

    def check_rows(self) -> None:
        """Refuse rows that ``geodbk ingest`` would not have written
        (:func:`geodbk.dataset.file_checks.check_rows`).

        Raises:
            InputDataError: naming the first problem found.
        """
        check_rows(self.frame, self.targets)

    @classmethod
    def load(cls, path: str | Path, *, geometry: bool = True) -> SpatialDataset:
        """Read a file written by :meth:`save`. ``geometry=False`` leaves out the tile polygons
        (about 1.6 KB a row in memory as shapely objects): the frame is then a plain DataFrame,
        enough to fit and score a model, and :meth:`save` takes the polygons from ``path``.

        Raises:
            InputDataError: in one line, for a file that is not a readable geodbk dataset, whose
                metadata is damaged (:func:`~geodbk.dataset.file_checks.dataset_fields`), that lacks a column of
                :data:`COLUMNS` or the tile polygons, or whose rows fail :meth:`check_rows`.
        """
        path = Path(path)
        if path.exists() and not path.is_file():  # opening a FIFO would block until a writer comes
            raise InputDataError(f"{path} is not a regular file (a folder, FIFO or device); give a dataset file")
        try:
            schema = pq.read_schema(path)
        except Exception as err:  # pyarrow raises several types for bad files
            raise InputDataError(f"cannot read dataset file {path}: {err}") from err
        schema_meta = schema.metadata or {}
        if _METADATA_KEY not in schema_meta:
            raise InputDataError(f"{path} is not a geodbk dataset (no '{_METADATA_KEY.decode()}' metadata)")
        fields = dataset_fields(path, schema_meta[_METADATA_KEY])
        targets = (fields["target"], *fields["extra_targets"])
        wanted = [*COLUMNS, *(target_column(targets[0], t, c) for t in targets[1:] for c in ("value", "y")), "geometry"]
        missing = [name for name in wanted if name not in schema.names]
        if missing:
            raise InputDataError(f"dataset file {path} lacks the column(s) {', '.join(missing)}; write it again with "
                                 "geodbk ingest")
        try:
            if geometry:
                frame = gpd.read_parquet(path)
            else:
                frame = pq.read_table(path, columns=[name for name in schema.names if name != "geometry"]).to_pandas()
        except Exception as err:  # pyarrow and geopandas raise several types for bad files
            raise InputDataError(f"cannot read dataset file {path}: {err}") from err
        dataset = cls(frame=frame, **fields)
        try:
            dataset.check_rows()
        except InputDataError as err:
            raise InputDataError(f"dataset file {path}: {err}") from None
        return dataset


def parse_quarters(
    quarters: str | Sequence[Quarter | str | tuple[int, int]] | None,
) -> list[tuple[int, int]] | None:
    """``"2023Q1,2023Q4"`` / ``["2023Q1", Quarter(2023, 3), (2023, 4)]`` -> ``[(2023, 1), (2023, 3), (2023, 4)]``
    (the ``(year, quarter)`` pairs that ingest selects by); None stays None."""
    if quarters is None:
        return None
    if isinstance(quarters, str):
        parsed = Quarter.parse_list(quarters)
    else:
        parsed = [Quarter(int(item[0]), int(item[1])) if isinstance(item, tuple) else Quarter.parse(item)
                  for item in quarters]
    if not parsed:
        raise InputDataError("no quarters given")
    return [(quarter.year, quarter.number) for quarter in parsed]


def _split_metres(lonlat: np.ndarray) -> np.ndarray:
    """``(n, 2)`` metres of rows at ``lonlat`` ``(n, 2)`` degrees in the equal-area projection
    centred on them: where spatial blocks are drawn."""
    return ProjectedTransform.from_lonlat(lonlat).to_metres(lonlat)


def _split_rows(
    lonlat: np.ndarray, year: np.ndarray, quarter: np.ndarray, protocol: str, seed: int, block_m: float | None
) -> tuple[np.ndarray, float]:
    """Split labels (n,) of rows at ``lonlat`` (n, 2) degrees in (year, quarter) by ``protocol``, and the
    block side in metres: ``block_m``, or where None and the protocol is spatial-block the side chosen
    for ``seed`` (:data:`DEFAULT_BLOCK_M` under the other protocols)."""
    xy_m = _split_metres(lonlat) if protocol == "spatial-block" else None
    if block_m is None:
        block_m = DEFAULT_BLOCK_M if xy_m is None else choose_block_m(xy_m, seed)
    period = Quarter.index_of(year, quarter)
    labels = assign_split(protocol, n=len(lonlat), xy_m=xy_m, period=period, seed=seed, block_m=block_m)
    return np.asarray(labels).astype(str), float(block_m)


def _check_keys(tiles: pd.DataFrame) -> None:
    required = ["quadkey", "year", "quarter"]
    for col in required:
        if col not in tiles.columns:
            raise InputDataError(f"tiles are missing the column {col!r}")
        n_null = int(tiles[col].isna().sum())
        if n_null:
            raise InputDataError(f"tiles: {n_null} row(s) have no {col} (a required key column)")


def build_dataset(
    tiles: gpd.GeoDataFrame | str | Path | Sequence[str | Path],
    region: str | Path | Region,
    *,
    target: str | Sequence[str] = "download",
    quarters: str | Sequence[Quarter | str | tuple[int, int]] | None = None,
    seed: int = 0,
    split: str = "random",
    block_m: float | None = None,
    urban_areas: str | Path | gpd.GeoDataFrame | None = None,
    urban_threshold: float = 0.5,
    service: str | None = None,
    buffer_deg: float = DEFAULT_BUFFER_DEG,
    cache_dir: str | Path | None = None,
) -> SpatialDataset:
    """Build a :class:`SpatialDataset` from Ookla tiles.

    Args:
        tiles: normalised tiles (:func:`geodbk.ingest.ookla.read_tiles`), or what it reads:
            files and URLs are streamed (:func:`geodbk.ingest.scan.scan_tiles`), so that only
            the region's rows are held in memory.
        region: state name / USPS / FIPS, polygon file, or :class:`Region`.
        target: ``"download"`` (Mbps), ``"upload"`` (Mbps) or ``"latency"`` (ms), or several of
            one unit (``"download,upload"``): the first in ``value``/``y``, the others in
            ``value_<target>``/``y_<target>`` (:attr:`SpatialDataset.extra_targets`); a row is
            kept when every target has a positive value.
        quarters: keep only these, e.g. ``"2023Q1,2023Q4"``; ``None`` keeps all.
        seed: seed of the 8:1:1 train/val/test assignment.
        split: ``"random"`` (rows; a tile's other quarters can land in train), ``"spatial-block"``
            (whole ``block_m`` squares held out) or ``"forecast"`` (the last quarter is the test set).
        block_m: block side of the spatial-block split, metres; ``None`` chooses it from the rows
            for ``seed`` (:func:`geodbk.dataset.splits.choose_block_m`), and again when
            :meth:`SpatialDataset.with_split` re-splits with another seed.
        urban_areas: Census Urban Area polygons; ``None`` uses the county urban share.
        urban_threshold: county route: urban when the county urban share >= this.
        service: keep only ``"mobile"`` or ``"fixed"`` tiles (``None``: all; it is an error
            if the tiles then mix both).
        buffer_deg: grow the region by this many degrees before clipping.
        cache_dir: download cache for URLs.

    Rows whose target is zero, negative or missing are dropped and counted in
    ``dropped`` (as are rows outside the region and the truncated quarter). Tile centres
    (lon, lat) come from the quadkeys, so a row without a quadkey, year or quarter is an
    error, not a drop.

    Raises:
        InputDataError: unknown target, missing columns or key values, no rows for a quarter.
        RegionError: unknown region or nothing left after clipping.
    """
    targets = parse_targets(target)
    target = targets[0]
    column, divisor, units = TARGETS[target]
    region = load_region(region)
    wanted = parse_quarters(quarters)
    if isinstance(tiles, pd.DataFrame):
        _check_keys(tiles)
        tiles = as_tiles(tiles, service=service)
        chosen, services, present = select_rows(tiles, service, wanted)
        check_selection(services, present, service, wanted)
        clipped = clip_to_region(tiles[chosen], region, buffer_deg=buffer_deg)
        dropped = {**tiles.attrs.get("dropped", {}), "outside_region": clipped.attrs["dropped"]["outside_region"]}
    else:  # files or URLs: streamed, keeping only the region's rows (geodbk.ingest.scan)
        clipped = scan_tiles(
            tiles, region, buffer_deg=buffer_deg, service=service, quarters=wanted, cache_dir=cache_dir
        )
        dropped = dict(clipped.attrs["dropped"])

    raw = np.column_stack([clipped[TARGETS[t][0]].to_numpy(dtype=np.float64) for t in targets])
    missing = np.isnan(raw).any(1)
    non_positive = ~missing & (raw <= 0).any(1)
    dropped["missing_value"] = int(missing.sum())
    dropped["zero_value"] = int(non_positive.sum())
    kept = clipped[~(missing | non_positive)]
    if len(kept) == 0:
        raise InputDataError(f"no tiles with a positive {' and '.join(targets)} value in {region.name}")

    kept = kept.sort_values(["year", "quarter", "quadkey"], kind="stable").reset_index(drop=True)
    tagged, route = tag_urban_rural(kept, urban_areas=urban_areas, threshold=urban_threshold, cache_dir=cache_dir)

    transform = CoordinateTransform.from_bounds(region.buffered(buffer_deg).bounds)
    codes, uniques = pd.factorize(tagged["quadkey"])
    lonlat = quadkey_centres(np.asarray(uniques, dtype=object))[codes]
    xy = transform.to_unit(lonlat)
    value = tagged[column].to_numpy(dtype=np.float64) / divisor
    labels, side = _split_rows(lonlat, tagged["year"], tagged["quarter"], split, seed, block_m)
    frame = gpd.GeoDataFrame(
        {
            "quadkey": tagged["quadkey"].to_numpy(),
            "year": tagged["year"].to_numpy(dtype=np.int16),
            "quarter": tagged["quarter"].to_numpy(dtype=np.int16),
            "service": tagged["service"].to_numpy(),
            "tests": tagged["tests"].to_numpy(dtype=np.int64),
            "devices": tagged["devices"].to_numpy(dtype=np.int64),
            "lon": lonlat[:, 0],
            "lat": lonlat[:, 1],
            "x1": xy[:, 0],
            "x2": xy[:, 1],
            "value": value,
            "y": np.log10(value),
            "urban_rural": tagged["urban_rural"].to_numpy(),
            "split": labels,
        },
        geometry=tagged.geometry.to_numpy(),
        crs=4326,
    )
    for extra in targets[1:]:
        extra_value = tagged[TARGETS[extra][0]].to_numpy(dtype=np.float64) / TARGETS[extra][1]
        frame[target_column(target, extra, "value")] = extra_value
        frame[target_column(target, extra)] = np.log10(extra_value)
    for col in ("quadkey", "service", "urban_rural", "split"):
        frame[col] = frame[col].astype("str")
    return SpatialDataset(
        frame=frame,
        transform=transform,
        region=region,
        target=target,
        units=units,
        urban_route=route,
        dropped=dropped,
        seed=seed,
        buffer_deg=buffer_deg,
        split_protocol=split,
        block_m=side,
        block_choice="chosen" if block_m is None else "given",
        extra_targets=targets[1:],
    )


#: Shipped sample tiles by (USPS code, service): the mobile sample and its fixed density layer.
SAMPLE_TILES = {("PR", "mobile"): paths.PUERTO_RICO_MOBILE, ("HI", "mobile"): paths.HAWAII_MOBILE,
                ("PR", "fixed"): paths.PUERTO_RICO_FIXED, ("HI", "fixed"): paths.HAWAII_FIXED}


def sample_tiles_path(region: str | Region, service: str = "mobile") -> Path:
    """The shipped ``service`` (``"mobile"`` or ``"fixed"``) tile file of Puerto Rico or Hawaii."""
    if service not in SERVICES:
        raise InputDataError(f"service must be one of {SERVICES}, got {service!r}")
    resolved = load_region(region)
    path = SAMPLE_TILES.get((str(resolved.code), service))
    if path is None:
        raise RegionError(f"the shipped sample covers Puerto Rico (PR) and Hawaii (HI) only, not {resolved.name!r}")
    return path


def load_sample_dataset(
    region: str = "PR",
    target: str | Sequence[str] = "download",
    quarters: str | Sequence[Quarter | str | tuple[int, int]] | None = None,
    **kw,
) -> SpatialDataset:
    """Build a dataset from the shipped mobile sample (``"PR"`` or ``"HI"``, 2019Q1-2023Q4).

    Keyword arguments go to :func:`build_dataset`.
    """
    return build_dataset(sample_tiles_path(region), region, target=target, quarters=quarters, **kw)
