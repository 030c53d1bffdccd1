"""Speed benchmarks for exceedance maps: P(tile-mean speed < threshold).

Defaults, in Mbps (download / upload):

* mobile tiles: 35 / 3, the FCC's 5G-NR mobile benchmark (2024 Section 706 Report, FCC 24-27,
  and the 5G tier of the National Broadband Map's mobile coverage);
* fixed tiles: 100 / 20, the FCC's fixed broadband benchmark adopted in the same report.

A :class:`Benchmark` is the FCC's pair: a place meets it when its download speed is at least
the first number and its upload speed at least the second (``"35/3"``). The named pairs:
5/1 (4G LTE), 7/1 and 35/3 (5G-NR) for mobile; 25/3 and 100/20 for fixed.

Latency has no default; give one explicitly (the probability is still P(value < threshold),
which for latency is the good side).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Benchmark:
    """A download/upload speed pair in Mbps that a place meets when both speeds reach it.

    Attributes:
        download_mbps: the download speed to reach, Mbps (> 0).
        upload_mbps: the upload speed to reach, Mbps (> 0).
    """

    download_mbps: float
    upload_mbps: float

    def __post_init__(self) -> None:
        check_threshold(self.download_mbps)
        check_threshold(self.upload_mbps)

    def __str__(self) -> str:
        return f"{self.download_mbps:g}/{self.upload_mbps:g}"

    @property
    def log10_levels(self) -> tuple[float, float]:
        """(download, upload) levels in the models' log10 units."""
        return math.log10(self.download_mbps), math.log10(self.upload_mbps)

    @classmethod
    def parse(cls, text: str | Benchmark) -> Benchmark:
        """``"35/3"`` (any two positive numbers, download/upload Mbps) -> a Benchmark.

        Raises:
            InputDataError: for anything else, in one line.
        """
        if isinstance(text, Benchmark):
            return text
        match = re.fullmatch(r"\s*([0-9.eE+]+)\s*/\s*([0-9.eE+]+)\s*", str(text))
        try:
            if match is None:
                raise ValueError
            return cls(float(match.group(1)), float(match.group(2)))
        except (ValueError, InputDataError):
            raise InputDataError(
                f"a benchmark is download/upload Mbps such as 35/3 (named: {', '.join(NAMED_BENCHMARKS)}), got {text!r}"
            ) from None


#: The FCC's pairs (see the module text), by the name users write.
NAMED_BENCHMARKS: tuple[str, ...] = ("5/1", "7/1", "35/3", "25/3", "100/20")


def default_benchmark(service: str) -> Benchmark:
    """The FCC pair of a service: mobile 35/3, fixed 100/20 (:data:`DEFAULT_THRESHOLDS`)."""
    service = service if (service, "download") in DEFAULT_THRESHOLDS else "mobile"
    return Benchmark(DEFAULT_THRESHOLDS[(service, "download")], DEFAULT_THRESHOLDS[(service, "upload")])


__all__ = [
    "NAMED_BENCHMARKS", "Benchmark", "default_benchmark",
    "DEFAULT", "DEFAULT_THRESHOLDS", "THRESHOLD_SOURCE", "check_threshold", "default_threshold", "resolve_threshold",
]
