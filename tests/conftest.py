"""Shared fixtures built from the shipped real sample (data/, see geodbk.paths).

Session-scoped and read-only: do not mutate what they return (copy first).
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import geopandas as gpd
import pytest
import torch

from geodbk import paths
from geodbk.dataset.spatial_dataset import SpatialDataset, build_dataset
from geodbk.ingest.ookla import read_tiles


@pytest.fixture(scope="session")
def fit_device() -> str:
    """The device of the fits whose posterior, conditioning, hexagons and plans the tests check:
    ``GEODBK_TEST_DEVICE`` (default ``"cpu"``; ``benchmarks/gpu_check.sh`` sets ``"cuda"``)."""
    return os.environ.get("GEODBK_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def pr_tiles() -> gpd.GeoDataFrame:
    """All Puerto Rico mobile tiles of the shipped sample (2019Q1-2023Q4, truncated 2020Q2 dropped)."""
    return read_tiles(paths.PUERTO_RICO_MOBILE)


@pytest.fixture(scope="session")
def pr_tiles_2023q4(pr_tiles) -> gpd.GeoDataFrame:
    """Puerto Rico mobile tiles of 2023Q4 only (6,427 rows)."""
    return pr_tiles[(pr_tiles["year"] == 2023) & (pr_tiles["quarter"] == 4)].reset_index(drop=True)


@pytest.fixture(scope="session")
def pr_dataset(pr_tiles) -> SpatialDataset:
    """Small real dataset: Puerto Rico mobile download speed, 2023Q4, county urban route, seed 0.

    6,416 rows (5,132 train / 641 val / 643 test), x in [-1, 1]^2, y = log10(Mbps).
    """
    return build_dataset(pr_tiles, "PR", target="download", quarters="2023Q4", seed=0)


@pytest.fixture(scope="session")
def small_demo(tmp_path_factory, fit_device) -> tuple:
    """``(DemoResult, echoed lines)`` of one tiny demo run, shared by the run folder's tests
    (test_workflow) and the viewer's tests over a real run (test_viewer), so that it is fitted
    once (about 45 s on 2 cores): 2023Q3-2023Q4 of the shipped PR sample; dbk-rbf (download and
    upload), sv-rbf and knn; 2 epochs, a 0.02 degree grid, H3 resolution 7 and a
    3-visit plan. Read-only: copy the folder before changing it."""
    from geodbk.workflow import DemoConfig, run_demo

    lines: list[str] = []
    config = DemoConfig(quarters=["2023Q3", "2023Q4"], models=("dbk-rbf", "sv-rbf", "knn"), epochs=2, resolution=0.02,
                        progress=False, device=fit_device, h3_resolution=7, plan_budget=3)
    result = run_demo(tmp_path_factory.mktemp("small-demo") / "run", config, echo=lines.append)
    return result, lines


@pytest.fixture(scope="module")
def single_thread():
    """Torch on one thread for a test module (``pytestmark = pytest.mark.usefixtures("single_thread")``):
    the model tests use tiny tensors, where one thread is fastest and immune to oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- a loopback HTTP server for URL tests (no network) -----------------------------------------
class _LoopbackHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder and records every path asked for in ``requests``. Bad servers on purpose:
    ``/garbage/...`` answers 200 with an HTML page, ``/slow/...`` the same page dripped out over
    seconds, ``/huge/...`` announces 10^12 bytes, ``/truncated/...`` sends 1,000 of 100,000."""

    requests: list[str]

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.requests.append(self.path)
        if self.path.startswith(("/garbage/", "/slow/")):
            body = b"<html><body>Service Unavailable</body></html>\n" * 50
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for start in range(0, len(body), 500):
                self.wfile.write(body[start:start + 500])
                self.wfile.flush()
                if self.path.startswith("/slow/"):
                    time.sleep(0.2)
            return
        if self.path.startswith("/huge/"):
            self.send_response(200)
            self.send_header("Content-Length", str(10**12))
            self.end_headers()
            self.wfile.write(b"PAR1" + b"x" * 4096)
            return
        if self.path.startswith("/truncated/"):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x" * 1000)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that stops reading (the download cap) breaks the pipe: expected


@pytest.fixture(scope="session")
def loopback() -> Iterator[Callable[[Path], tuple[str, list[str]]]]:
    """``serve(folder) -> (base_url, requests)``: a 127.0.0.1 HTTP server over ``folder`` on a
    thread, with the bad routes of :class:`_LoopbackHandler`; ``requests`` lists the paths asked
    for. Servers stop at the end of the session."""
    servers: list[_QuietServer] = []

    def serve(folder: Path) -> tuple[str, list[str]]:
        requests: list[str] = []
        handler = type("Handler", (_LoopbackHandler,), {"requests": requests})
        server = _QuietServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", requests

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()
