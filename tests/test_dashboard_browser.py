"""The Panel dashboard in a real browser: Debian's headless Chromium driven by Playwright.

A session fixture builds a tiny run folder through the public API (three quarters of the
Puerto Rico sample, a small GP and the knn baseline, a coarse grid), serves
``apps/dashboard.py`` with ``panel serve`` on a free loopback port in a subprocess, with
``--no-basemap`` (CI has no network), and the tests load the page, check what renders, move the
quarter slider, switch map layers, click the map (kernel slice, time series), read the hover
readout, read the polygon summary table (a second server with ``--polygons``), and download
files. The browser may only talk to 127.0.0.1: every other request is aborted and recorded, and
a test fails if one was attempted, or if the page logged a JS error. One more server keeps the
basemap on: its tile requests are answered in the browser with a blank tile, never sent.

When Chromium is missing the tests skip, except under CI (env ``CI`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "apps" / "dashboard.py"
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # belt and braces: no name other than the loopback address resolves
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
#: A GP (kernel slices, change layers, area summaries) and the knn baseline (none of those).
KINDS = ("dbk-rbf", "knn")
QUARTERS = ("2022Q4", "2023Q2", "2023Q4")  # the change layers span the year 2022Q4 -> 2023Q4
QUARTER = QUARTERS[-1]
GRID_RESOLUTION = 0.02  # degrees: ~137 x 31 cells over Puerto Rico
LOAD_TIMEOUT_MS = 90_000
#: Panel renders each pane in a shadow root; Playwright's CSS selectors pierce it.
REF_TEXT = ".geodbk-ref div"
REF_PATTERN = re.compile(r"lon (-?\d+\.\d+), lat (-?\d+\.\d+)")
MAP_TITLE = ".geodbk-map-title div"
SERIES_TEXT = ".geodbk-series-text div"
SLIDER_HANDLE = ".geodbk-quarter .noUi-handle"
#: Two boxes over Puerto Rico (San Juan, Ponce) and one far away, which the page leaves out.
POLYGONS = {
    "San Juan box": [(-66.15, 18.36), (-66.0, 18.36), (-66.0, 18.46), (-66.15, 18.46)],
    "Ponce box": [(-66.68, 17.98), (-66.55, 17.98), (-66.55, 18.06), (-66.68, 18.06)],
    "Far away": [(-100.0, 40.0), (-99.0, 40.0), (-99.0, 41.0), (-100.0, 41.0)],
}


def chromium_executable(candidates: tuple[str | None, ...] | None = None) -> str:
    """Debian's Chromium, or skip (locally) / fail (in CI) when it is missing."""
    if candidates is None:
        candidates = ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return candidate
    message = "Chromium not found: install it with `apt-get install -y chromium` (scripts/setup.sh does as root)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


# --- the run folder -----------------------------------------------------------------------
def build_tiny_run(run: Path) -> Path:
    """A run folder from ``geodbk.workflow.run_demo`` with tiny settings (~20 s on 2 cores):
    maps of three quarters along ``time`` and the change 2022Q4 -> 2023Q4."""
    from geodbk.workflow import DemoConfig, run_demo

    config = DemoConfig(
        quarters=list(QUARTERS), models=KINDS, epochs=2, resolution=GRID_RESOLUTION, device="cpu", progress=False
    )
    run_demo(run, config, echo=lambda line: None)
    return run


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny run folder; ``GEODBK_BROWSER_RUN=DIR`` reuses one that :func:`build_tiny_run`
    wrote before (while working on the page, instead of a fresh fit per session)."""
    if os.environ.get("GEODBK_BROWSER_RUN"):
        return Path(os.environ["GEODBK_BROWSER_RUN"])
    return build_tiny_run(tmp_path_factory.mktemp("dashboard") / "run")


# --- the server ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``panel serve apps/dashboard.py`` on a loopback port, in a subprocess, without the basemap
    unless ``basemap``."""

    def __init__(
        self, run: Path, log: Path, *, via_cli: bool = False, polygons: Path | None = None, basemap: bool = False
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/dashboard"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if via_cli:  # the same server through `geodbk serve`
            cmd = [sys.executable, "-m", "geodbk", "serve", "--run", str(run), "--port", str(self.port)]
        else:
            cmd = [
                sys.executable, "-m", "panel", "serve", str(APP),
                "--port", str(self.port), "--address", "127.0.0.1",
                "--allow-websocket-origin", f"127.0.0.1:{self.port}",
                "--args", "--run", str(run),
            ]  # fmt: skip
            if polygons is not None:
                cmd += ["--polygons", str(polygons)]
        if not basemap:
            cmd.append("--no-basemap")
        self.log = log
        self._log_file = log.open("w")
        self.process = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"panel serve exited with {self.process.returncode}:\n{self.log.read_text()[-4000:]}"
                )
            try:
                # the first page request runs the app once, which also warms its caches
                with urllib.request.urlopen(self.url, timeout=max(1.0, deadline - time.monotonic())):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        raise TimeoutError(f"panel serve did not answer in {timeout} s:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        """Stop the server's own process group (it was started in a new session)."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass
        self._log_file.close()

    def app_errors(self) -> list[str]:
        """Python errors the server logged while running the app.

        Not counted: tornado's "Task exception was never retrieved" for a message to a page that
        a test had already closed (WebSocketClosedError), which is no error of the app.
        """
        errors = []
        for entry in re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", self.log.read_text()):
            if "WebSocketClosedError" in entry and "Task exception was never retrieved" in entry:
                continue
            errors += [
                line for line in entry.splitlines() if "Traceback" in line or "Error running application" in line
            ]
        return errors


def serving(srv: Server):
    """A fixture's body: the server once it answers, stopped afterwards."""
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(run_folder: Path, tmp_path_factory: pytest.TempPathFactory):
    yield from serving(Server(run_folder, tmp_path_factory.mktemp("serve") / "panel.log"))


def write_polygons(path: Path) -> Path:
    """:data:`POLYGONS` as a GeoJSON file (EPSG:4326) with a ``NAME`` column."""
    features = [
        {
            "type": "Feature",
            "properties": {"NAME": name},
            "geometry": {"type": "Polygon", "coordinates": [[*map(list, ring), list(ring[0])]]},
        }
        for name, ring in POLYGONS.items()
    ]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path


@pytest.fixture(scope="module")
def polygon_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_polygons(tmp_path_factory.mktemp("polygons") / "boxes.geojson")


@pytest.fixture(scope="module")
def polygon_server(run_folder: Path, polygon_file: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same page with ``--polygons``: an area summary table under the map."""
    log = tmp_path_factory.mktemp("serve-polygons") / "panel.log"
    yield from serving(Server(run_folder, log, polygons=polygon_file))


@pytest.fixture(scope="module")
def basemap_server(run_folder: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same page with its basemap on (no ``--no-basemap``)."""
    yield from serving(Server(run_folder, tmp_path_factory.mktemp("serve-basemap") / "panel.log", basemap=True))


# --- the browser --------------------------------------------------------------------------
class PageLog:
    """JS errors, console errors and blocked (non-loopback) requests seen by a page."""

    def __init__(self) -> None:
        self.page_errors: list[str] = []
        self.console_errors: list[str] = []
        self.blocked: list[str] = []

    def problems(self) -> list[str]:
        return self.page_errors + self.console_errors + [f"external request: {u}" for u in self.blocked]


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory):
    executable = chromium_executable()
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1180, "height": 1300},
            accept_downloads=True,
            service_workers="block",
        )
        context.set_default_timeout(LOAD_TIMEOUT_MS)
        yield context
        context.close()


@pytest.fixture()
def page_and_log(browser_context):
    log = PageLog()

    def only_loopback(route) -> None:
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", None) or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            log.blocked.append(route.request.url)
            route.abort()

    page = browser_context.new_page()
    page.route("**/*", only_loopback)
    page.on("pageerror", lambda err: log.page_errors.append(f"pageerror: {err}"))
    page.on(
        "console",
        lambda msg: log.console_errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None,
    )
    yield page, log
    page.close()


def open_dashboard(page, server: Server) -> None:
    page.goto(server.url, wait_until="load")
    try:
        page.locator(".geodbk-map canvas").first.wait_for(state="visible")
        page.locator(".geodbk-kernel canvas").first.wait_for(state="visible")
        page.locator(REF_TEXT, has_text="Reference point").wait_for()
    except Exception:
        print(server.log.read_text()[-6000:])  # the app's traceback, shown by pytest on failure
        raise


def reference_lonlat(page) -> tuple[float, float]:
    text = page.locator(REF_TEXT).inner_text()
    match = REF_PATTERN.search(text)
    assert match, f"no reference point in {text!r}"
    return float(match.group(1)), float(match.group(2))


def click_map(page, fx: float, fy: float) -> tuple[float, float]:
    """Click the map at fractions (fx, fy) of its canvas; wait for and return the new reference point.

    The canvas also holds the colour bar and the toolbar (its right ~40%), so fx < 0.55.
    """
    before = page.locator(REF_TEXT).inner_text()
    box = page.locator(".geodbk-map canvas").first.bounding_box()
    assert box and box["width"] > 100 and box["height"] > 100, box
    page.mouse.click(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
    deadline = time.monotonic() + 60
    # Panel re-renders the text in place, so it can be briefly empty: wait for a new, full one.
    while (text := page.locator(REF_TEXT).inner_text()) == before or not REF_PATTERN.search(text):
        assert time.monotonic() < deadline, f"the kernel slice did not follow the click (text {text!r})"
        page.wait_for_timeout(200)
    return reference_lonlat(page)


def distinct_colours(page, selector: str) -> int:
    """Distinct RGB colours in the central half of the first canvas matching ``selector``."""
    return page.locator(selector).first.evaluate(
        """(canvas) => {
            const ctx = canvas.getContext("2d");
            const w = canvas.width, h = canvas.height;
            const data = ctx.getImageData(w / 4, h / 4, w / 2, h / 2).data;
            const seen = new Set();
            for (let i = 0; i < data.length; i += 4) seen.add((data[i] << 16) | (data[i + 1] << 8) | data[i + 2]);
            return seen.size;
        }"""
    )


def canvas_checksum(page, selector: str) -> int:
    """A checksum of every pixel of the first canvas matching ``selector``."""
    return page.locator(selector).first.evaluate(
        """(canvas) => {
            const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            let sum = 0;
            for (let i = 0; i < data.length; i++) sum = (sum * 31 + data[i]) % 1000000007;
            return sum;
        }"""
    )


def wait_for_new_canvas(page, selector: str, before: int, timeout_s: float = 60.0) -> int:
    """Wait until the canvas differs from the checksum ``before``; return its new checksum."""
    deadline = time.monotonic() + timeout_s
    while (now := canvas_checksum(page, selector)) == before:
        assert time.monotonic() < deadline, f"{selector} did not change"
        page.wait_for_timeout(200)
    return now


def wait_for_text(page, selector: str, *parts: str, timeout_s: float = 60.0) -> str:
    """The text of the first element matching ``selector`` once it holds every one of ``parts``
    (Panel re-renders a pane's text in place, so it can be briefly empty or old)."""
    deadline = time.monotonic() + timeout_s
    while not all(part in (text := page.locator(selector).first.inner_text()) for part in parts):
        assert time.monotonic() < deadline, f"{selector}: {parts} not in {text!r}"
        page.wait_for_timeout(200)
    return text


def move_quarter_slider(page, key: str, expected: str) -> None:
    """Press ``key`` (ArrowLeft, ArrowRight, Home, End) on the quarter slider's handle and wait
    until the map's title shows ``expected``."""
    handle = page.locator(SLIDER_HANDLE).first
    handle.focus()
    page.keyboard.press(key)
    page.locator(MAP_TITLE, has_text=f"· {expected} ·").wait_for()


def choose_layer(page, label: str) -> None:
    """Click the map layer button ``label`` and wait until the map's title names it."""
    page.locator(".geodbk-layers button", has_text=label).first.click()
    page.locator(MAP_TITLE, has_text=label).wait_for()


def bokeh_models(page) -> dict:
    """Titles of the page's Bokeh plots and the lengths of its data columns ``series_median``
    and ``observed_value`` (the time series' quarters and nearby observed tiles)."""
    return page.evaluate(
        """() => {
            const out = {titles: [], series_median: [], observed_value: []};
            for (const doc of Bokeh.documents) {
                for (const model of doc.all_models) {
                    if (model.type === "Title" && typeof model.text === "string") out.titles.push(model.text);
                    if (model.type === "ColumnDataSource") {
                        for (const column of ["series_median", "observed_value"]) {
                            if (column in model.data) out[column].push(model.data[column].length);
                        }
                    }
                }
            }
            return out;
        }"""
    )


def tiles_within_km(frame, lon: float, lat: float, km: float) -> int:
    """Rows of the dataset (every split and quarter) whose tile centre is within ``km`` (haversine)."""
    phi, phi0 = np.radians(frame["lat"].to_numpy()), np.radians(lat)
    dlon = np.radians(frame["lon"].to_numpy() - lon)
    half = np.sin((phi - phi0) / 2) ** 2 + np.cos(phi) * np.cos(phi0) * np.sin(dlon / 2) ** 2
    return int((2 * 6371.0088 * np.arcsin(np.sqrt(half)) <= km).sum())


# --- tests --------------------------------------------------------------------------------
def test_dashboard_renders_map_widgets_and_tables(server, page_and_log, run_folder):
    page, log = page_and_log
    open_dashboard(page, server)
    # widgets
    for label in ("Target", "Model run", "Observed tiles: quarter", "Colour limits", "Map quarter"):
        assert page.get_by_text(label, exact=False).first.is_visible(), label
    for kind in KINDS:
        assert page.locator("select option", has_text=kind).count() >= 1, kind
    assert page.locator("select option", has_text=QUARTER).count() == 1
    # the GP's grid has every layer, the threshold named in its label
    for layer in (
        "Predictive median", "Predictive sd (log10)", "95% PI width (log10)", "P(download < 35 Mbps)",
        "Change (log10)", "Change in Mbps", "Change sd (log10)", "P(improvement)",
    ):  # fmt: skip
        assert page.get_by_role("button", name=layer, exact=True).is_visible(), layer
    # the quarter slider starts at the latest quarter
    assert page.locator(SLIDER_HANDLE).first.is_visible()
    assert f"· {QUARTER} ·" in page.locator(MAP_TITLE).inner_text()
    for button in ("GeoTIFF of the map", "Test tiles GeoJSON", "Shown tiles GeoJSON"):
        assert page.get_by_text(button).first.is_visible(), button
    # no --polygons: no area summary
    assert page.locator(".geodbk-summary").count() == 0
    # plots: map, kernel slice, predictive density, time series, PI-width violin
    for css in ("geodbk-map", "geodbk-kernel", "geodbk-density", "geodbk-series", "geodbk-violin"):
        canvas = page.locator(f".{css} canvas").first
        canvas.wait_for(state="visible")
        box = canvas.bounding_box()
        assert box and box["width"] > 200 and box["height"] > 150, (css, box)
    # the map really drew the raster: many distinct colours in the middle of its canvas
    assert distinct_colours(page, ".geodbk-map canvas") > 30
    # metrics table of the selected model: urban and rural rows, values from metrics.csv
    table = page.locator(".geodbk-metrics table").first.inner_text()
    assert "urban" in table and "rural" in table and "coverage95" in table
    metrics = json.loads((run_folder / "metrics.json").read_text())
    nll_urban = next(r["NLL"] for r in metrics if r["model"] == KINDS[0] and r["group"] == "urban")
    assert f"{nll_urban:.3f}" in table
    # the default reference point (the grid's urban reference) is inside Puerto Rico
    lon, lat = reference_lonlat(page)
    assert -67.5 < lon < -65.2 and 17.8 < lat < 18.6
    # the run has no upload model: choosing upload explains what to run
    page.locator("select").filter(has=page.locator("option", has_text="upload")).select_option("upload")
    notice = page.locator(".geodbk-notice div", has_text="geodbk demo --target upload")
    notice.wait_for()
    assert "trained on upload" in notice.inner_text()
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []


def test_click_on_map_updates_kernel_slice(server, page_and_log):
    page, log = page_and_log
    open_dashboard(page, server)
    start = reference_lonlat(page)
    west = click_map(page, 0.15, 0.50)
    east = click_map(page, 0.45, 0.50)
    assert west != start and east != start
    # map coordinates follow the click: right of the first click is east, same row same latitude
    assert east[0] > west[0] + 0.3
    assert abs(east[1] - west[1]) < 1e-6
    assert -68.5 < west[0] < -64.5 and 17.0 < west[1] < 19.0
    text = page.locator(REF_TEXT).inner_text()
    assert re.search(r"Predicted median \d+\.\d Mbps, 95% PI \[\d+\.\d, \d+\.\d\] Mbps", text), text
    # the slice is shown as a correlation: within [-1, 1] (Cauchy-Schwarz)
    stats = re.search(r"correlation over the grid: min (-?[\d.]+), median (-?[\d.]+), max (-?[\d.]+)", text)
    assert stats, text
    low, median, high = map(float, stats.groups())
    assert -1.001 <= low <= median <= high <= 1.001
    ARTIFACTS.mkdir(exist_ok=True)
    page.mouse.move(1, 1)  # no hover tooltip over the map in the screenshot
    page.locator(".geodbk-kernel canvas").first.wait_for(state="visible")
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    # the same slice as a covariance, for the same point
    page.get_by_role("button", name="covariance").click()
    page.locator(REF_TEXT, has_text="covariance over the grid").wait_for()
    assert reference_lonlat(page) == east
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []


def test_downloads_are_the_selected_models_map_and_the_shown_tiles(server, page_and_log, run_folder, tmp_path):
    import rasterio

    from geodbk.dataset.spatial_dataset import SpatialDataset

    page, log = page_and_log
    open_dashboard(page, server)
    label = f"{KINDS[1]} ({run_folder.name}, download)"  # the model select's label of that fit
    page.locator("select").filter(has=page.locator("option", has_text=label)).select_option(label=label)
    page.locator(".geodbk-map-title div", has_text=KINDS[1]).wait_for()
    with page.expect_download() as info:
        page.get_by_text("GeoTIFF of the map").first.click()
    saved = tmp_path / "map.tif"
    info.value.save_as(saved)
    assert info.value.suggested_filename.endswith(f"{KINDS[1]}.tif")
    assert saved.read_bytes() == (run_folder / "maps" / f"{KINDS[1]}.tif").read_bytes()
    with rasterio.open(saved) as tif:
        assert tif.count >= 6 and tif.crs.to_epsg() == 4326
    # the observed tiles of the chosen quarter, made on the server when asked for
    with page.expect_download() as info:
        page.get_by_text("Shown tiles GeoJSON").first.click()
    shown = json.loads(Path(info.value.path()).read_text())
    frame = SpatialDataset.load(run_folder / "dataset.parquet").frame
    year, quarter = (int(v) for v in QUARTER.split("Q"))
    assert len(shown["features"]) == int(((frame["year"] == year) & (frame["quarter"] == quarter)).sum()) > 0
    assert {f["properties"]["quarter"] for f in shown["features"]} == {quarter}
    assert log.problems() == [], log.problems()


def test_geodbk_serve_without_a_run_folder_explains_what_to_run(tmp_path):
    """A --run that is not there is refused in one line that says what to run, before any server
    starts (issue 35: it used to start the dashboard on a notice)."""
    missing = tmp_path / "missing-run"
    done = subprocess.run([sys.executable, "-m", "geodbk", "serve", "--run", str(missing)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("geodbk serve: error: no run folder at") and f"geodbk demo --out {missing}" in lines[0]


MAP_CANVAS = ".geodbk-map canvas"
GP_LAYERS = (
    "Predictive median", "Predictive sd (log10)", "95% PI width (log10)", "P(download < 35 Mbps)",
    "Change (log10)", "Change in Mbps", "Change sd (log10)", "P(improvement)",
)  # fmt: skip
CHANGE_LAYERS = GP_LAYERS[4:]


def select_model(page, kind: str, run_folder: Path) -> None:
    """Choose the model ``kind`` of the run and wait until the map's title names it."""
    label = f"{kind} ({run_folder.name}, download)"  # the model select's label of that fit
    page.locator("select").filter(has=page.locator("option", has_text=label)).select_option(label=label)
    page.locator(MAP_TITLE, has_text=kind).wait_for()


def observed_quarter_select(page):
    return page.locator("select").filter(has=page.locator("option", has_text="all quarters"))


def test_quarter_slider_rerenders_the_map_for_that_quarter(server, page_and_log):
    page, log = page_and_log
    open_dashboard(page, server)
    latest = canvas_checksum(page, MAP_CANVAS)
    assert f"· {QUARTER}" in page.locator(REF_TEXT).inner_text()
    # one step back: another image, and the point readout and the observed tiles follow
    move_quarter_slider(page, "ArrowLeft", QUARTERS[-2])
    middle = wait_for_new_canvas(page, MAP_CANVAS, latest)
    page.locator(REF_TEXT, has_text=f"· {QUARTERS[-2]}").wait_for()
    assert observed_quarter_select(page).input_value() == QUARTERS[-2]
    move_quarter_slider(page, "ArrowLeft", QUARTERS[0])
    first = wait_for_new_canvas(page, MAP_CANVAS, middle)
    assert len({latest, middle, first}) == 3
    # and forward again
    move_quarter_slider(page, "ArrowRight", QUARTERS[1])
    wait_for_new_canvas(page, MAP_CANVAS, first)
    page.locator(REF_TEXT, has_text=f"· {QUARTERS[1]}").wait_for()
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []


def test_every_layer_renders_and_the_knn_grid_offers_no_change_layers(server, page_and_log, run_folder):
    page, log = page_and_log
    open_dashboard(page, server)
    before = canvas_checksum(page, MAP_CANVAS)
    for label in GP_LAYERS[1:]:
        choose_layer(page, label)
        before = wait_for_new_canvas(page, MAP_CANVAS, before)
        title = page.locator(MAP_TITLE).inner_text()
        slider = page.locator(".geodbk-quarter .noUi-target").first
        if label in CHANGE_LAYERS:  # one map between two quarters: the slider does not apply
            assert f"change {QUARTERS[0]} → {QUARTERS[-1]}" in title, title
            page.wait_for_function("(el) => el.hasAttribute('disabled')", arg=slider.element_handle())
        else:
            assert f"· {QUARTER} ·" in title, title
            page.wait_for_function("(el) => !el.hasAttribute('disabled')", arg=slider.element_handle())
    # the knn baseline has no change layers; its map falls back to the predictive median
    select_model(page, KINDS[1], run_folder)
    page.locator(MAP_TITLE, has_text="Predictive median").wait_for()
    for label in GP_LAYERS[:4]:
        assert page.get_by_role("button", name=label, exact=True).is_visible(), label
    for label in CHANGE_LAYERS:
        page.get_by_role("button", name=label, exact=True).wait_for(state="detached")
    page.locator(".geodbk-kernel canvas").first.wait_for(state="detached")  # knn: no kernel slice
    page.locator(REF_TEXT, has_text="no kernel (not a GP)").wait_for()
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []


def test_click_on_map_shows_the_time_series_there(server, page_and_log, run_folder):
    from geodbk.dataset.spatial_dataset import SpatialDataset

    page, log = page_and_log
    open_dashboard(page, server)
    frame = SpatialDataset.load(run_folder / "dataset.parquet").frame
    page.locator(".geodbk-series canvas").first.wait_for(state="visible")
    # before any click: the series at the default reference point (urban: observed tiles nearby)
    lon, lat = reference_lonlat(page)
    nearby = tiles_within_km(frame, lon, lat, 1.0)
    assert nearby > 0
    wait_for_text(
        page, SERIES_TEXT,
        f"lon {lon:.4f}, lat {lat:.4f}: {len(QUARTERS)} quarters ({QUARTERS[0]}–{QUARTERS[-1]})",
        f"{nearby} observed tile-quarters within 1 km",
    )  # fmt: skip
    # a click moves the series to the clicked point
    lon, lat = click_map(page, 0.40, 0.45)
    nearby = tiles_within_km(frame, lon, lat, 1.0)
    text = wait_for_text(
        page, SERIES_TEXT,
        f"lon {lon:.4f}, lat {lat:.4f}: {len(QUARTERS)} quarters", f"{nearby} observed tile-quarters within 1 km",
    )  # fmt: skip
    title = f"time series at ({lon:.4f}, {lat:.4f}): {len(QUARTERS)} quarters"
    deadline = time.monotonic() + 60
    while title not in (models := bokeh_models(page))["titles"]:
        assert time.monotonic() < deadline, f"no plot titled {title!r}: {models['titles']}"
        page.wait_for_timeout(200)
    # the plotted data: one median per fitted quarter, one point per observed tile nearby
    assert models["series_median"] and set(models["series_median"]) == {len(QUARTERS)}, models
    assert nearby in models["observed_value"], models
    median = re.search(r"median (\d+\.\d) → (\d+\.\d) Mbps", text)
    assert median and all(float(v) > 0 for v in median.groups()), text
    ARTIFACTS.mkdir(exist_ok=True)
    page.mouse.move(1, 1)  # no hover tooltip over the map in the screenshot
    page.locator(".geodbk-series canvas").first.wait_for(state="visible")
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "dashboard_time_series.png"), full_page=True)
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []


def test_polygon_summary_table_follows_the_model_and_quarter(polygon_server, page_and_log, run_folder, polygon_file):
    from geodbk.fit.geomodel import GeoModel
    from geodbk.ingest.regions import read_polygons
    from geodbk.maps.summaries import summarize_polygons

    page, log = page_and_log
    open_dashboard(page, polygon_server)
    heading = page.locator(".geodbk-summary-title div").first
    heading.wait_for()
    assert f"2 polygons of {polygon_file.name}" in heading.inner_text().replace("`", "")
    assert f"{KINDS[0]} · {QUARTER}" in heading.inner_text()
    table = page.locator(".geodbk-summary table").first.inner_text()
    for column in ("NAME", "median_mbps", "lower_mbps", "upper_mbps", "share_below", "cells", "observed_tiles"):
        assert column in table, column
    assert "San Juan box" in table and "Ponce box" in table and "Far away" not in table
    # the numbers are geodbk.maps.summaries.summarize_polygons' for that model and quarter
    model = GeoModel.load(run_folder / "models" / f"{KINDS[0]}.pt")
    boxes = read_polygons(polygon_file)
    expected = summarize_polygons(model, boxes[boxes["NAME"] != "Far away"], time=QUARTER)
    for value in expected["median_mbps"]:
        assert f"{value:.1f}" in table, (value, table)
    # the slider's quarter: a new table for it
    move_quarter_slider(page, "ArrowLeft", QUARTERS[-2])
    page.locator(".geodbk-summary-title div", has_text=f"{KINDS[0]} · {QUARTERS[-2]}").wait_for()
    earlier = page.locator(".geodbk-summary table").first.inner_text()
    assert earlier != table and "San Juan box" in earlier
    # the polygon outlines are a map overlay, on by default
    assert page.get_by_label("polygons", exact=True).is_checked()
    # knn has no joint posterior: the table gives way to a note
    select_model(page, KINDS[1], run_folder)
    page.locator(".geodbk-summary-note div", has_text="need a GP model").wait_for()
    assert page.locator(".geodbk-summary table").count() == 0
    assert log.problems() == [], log.problems()
    assert polygon_server.app_errors() == []


def hover_rows(page, fx: float, fy: float) -> dict[str, str]:
    """Move the mouse to fractions (fx, fy) of the map's canvas; the hover tooltip's rows, label -> value."""
    box = page.locator(MAP_CANVAS).first.bounding_box()
    page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
    tooltip = page.locator(".bk-tooltip-content", has_text="lat:").first
    tooltip.wait_for(state="visible")
    labels, values = tooltip.locator(".bk-tooltip-row-label"), tooltip.locator(".bk-tooltip-row-value")
    return {
        label.strip().rstrip(":"): value.strip()
        for label, value in zip(labels.all_inner_texts(), values.all_inner_texts(), strict=True)
    }


def numbers(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", text)]


def test_hover_reads_out_the_cells_median_interval_and_p_below(server, page_and_log, run_folder):
    """The tooltip at the cursor gives the predictive median, the 95% interval in Mbps and
    P(download < 35 Mbps) of the map's cell there: the model's prediction at that cell's centre
    for the map's quarter, back-transformed by geodbk.prediction."""
    from geodbk.fit.geomodel import GeoModel
    from geodbk.maps.stores import open_grid
    from geodbk.prediction import probability_below, to_data_units

    page, log = page_and_log
    open_dashboard(page, server)
    model = GeoModel.load(run_folder / "models" / f"{KINDS[0]}.pt")
    with open_grid(run_folder / "maps" / f"{KINDS[0]}.nc") as grid:
        x, y, threshold = grid["x"].to_numpy(), grid["y"].to_numpy(), float(grid.attrs["threshold"])
    # somewhere over land (over the sea the readout is NaN)
    for fx, fy in ((0.30, 0.50), (0.40, 0.45), (0.20, 0.55), (0.35, 0.60), (0.45, 0.40)):
        rows = hover_rows(page, fx, fy)
        if "NaN" not in rows[f"median ({QUARTER})"]:
            break
    else:
        pytest.fail(f"no hover over land: {rows}")
    assert set(rows) >= {"lon", "lat", f"median ({QUARTER})", "95% interval", "P(download < 35 Mbps)"}, rows
    assert rows[f"median ({QUARTER})"].endswith(" Mbps") and rows["95% interval"].endswith(" Mbps")
    (median,), (lower, upper), (p_below,) = (
        numbers(rows[f"median ({QUARTER})"]), numbers(rows["95% interval"]), numbers(rows["P(download < 35 Mbps)"])
    )  # fmt: skip
    assert 0 < lower < median < upper and 0 <= p_below <= 1
    # the cell under the cursor (or, at a cell's edge, its neighbour) has exactly these values
    lon, lat = float(rows["lon"]), float(rows["lat"])
    near = [(cx, cy) for cx in x[np.argsort(np.abs(x - lon))[:2]] for cy in y[np.argsort(np.abs(y - lat))[:2]]]
    prediction = model.predict(np.array(near), QUARTER)
    expected = np.column_stack(
        [
            *to_data_units(prediction.mean, prediction.sd),
            probability_below(prediction.mean, prediction.sd, np.log10(threshold)),
        ]
    )
    shown = np.array([median, lower, upper, p_below])
    # the tooltip shows 0.1 Mbps and 0.01; its interval bounds were seen 0.052-0.065 Mbps below the
    # model's at the hovered cell (float32 grid layers), so they get one display step
    tolerance = np.array([0.05, 0.1, 0.1, 0.005]) + 1e-4
    assert (np.abs(expected - shown) <= tolerance).all(axis=1).any(), (rows, near, expected)
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []


BASEMAP_TOGGLE = ".geodbk-basemap"


def tile_renderers_visible(page) -> list[bool]:
    """``visible`` of each Bokeh TileRenderer on the page (the basemap layer)."""
    return page.evaluate(
        """() => {
            const out = [];
            for (const doc of Bokeh.documents) {
                for (const model of doc.all_models) if (model.type === "TileRenderer") out.push(model.visible);
            }
            return out;
        }"""
    )


def wait_for_tile_renderers(page, visible: list[bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (now := tile_renderers_visible(page)) != visible:
        assert time.monotonic() < deadline, f"tile renderers {now}, not {visible}"
        page.wait_for_timeout(200)


def blank_png() -> bytes:
    """A 1 x 1 white PNG, the tile every basemap request gets in these tests."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1 x 1, 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff"))
        + chunk(b"IEND", b"")
    )


def test_basemap_is_on_by_default_and_its_check_box_hides_it(basemap_server, page_and_log):
    """Without --no-basemap the map asks CARTO for OpenStreetMap tiles (answered here in the
    browser, never sent); unchecking the basemap box hides the tile layer, checking it shows it again."""
    import holoviews as hv

    page, log = page_and_log
    tile_url = hv.element.tiles.CartoLight().data.split("{Z}")[0]  # https://.../light_all/
    requested: list[str] = []

    def blank_tile(route) -> None:
        requested.append(route.request.url)
        route.fulfill(status=200, content_type="image/png", body=blank_png())

    page.route(f"{tile_url}**", blank_tile)  # the last route added is tried first
    open_dashboard(page, basemap_server)
    assert page.get_by_text("basemap (OpenStreetMap, CARTO)").is_visible()
    toggle = page.locator(f"{BASEMAP_TOGGLE} input[type=checkbox]")
    assert toggle.is_checked()
    wait_for_tile_renderers(page, [True])
    deadline = time.monotonic() + 60
    while not requested:
        assert time.monotonic() < deadline, "the basemap asked for no tile"
        page.wait_for_timeout(200)
    # hidden: the tile layer is not drawn (BokehJS still fetches tiles for a hidden layer)
    toggle.uncheck()
    wait_for_tile_renderers(page, [False])
    toggle.check()
    wait_for_tile_renderers(page, [True])
    assert log.problems() == [], log.problems()
    assert basemap_server.app_errors() == []


def test_without_a_basemap_the_page_has_no_tile_layer_and_no_toggle(server, page_and_log):
    page, log = page_and_log
    open_dashboard(page, server)
    assert tile_renderers_visible(page) == []
    assert not page.locator(BASEMAP_TOGGLE).is_visible()
    assert log.problems() == [], log.problems()


def test_the_map_fills_the_page_width(server, page_and_log):
    page, log = page_and_log
    open_dashboard(page, server)
    width = page.evaluate("() => document.documentElement.clientWidth")
    box = page.locator(MAP_CANVAS).first.bounding_box()
    assert box["width"] > 0.9 * width, (box, width)
    page.set_viewport_size({"width": 1600, "height": 1300})
    try:
        deadline = time.monotonic() + 30
        while (wider := page.locator(MAP_CANVAS).first.bounding_box())["width"] < 0.9 * 1600:
            assert time.monotonic() < deadline, f"the map did not follow the window: {wider}"
            page.wait_for_timeout(200)
    finally:
        page.set_viewport_size({"width": 1180, "height": 1300})
    assert log.problems() == [], log.problems()


def test_dashboard_takes_polygons_from_its_flag_or_the_environment(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.syspath_prepend(str(APP.parent))
    spec = importlib.util.spec_from_file_location("dashboard_app", APP)
    app = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, app)  # dataclasses look their module up
    spec.loader.exec_module(app)
    monkeypatch.delenv("GEODBK_POLYGONS", raising=False)
    assert app.parse_args(["--run", "r"]).polygons is None
    assert app.parse_args(["--run", "r", "--polygons", "a.geojson"]).polygons == Path("a.geojson")
    monkeypatch.setenv("GEODBK_POLYGONS", str(tmp_path / "b.geojson"))
    assert app.parse_args(["--run", "r"]).polygons == tmp_path / "b.geojson"
    assert app.parse_args(["--polygons", "a.geojson"]).polygons == Path("a.geojson")  # the flag wins
    assert app.parse_args(["--run", "r"]).no_basemap is False
    assert app.parse_args(["--run", "r", "--no-basemap"]).no_basemap is True


def test_missing_chromium_skips_locally_but_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        chromium_executable(("/nonexistent/chromium", None))
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception):
        chromium_executable(("/nonexistent/chromium", None))


# --- the decision view and what informs a place ----------------------------------------------
DECISIONS_CANVAS = ".geodbk-decisions canvas"
DECISIONS_TEXT = ".geodbk-decisions-text div"


def open_decisions(page) -> None:
    """Open the Decisions tab and wait for its map (the tab renders when first shown)."""
    page.locator(".bk-tab", has_text="Decisions").first.click()
    page.locator(DECISIONS_CANVAS).first.wait_for(state="visible")


def decision_sources(page) -> dict:
    """The decision map's data: ``p_meets`` and ``h3`` of its hexagons and ``rank`` of the plan's."""
    return page.evaluate(
        """() => {
            const out = {};
            for (const doc of Bokeh.documents) {
                for (const model of doc.all_models) {
                    if (model.type !== "ColumnDataSource") continue;
                    if (model.name === "decision_hexagons") {
                        out.p_meets = Array.from(model.data.p_meets);
                        out.h3 = Array.from(model.data.h3);
                    }
                    if (model.name === "decision_plan") {
                        out.rank = Array.from(model.data.rank);
                        out.label = Array.from(model.data.label);
                    }
                }
            }
            return out;
        }"""
    )


def glyph_types(page) -> list[str]:
    """The glyph type of every Bokeh renderer on the page."""
    return page.evaluate(
        """() => {
            const out = [];
            for (const doc of Bokeh.documents) {
                for (const m of doc.all_models) if (m.type === "GlyphRenderer") out.push(m.glyph.type);
            }
            return out;
        }"""
    )


def hover_decision(page, benchmark: str) -> dict[str, str]:
    """The decision map's hover rows (label -> value) over a hexagon near the middle of the map."""
    box = page.locator(DECISIONS_CANVAS).first.bounding_box()
    for fx, fy in ((0.45, 0.5), (0.35, 0.5), (0.55, 0.45), (0.3, 0.55), (0.5, 0.6), (0.4, 0.4)):
        page.mouse.move(box["x"] + fx * box["width"], box["y"] + fy * box["height"])
        tooltip = page.locator(".bk-tooltip-content", has_text=f"P(meets {benchmark})").first
        try:
            tooltip.wait_for(state="visible", timeout=3000)
        except Exception:
            continue
        labels, values = tooltip.locator(".bk-tooltip-row-label"), tooltip.locator(".bk-tooltip-row-value")
        return {
            label.strip().rstrip(":"): value.strip()
            for label, value in zip(labels.all_inner_texts(), values.all_inner_texts(), strict=True)
        }
    pytest.fail("no hexagon under the mouse")


def test_decision_view_colours_hexagons_by_p_meets_and_follows_the_benchmark(server, page_and_log, run_folder):
    """The Decisions tab draws every hexagon of the run's table coloured by its P(meets 35/3),
    reads it out on hover with the medians and observed tiles, outlines the plan's visits with
    their rank, and recolours for 5/1 with P(meets) recomputed from the table (higher everywhere)."""
    import geopandas as gpd

    from geodbk.viewer import p_meets

    page, log = page_and_log
    table = gpd.read_parquet(run_folder / "decisions" / f"{KINDS[0]}_h3.parquet")
    plan = gpd.read_parquet(run_folder / "decisions" / f"{KINDS[0]}_plan.parquet")
    open_dashboard(page, server)
    open_decisions(page)
    wait_for_text(page, DECISIONS_TEXT, "35/3 Mbps", f"of {len(table):,} hexagons likely meet it")
    data = decision_sources(page)
    assert data["h3"] == table["h3"].tolist()
    np.testing.assert_allclose(data["p_meets"], table["p_meets"], atol=1e-9)
    assert data["rank"] == list(range(1, len(plan) + 1)) and data["label"][0] == "1"
    assert {"Patches", "Text", "Scatter"} <= set(glyph_types(page))
    assert distinct_colours(page, DECISIONS_CANVAS) > 10
    # the hover readout is the hexagon's row of the table
    rows = hover_decision(page, "35/3")
    assert set(rows) >= {"hexagon", "P(meets 35/3)", "median download", "median upload", "observed tiles"}, rows
    row = table.set_index("h3").loc[rows["hexagon"]]
    assert float(rows["P(meets 35/3)"]) == pytest.approx(row["p_meets"], abs=0.006)
    assert numbers(rows["median download"])[0] == pytest.approx(row["median_download_mbps"], abs=0.06)
    assert numbers(rows["median upload"])[0] == pytest.approx(row["median_upload_mbps"], abs=0.06)
    assert int(rows["observed tiles"]) == row["observed_tiles"]
    # 5/1: recoloured from the table, every hexagon likelier to meet it
    before = canvas_checksum(page, DECISIONS_CANVAS)
    page.locator(".geodbk-benchmark button", has_text="5/1").click()
    wait_for_text(page, DECISIONS_TEXT, "5/1 Mbps")
    wait_for_new_canvas(page, DECISIONS_CANVAS, before)
    lower = np.asarray(decision_sources(page)["p_meets"])
    np.testing.assert_allclose(lower, p_meets(table, "5/1"), atol=1e-9)
    assert np.all((lower > table["p_meets"]) | (table["p_meets"] == 1.0))
    page.mouse.move(1, 1)
    rows_5 = hover_decision(page, "5/1")
    assert float(rows_5["P(meets 5/1)"]) >= float(table.set_index("h3").loc[rows_5["hexagon"], "p_meets"]) - 0.006
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard_decisions.png"), full_page=True)
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []


def test_a_download_only_model_gets_a_note_instead_of_decisions(server, page_and_log, run_folder):
    page, log = page_and_log
    open_dashboard(page, server)
    select_model(page, KINDS[1], run_folder)
    page.locator(".bk-tab", has_text="Decisions").first.click()
    note = page.locator(".geodbk-decisions-note div", has_text="Fit download and upload together")
    note.wait_for()
    assert f"No decision view for {KINDS[1]}" in note.inner_text()
    assert page.locator(DECISIONS_CANVAS).count() == 0
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []


HALF_PATTERN = re.compile(r"falls to 0\.5 at (?:about )?(\d+\.\d) km|stays above 0\.5 out to (\d+) km")


def test_correlation_selector_switches_prior_and_posterior_and_reads_the_half_distance(
    server, page_and_log, run_folder
):
    """Under the map, the clicked point's correlation with every cell: the posterior's by default
    (its 0.5-distance read out, as geodbk.viewer computes it from the model), the prior kernel's
    on the other button (broader: a nearly flat sheet)."""
    from geodbk.viewer import Catalog, cell_km, distance_km, grid_cells_lonlat, half_distance

    page, log = page_and_log
    open_dashboard(page, server)
    text = wait_for_text(page, REF_TEXT, "posterior correlation over the grid", "0.5")
    fit = Catalog.scan([run_folder]).fits[0]
    lon, lat = fit.default_reference()  # the page shows it to 4 decimals, a few metres off
    shown = reference_lonlat(page)
    assert shown == (pytest.approx(lon, abs=5e-5), pytest.approx(lat, abs=5e-5))
    lonlat, _ = grid_cells_lonlat(fit.grid())
    rho = fit.posterior_correlation((lon, lat), QUARTER)
    half = half_distance(distance_km(lonlat[:, 0], lonlat[:, 1], lon, lat), rho, cell_km(lonlat))
    assert half.text() in text, (half.text(), text)
    posterior = re.search(r"correlation over the grid: min -?[\d.]+, median (-?[\d.]+)", text)
    assert posterior and float(posterior.group(1)) == pytest.approx(float(np.nanmedian(rho)), abs=1e-4)
    assert HALF_PATTERN.search(text), text
    before = canvas_checksum(page, ".geodbk-kernel canvas")
    page.locator(".geodbk-slice-kind button", has_text="prior correlation").click()
    prior_text = wait_for_text(page, REF_TEXT, "prior correlation over the grid")
    wait_for_new_canvas(page, ".geodbk-kernel canvas", before)
    prior = re.search(r"correlation over the grid: min -?[\d.]+, median (-?[\d.]+)", prior_text)
    assert prior and float(prior.group(1)) > float(posterior.group(1))
    match = HALF_PATTERN.search(prior_text)
    assert match, prior_text
    prior_km = float(match.group(1) or match.group(2))
    assert half.km is None or prior_km > half.km
    assert reference_lonlat(page) == shown
    # and back: the posterior again, for the same point
    page.locator(".geodbk-slice-kind button", has_text="posterior correlation").click()
    wait_for_text(page, REF_TEXT, "posterior correlation over the grid")
    assert log.problems() == [], log.problems()
    assert server.app_errors() == []
