"""Error and throughput of reduced-precision prediction (``Regressor.prediction_precision``).

For a fitted GeoModel (default: the README demo's ``outputs/demo/models/dbk-rbf.pt``) and
its dataset, predicts the latest fitted quarter at every tile of the dataset plus
``--random`` uniform points in the tiles' box, and compares each precision with the same
model cast to float64:

* ``float32``, ``tf32`` and ``bf16`` on the backbone only (the shipped paths), and
* the rejected designs, every matrix product of the forward at TF32 or bf16, to show why
  the kernel features and folded projection stay float32.

TF32 on a CPU is emulated: the inputs of every matrix product (``matmul``, ``mm``,
``addmm``, ``linear``) are rounded to TF32's 10 mantissa bits, as tensor cores do before
accumulating in float32. On CUDA the real TF32 path runs too (``tf32 (hardware)``). The
table gives the max and 99th percentile of |mean error| (log10 units) and of the relative sd
error, then the prediction throughput (points/s, one thread unless ``--threads``) of each
shipped path on each available device.

Run: ``python benchmarks/bench_prediction_precision.py [--model PATH] [--dataset PATH]``
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from geodbk.dataset.spatial_dataset import SpatialDataset
from geodbk.fit.geomodel import GeoModel
from geodbk.models.precision import PRECISIONS

PRODUCTS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.addmm, F.linear}


def tf32_rounded(t: object) -> object:
    """A float32 tensor rounded to nearest at 10 mantissa bits (TF32); anything else as is."""
    if not (torch.is_tensor(t) and t.dtype == torch.float32):
        return t
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


class EmulatedTF32(TorchFunctionMode):
    """Rounds the inputs of every matrix product to TF32 (CPU emulation of tensor cores)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in PRODUCTS:
            args = tuple(tf32_rounded(a) for a in args)
        return func(*args, **(kwargs or {}))


@contextmanager
def backbone_emulated_tf32(net: torch.nn.Module) -> Iterator[None]:
    """Emulated TF32 around the backbone only (what ``"tf32"`` does on CUDA)."""
    backbone = net.basis.backbone
    original = backbone.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        with EmulatedTF32():
            return original(x)

    backbone.forward = forward
    try:
        yield
    finally:
        del backbone.forward


def predict(net: torch.nn.Module, X: torch.Tensor, context: Callable[[], AbstractContextManager]) -> tuple:
    """Tile-mean (mean, sd) in standardised units, float64 numpy."""
    with torch.no_grad(), context():
        out = net(X)
    return out.mean.double().cpu().numpy(), out.tile_var.double().sqrt().cpu().numpy()


def errors(got: tuple, ref: tuple, y_std: float) -> list[str]:
    mean_err = np.abs(got[0] - ref[0]) * y_std
    sd_err = np.abs(got[1] / ref[1] - 1.0)
    return [f"{v:.1e}" for v in (mean_err.max(), np.quantile(mean_err, 0.99), sd_err.max(), np.quantile(sd_err, 0.99))]


def throughput(net: torch.nn.Module, X: torch.Tensor, batch: int, repeats: int) -> float:
    """Points/s of the eval forward in batches (best of ``repeats``), synchronised on CUDA."""
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up (and builds the folded weights)
        if X.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            for rows in X.split(batch):
                net(rows)
        if X.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return len(X) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="outputs/demo/models/dbk-rbf.pt", help="a fitted dbk-rbf GeoModel")
    parser.add_argument("--dataset", help="its dataset (default: dataset.parquet of the model's run folder)")
    parser.add_argument("--random", type=int, default=50_000, help="random points in the tiles' box")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=65_536)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model_path = Path(args.model)
    if not model_path.exists():
        raise SystemExit(f"no model at {model_path}; run `geodbk demo --out outputs/demo` first")
    torch.set_num_threads(args.threads)
    model = GeoModel.load(model_path)
    dataset = SpatialDataset.load(args.dataset or model_path.parents[1] / "dataset.parquet")
    tiles = dataset.frame.geometry.to_crs(4326).representative_point()
    lonlat = np.unique(np.c_[tiles.x, tiles.y], axis=0)
    low, high = lonlat.min(0), lonlat.max(0)
    points = np.r_[lonlat, low + np.random.default_rng(0).random((args.random, 2)) * (high - low)]
    X = model.features(points, None)  # the latest fitted quarter
    reg = model.regressor
    net = reg.model.eval()
    X32 = torch.as_tensor(X, dtype=torch.float32)
    reference = predict(copy.deepcopy(net).double(), torch.as_tensor(X, dtype=torch.float64), nullcontext)
    print(f"model {model_path} ({reg.kind}, h={reg.model_config.hidden}, r={reg.model_config.rank}), "
          f"latest quarter, {len(points):,} points ({len(lonlat):,} tiles + {args.random:,} random), "
          f"torch {torch.__version__}")
    rows: list[tuple[str, list[str]]] = []
    for precision in PRECISIONS:
        reg.prediction_precision = "float32" if precision == "tf32" else precision
        context = (lambda: backbone_emulated_tf32(net)) if precision == "tf32" else nullcontext
        label = f"{precision} backbone" + (" (emulated)" if precision == "tf32" else "")
        rows.append((label, errors(predict(net, X32, context), reference, reg.y_std)))
    reg.prediction_precision = "float32"
    rows.append(("tf32 everywhere (emulated)", errors(predict(net, X32, EmulatedTF32), reference, reg.y_std)))
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    rows.append(("bf16 everywhere", errors(predict(net, X32, autocast), reference, reg.y_std)))
    if torch.cuda.is_available():
        gpu = copy.deepcopy(net).cuda()
        gpu.backbone_precision = "tf32"
        rows.append(("tf32 backbone (hardware)", errors(predict(gpu, X32.cuda(), nullcontext), reference, reg.y_std)))
    print("\nerror against float64 | max |mean err| log10 | p99 | max rel sd err | p99")
    for label, cells in rows:
        print(f"{label:28s} | " + " | ".join(f"{c:>8s}" for c in cells))

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"\nthroughput, points/s (batch {args.batch:,}, {args.threads} CPU thread(s)), best of {args.repeats}")
    for device in devices:
        moved = copy.deepcopy(net).to(device)
        Xd = X32.to(device)
        speeds = {}
        for precision in PRECISIONS:
            moved.backbone_precision = precision
            speeds[precision] = throughput(moved, Xd, args.batch, args.repeats)
        cells = [f"{p} {s / 1e6:.2f} M ({s / speeds['float32']:.2f}x)" for p, s in speeds.items()]
        print(f"{device:5s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
