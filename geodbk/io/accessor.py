"""The ``.dbk`` accessor on geodbk grid datasets: the grid's layout, data units, prediction intervals,
exceedance, GeoTIFF.

Importing this module registers the accessor on every :class:`xarray.Dataset`, as
``import rioxarray`` registers ``.rio``. ``import geodbk`` stays light and registers
nothing; the first use of a ``geodbk.<name>`` that makes, reads or writes grids
(``geodbk.GeoModel``, ``geodbk.fit_dataset``, ``geodbk.predict_grid``, ``geodbk.open_grid``,
``geodbk.write_geotiff``, ...; any name from :mod:`geodbk.maps`, :mod:`geodbk.io` or
:mod:`geodbk.fit.geomodel`) imports it. Code that imports those modules directly imports this
one too (``import geodbk.io.accessor``).

A grid (:func:`geodbk.maps.predict.predict_grid`, :meth:`geodbk.fit.geomodel.GeoModel.grid`,
:func:`geodbk.maps.stores.open_grid`) holds ``mean`` and ``sd`` of log10(value), dims
``(y, x)`` or ``(time, y, x)``; every method here works from those two, elementwise, keeps
their dims, coordinates and CRS (``spatial_ref``), and stays lazy on a dask-backed grid. The
layout members (``quarters``, ``at``, ``change_span``, ``cells_inside``) come from
:class:`geodbk.io.reader.GridReader`, the one reader of the grid format:

>>> grid = model.grid("1km")                          # doctest: +SKIP
>>> grid.dbk.quarters, grid.dbk.at("2023Q4")          # doctest: +SKIP
>>> grid.dbk.mbps()["lower_mbps"]                     # doctest: +SKIP
>>> grid.dbk.p_below(35.0)                            # doctest: +SKIP
>>> grid.dbk.to_geotiff("map.tif", ["mean", "sd"], cog=True)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from geodbk.errors import InputDataError
from geodbk.io.geotiff import write_geotiff
from geodbk.io.reader import GridReader
from geodbk.maps.schema import GridLayers
from geodbk.maps.thresholds import check_threshold
from geodbk.prediction import Prediction, probability_below, to_data_units


@xr.register_dataset_accessor("dbk")
class DBKAccessor(GridReader):
    """``ds.dbk``: the layout of a geodbk grid (:class:`~geodbk.io.reader.GridReader`) and its
    predictive distribution, N(mean, sd^2) of log10(value) per cell."""

    @property
    def units(self) -> str:
        """The data unit of the grid (``"Mbps"`` or ``"ms"``), from its ``units`` attribute."""
        return str(self._ds.attrs.get("units", "Mbps"))

    def _layers(self, threshold: float | None = None) -> GridLayers:
        """The grid's variable names and CF attributes (one quarter's worth)."""
        return GridLayers(str(self._ds.attrs.get("target", "download")), self.units, (None,), False, threshold)

    def _mean_sd(self) -> tuple[xr.DataArray, xr.DataArray]:
        mean, sd = self._variables("mean", "sd")
        return mean, sd

    def to_data_units(self) -> xr.Dataset:
        """The median and the 95% prediction-interval bounds in data units, shaped like ``mean``.

        Variables ``mean_<u>`` = 10**mean, ``lower_<u>`` = 10**(mean - 1.959964 sd) and
        ``upper_<u>`` = 10**(mean + 1.959964 sd) (``<u>`` = ``mbps`` or ``ms``), float64,
        computed by :func:`geodbk.prediction.to_data_units`, with the grid's CF attributes.
        """
        mean, sd = self._mean_sd()
        values = xr.apply_ufunc(
            to_data_units, mean, sd, output_core_dims=[[], [], []], dask="parallelized", output_dtypes=[np.float64] * 3
        )
        specs = self._layers().variables()
        key = self.units.lower()
        names = (f"mean_{key}", f"lower_{key}", f"upper_{key}")
        return xr.Dataset(
            {name: value.rename(name).assign_attrs(specs[name][1]) for name, value in zip(names, values, strict=True)}
        )

    def mbps(self) -> xr.Dataset:
        """:meth:`to_data_units` of a speed grid (``mean_mbps``, ``lower_mbps``, ``upper_mbps``).

        Raises:
            InputDataError: for a grid in other units (latency, ms): use :meth:`to_data_units`.
        """
        if self.units != "Mbps":
            raise InputDataError(f"the grid is in {self.units}, not Mbps; use .dbk.to_data_units()")
        return self.to_data_units()

    def pi_bounds(self) -> xr.Dataset:
        """The 95% prediction interval of log10(value): ``lower`` = mean - 1.959964 sd and
        ``upper`` = mean + 1.959964 sd, shaped like ``mean`` (log10 units)."""
        mean, sd = self._mean_sd()
        lower, upper = xr.apply_ufunc(
            _interval, mean, sd, output_core_dims=[[], []], dask="parallelized", output_dtypes=[np.float64] * 2
        )
        units = str(mean.attrs.get("units", f"log10({self.units})"))
        return xr.Dataset({
            "lower": lower.assign_attrs(long_name="lower bound of the 95% prediction interval", units=units),
            "upper": upper.assign_attrs(long_name="upper bound of the 95% prediction interval", units=units),
        })

    def p_below(self, threshold: float | None = None) -> xr.DataArray:
        """P(tile-mean value < ``threshold``) per cell, shaped like ``mean``.

        ``threshold`` is in data units (Mbps or ms); default the grid's own ``threshold``
        attribute (the one its ``p_below`` layer used).
        """
        mean, sd = self._mean_sd()
        level = self._threshold(threshold)
        below = xr.apply_ufunc(
            probability_below, mean, sd, np.log10(level), dask="parallelized", output_dtypes=[np.float64]
        )
        return below.rename("p_below").assign_attrs(self._layers(level).variables()["p_below"][1])

    def exceedance(self, threshold: float | None = None) -> xr.DataArray:
        """P(tile-mean value > ``threshold``) = 1 - :meth:`p_below`, per cell (threshold in data
        units; default the grid's ``threshold`` attribute)."""
        below = self.p_below(threshold)
        attrs = {**below.attrs, "long_name": below.attrs["long_name"].replace(" is below ", " is above ")}
        return (1.0 - below).rename("exceedance").assign_attrs(attrs)

    def _threshold(self, threshold: float | None) -> float:
        if threshold is not None:
            return check_threshold(threshold)
        if "threshold" not in self._ds.attrs:
            raise InputDataError("the grid has no threshold attribute; give a threshold in data units")
        return check_threshold(self._ds.attrs["threshold"])

    def to_geotiff(
        self, path: str | Path, variables: Sequence[str] | None = None, *, cog: bool = False, overwrite: bool = False
    ) -> Path:
        """Write the grid with :func:`geodbk.io.geotiff.write_geotiff` (one float32 band per
        variable and quarter; ``cog=True`` for a Cloud-Optimized GeoTIFF; ``overwrite`` replaces a
        folder at ``path``); returns the path."""
        return write_geotiff(self._ds, path, variables=variables, cog=cog, overwrite=overwrite)


def _interval(mean: np.ndarray, sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of the 95% prediction interval of N(mean, sd^2), from :class:`Prediction`."""
    prediction = Prediction(mean, sd)
    return prediction.lower, prediction.upper


__all__ = ["DBKAccessor"]
