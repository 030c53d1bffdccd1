"""What a fitted model was fitted on, as a typed value: :class:`ModelInfo`.

A model file stores these facts as a plain mapping (the ``meta`` entry of its payload, and the
``model_*`` attributes of its grids). :meth:`ModelInfo.from_dict` is the one reader of that
mapping: the defaults for facts that older files lack are decided here and nowhere else.

Which quarters a model was fitted on has one answer, :attr:`ModelInfo.fitted_quarters` (and its
last, :attr:`ModelInfo.last_fitted_quarter`): the quarters of its training rows. That is every
quarter of its dataset (:attr:`ModelInfo.quarters`) except under the forecast split, which holds
the last quarter out as its test set. A model's ``"latest"`` and ``"all"`` maps (so the
dashboard's quarter slider) and its change over the last year read it; the forecast allowance of
its domain checks counts from the same last quarter (the input space's time axis spans the same
training rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import shapely
import shapely.errors
from shapely.geometry.base import BaseGeometry

from geodbk.dataset.file_checks import POLYGONAL, dropped_by_ingest
from geodbk.dataset.splits import fitted_quarters
from geodbk.dataset.targets import TARGETS
from geodbk.errors import InputDataError
from geodbk.ingest.regions import Region
from geodbk.quarters import Quarter

#: Name of the region of a model file that stored none.
UNNAMED_REGION = "fitted region"


@dataclass(frozen=True)
class ModelInfo:
    """The facts of a fitted model that maps, summaries and the dashboard read.

    Attributes:
        kind: model-zoo name, e.g. ``"dbk-rbf"``.
        target: ``"download"``, ``"upload"`` or ``"latency"``.
        units: the target's units, ``"Mbps"`` or ``"ms"``.
        service: ``"mobile"`` or ``"fixed"``.
        region: the fitted region's name.
        region_wkb_hex: the fitted region's lon/lat polygon as hex WKB (``None`` for model files
            written before it was stored).
        quarters: the dataset's quarters, oldest first, a forecast split's held-out test quarter
            included (stored as ``"2023Q4"`` labels; empty for a time-free dataset); the model's
            own are :attr:`fitted_quarters`.
        protocol: the input protocol, ``"space-time"`` or ``"paper"``.
        split: how the dataset's rows were split (``"random"``, ``"spatial-block"``, ``"forecast"``).
        n_train: training rows.
        local_residuals: whether a local residual field is part of the model.
        posterior: ``"conjugate"`` (q(w) replaced by the posterior given the learned basis) or
            ``"trained"``.
    """

    kind: str
    target: str = "download"
    units: str = "Mbps"
    service: str = "mobile"
    region: str = UNNAMED_REGION
    region_wkb_hex: str | None = None
    quarters: tuple[Quarter, ...] = ()
    protocol: str = "space-time"
    split: str = "random"
    n_train: int = 0
    local_residuals: bool = False
    posterior: str = "trained"

    @property
    def region_geometry(self) -> BaseGeometry | None:
        """The fitted region's lon/lat geometry, or ``None`` when the file stored none."""
        return None if self.region_wkb_hex is None else shapely.from_wkb(self.region_wkb_hex)

    @property
    def fitted_region(self) -> Region | None:
        """The fitted region as a :class:`~geodbk.ingest.regions.Region`, or ``None``."""
        geometry = self.region_geometry
        return None if geometry is None else Region(self.region, geometry)

    @property
    def fitted_quarters(self) -> tuple[Quarter, ...]:
        """The quarters of the model's training rows, oldest first: :attr:`quarters` less the last
        one under the forecast split (its test quarter, which the model forecasts); empty for a
        time-free dataset. What ``"all"`` maps (:meth:`geodbk.fit.geomodel.GeoModel.map_time`)."""
        return fitted_quarters(self.quarters, self.split)

    @property
    def last_fitted_quarter(self) -> Quarter | None:
        """The last of :attr:`fitted_quarters` (``None`` if there are none): the model's latest
        quarter, the default map and the start of its forecast allowance."""
        return self.fitted_quarters[-1] if self.fitted_quarters else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able mapping stored in model files (``quarters`` as a list of ``"2023Q4"`` labels)."""
        out = asdict(self)
        out["quarters"] = [str(quarter) for quarter in self.quarters]
        return out

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any]) -> ModelInfo:
        """Read the mapping of a model file of any version; missing facts take the defaults above.

        Raises:
            InputDataError: without a ``kind``, with facts of the wrong type, an unknown target or
                units, or a fitted region that is not a polygon.
        """
        if not mapping.get("kind"):
            raise InputDataError("the model facts name no model kind")

        def given(name: str) -> Any:
            value = mapping.get(name)
            return getattr(cls, name) if value is None else value

        wkb = mapping.get("region_wkb_hex")
        try:
            info = cls(
                kind=str(mapping["kind"]), target=str(given("target")), units=str(given("units")),
                service=str(given("service")), region=str(given("region")),
                region_wkb_hex=None if wkb is None else str(wkb),
                quarters=tuple(Quarter.parse(str(q)) for q in mapping.get("quarters") or ()),
                protocol=str(given("protocol")),
                split=str(given("split")), n_train=int(given("n_train")),
                local_residuals=bool(given("local_residuals")), posterior=str(given("posterior")),
            )
            geometry = info.region_geometry
        except (TypeError, ValueError, shapely.errors.ShapelyError) as err:
            raise InputDataError(f"the model facts are damaged ({err})") from None
        if info.target not in TARGETS or info.units != TARGETS[info.target][2]:
            raise InputDataError(f"the model facts name target {info.target!r} in {info.units!r}; known: "
                                 + ", ".join(f"{name} ({units})" for name, (_, _, units) in TARGETS.items()))
        if geometry is not None and (geometry.is_empty or geometry.geom_type not in POLYGONAL):
            raise InputDataError(f"the model facts hold a fitted region that is not a polygon ({geometry.geom_type})")
        return info

    def check_scaling(self, y_mean: float, y_std: float) -> None:
        """Refuse a target standardisation (``y = log10`` of the target) that describes no tiles
        ingest keeps: the typical value and one sd either side, ``10**(y_mean -/+ y_std)`` in the
        target's units, must be values ingest keeps
        (:func:`geodbk.dataset.file_checks.dropped_by_ingest`: positive, at most its ceiling).

        Raises:
            InputDataError: otherwise (a tampered ``y_mean = 1e300`` mapped infinite speeds).
        """
        if dropped_by_ingest({self.target: np.array([y_mean - y_std, y_mean + y_std])}).any():
            raise InputDataError(
                f"its target scaling y_mean {y_mean:g}, y_std {y_std:g} puts {self.target} at 10^({y_mean:g} +/- "
                f"{y_std:g}) {self.units}, beyond what ingest keeps: the file is damaged or tampered")
