"""Speed benchmarks for exceedance maps: P(tile-mean speed < threshold).

Defaults, in Mbps (download / upload):

* mobile tiles: 35 / 3, the FCC's 5G-NR mobile benchmark (2024 Section 706 Report, FCC 24-27,
  and the 5G tier of the National Broadband Map's mobile coverage);
* fixed tiles: 100 / 20, the FCC's fixed broadband benchmark adopted in the same report.

Latency has no default; give one explicitly (the probability is still P(value < threshold),
which for latency is the good side).
"""

from __future__ import annotations

import math

from geodbk.dataset.model_info import ModelInfo
from geodbk.errors import InputDataError

#: (service, target) -> threshold in Mbps.
DEFAULT_THRESHOLDS: dict[tuple[str, str], float] = {
    ("mobile", "download"): 35.0,
    ("mobile", "upload"): 3.0,
    ("fixed", "download"): 100.0,
    ("fixed", "upload"): 20.0,
}

#: Where the defaults come from (written into grid and summary metadata).
THRESHOLD_SOURCE = "FCC 2024 Section 706 Report (FCC 24-27): mobile 5G-NR 35/3 Mbps, fixed 100/20 Mbps"


def default_threshold(info: ModelInfo) -> float | None:
    """The benchmark for a model's service and target, or ``None`` when there is none (latency)."""
    return DEFAULT_THRESHOLDS.get((info.service, info.target))


#: ``threshold=DEFAULT`` asks for the benchmark of the model's service and target.
DEFAULT = "default"


def resolve_threshold(threshold: float | str | None, info: ModelInfo) -> float | None:
    """The threshold in data units: :func:`default_threshold` for ``DEFAULT``, ``None`` for
    none, else the checked number."""
    if threshold == DEFAULT:
        return default_threshold(info)
    return None if threshold is None else check_threshold(float(threshold))


def check_threshold(value: float) -> float:
    """A threshold in data units must be a finite positive number (it is compared on log10)."""
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise InputDataError(f"threshold must be a positive number in the data's units, got {value}")
    return value


__all__ = [
    "DEFAULT", "DEFAULT_THRESHOLDS", "THRESHOLD_SOURCE", "check_threshold", "default_threshold", "resolve_threshold",
]
