"""The dashboard's decision view (the "Decisions" tab of ``apps/dashboard.py``): the H3 hexagons
of a download/upload model's run coloured by P(meets) of a chosen benchmark, their hover
readout, and the plan's next visits outlined with their rank.

The numbers come from :mod:`geodbk.viewer.decisions` (the run's hexagon table and plan; P(meets)
of another benchmark recomputed from the table). The map is a plain Bokeh figure, not HoloViews:
its ~18,000 hexagons are one ``patches`` glyph, sent once, and a new benchmark changes only the
``p_meets`` column of its data source (HoloViews' Polygons would rebuild every hexagon).
"""

from __future__ import annotations

import numpy as np
import panel as pn
from bokeh.models import ColorBar, ColumnDataSource, FixedTicker, HoverTool, LinearColorMapper
from bokeh.plotting import figure
from holoviews.plotting.util import process_cmap

from geodbk.viewer import (
    BENCHMARK_CHOICES,
    NO_DECISIONS,
    Fit,
    benchmark_options,
    decision_summary,
    outline_paths,
    p_meets,
    plan_marks,
    table_benchmark,
)

#: Pixels: the decision map's height (it fills the page's width).
DECISION_MAP_HEIGHT = 560
#: P(meets) colours: red (likely not) through white (0.5, a toss-up) to blue (likely meets).
P_MEETS_CMAP = "RdBu"


def p_label(benchmark: str) -> str:
    """``"P(meets 35/3)"``: the colour bar's and the hover's name of P(meets ``benchmark``)."""
    return f"P(meets {benchmark})"


def metres(rings: list[np.ndarray]) -> list[list[int]]:
    """Mercator rings rounded to whole metres, as plain lists (a tenth of the JSON of float arrays)."""
    return [np.rint(ring).astype(np.int64).tolist() for ring in rings]


class DecisionMap:
    """A Bokeh map of the hexagons coloured by P(meets), the plan's hexagons outlined and ranked,
    and the region outline; :meth:`show` recolours it for another benchmark in place."""

    def __init__(self, fit: Fit, benchmark: str) -> None:
        self.fit = fit
        table = fit.hexagons()
        columns = dict(fit.hexagon_columns())
        columns["xs"], columns["ys"] = metres(columns["xs"]), metres(columns["ys"])
        columns["p_meets"] = p_meets(table, benchmark)
        self.source = ColumnDataSource(columns, name="decision_hexagons")
        palette = process_cmap(P_MEETS_CMAP, 256)
        mapper = LinearColorMapper(palette=palette, low=0.0, high=1.0, nan_color="#d9d9d9")
        fig = figure(
            sizing_mode="stretch_width",
            height=DECISION_MAP_HEIGHT,
            match_aspect=True,
            tools="pan,wheel_zoom,reset,save",
            active_scroll="wheel_zoom",
            x_axis_type=None,
            y_axis_type=None,
            toolbar_location="right",
            title="",
        )
        fig.grid.visible = False
        hexagons = fig.patches(
            "xs", "ys", source=self.source, fill_color={"field": "p_meets", "transform": mapper},
            fill_alpha=0.9, line_color=None,
        )  # fmt: skip
        self.hover = HoverTool(renderers=[hexagons], tooltips=self._tooltips(benchmark))
        fig.add_tools(self.hover)
        outline = outline_paths(fit.dataset().region.geometry)
        fig.multi_line([r[:, 0] for r in outline], [r[:, 1] for r in outline], line_color="black", line_width=1)
        plan = fit.plan()
        self.plan_size = 0 if plan is None else len(plan)
        if plan is not None and len(plan):
            marks = plan_marks(plan)
            marks["xs"], marks["ys"] = metres(marks["xs"]), metres(marks["ys"])
            visits = ColumnDataSource(marks, name="decision_plan")
            fig.patches("xs", "ys", source=visits, fill_alpha=0.0, line_color="black", line_width=2.5)
            fig.scatter("x", "y", source=visits, size=17, fill_color="white", line_color="black", line_width=1.5)
            fig.text(
                "x", "y", text="label", source=visits, text_align="center", text_baseline="middle",
                text_font_size="9pt", text_font_style="bold", text_color="black",
            )  # fmt: skip
        self.colour_bar = ColorBar(
            color_mapper=mapper, ticker=FixedTicker(ticks=[0.0, 0.25, 0.5, 0.75, 1.0]), title=p_label(benchmark)
        )
        fig.add_layout(self.colour_bar, "right")
        self.figure = fig
        self.benchmark = benchmark
        self._title(benchmark)

    @staticmethod
    def _tooltips(benchmark: str) -> list[tuple[str, str]]:
        return [
            ("hexagon", "@h3"),
            (p_label(benchmark), "@p_meets{0.00}"),
            ("median download", "@download{0.0} Mbps"),
            ("median upload", "@upload{0.0} Mbps"),
            ("observed tiles", "@observed_tiles"),
        ]

    def _title(self, benchmark: str) -> None:
        table = self.fit.hexagons()
        quarter = f" · {table['quarter'].iloc[0]}" if "quarter" in table else ""
        download, upload = benchmark.split("/")
        self.figure.title.text = (
            f"{p_label(benchmark)}: download ≥ {download} and upload ≥ {upload} Mbps · {self.fit.kind}{quarter}"
        )

    def show(self, benchmark: str) -> np.ndarray:
        """Recolour for ``benchmark`` (only the ``p_meets`` column is sent); returns the new P(meets)."""
        p = p_meets(self.fit.hexagons(), benchmark)
        self.source.data["p_meets"] = p
        self.hover.tooltips = self._tooltips(benchmark)
        self.colour_bar.title = p_label(benchmark)
        self._title(benchmark)
        self.benchmark = benchmark
        return p


class DecisionViews:
    """The decision tab of :class:`dashboard.Dashboard`, which owns ``self.benchmark`` (the
    benchmark buttons) and calls :meth:`_follow_benchmark_options` when the model changes."""

    _decision_map: DecisionMap | None = None

    def _follow_benchmark_options(self, fit: Fit | None) -> None:
        """The benchmark buttons of ``fit``'s table, at the table's own benchmark."""
        table = fit.hexagons() if fit is not None else None
        if table is None:
            self.benchmark.param.update(options=list(BENCHMARK_CHOICES), value="35/3")
            return
        self.benchmark.param.update(options=benchmark_options(table), value=table_benchmark(table))

    def _recolour(self, *_: object) -> None:
        """A new benchmark: the shown map recoloured in place, and its summary line."""
        shown = self._decision_map
        if shown is None or shown.benchmark == self.benchmark.value or shown.fit != self.fit:
            return
        p = shown.show(self.benchmark.value)
        self.decision_text.object = decision_summary(p, self.benchmark.value).text()

    def decision_view(self, fit: Fit | None) -> pn.viewable.Viewable:
        """The decision map of ``fit``'s hexagon table, or a one-line note when its run has none."""
        self._decision_map = None
        if fit is None:
            return pn.pane.Markdown("")
        if fit.hexagons() is None:
            targets = " and ".join(fit.model().targets)
            return pn.pane.Alert(
                NO_DECISIONS.format(kind=fit.kind, targets=targets),
                alert_type="secondary",
                css_classes=["geodbk-decisions-note"],
            )
        shown = DecisionMap(fit, self.benchmark.value)
        self._decision_map = shown
        p = shown.source.data["p_meets"]
        self.decision_text.object = decision_summary(p, shown.benchmark).text()
        return pn.Column(
            pn.Row(pn.pane.Markdown("**Benchmark** (download/upload Mbps)", margin=(12, 10)), self.benchmark),
            self.decision_text,
            pn.Column(
                pn.pane.Bokeh(shown.figure, sizing_mode="stretch_width"),
                sizing_mode="stretch_width",
                css_classes=["geodbk-decisions"],
            ),
            pn.pane.Markdown(self._plan_text(fit), css_classes=["geodbk-plan-text"]),
            sizing_mode="stretch_width",
        )

    @staticmethod
    def _plan_text(fit: Fit) -> str:
        """What the outlined hexagons are."""
        plan = fit.plan()
        if plan is None or len(plan) == 0:
            return "No visit plan in this run."
        benchmark = table_benchmark(fit.hexagons())
        visits = plan.sort_values("rank")
        before, after = float(visits["expected_wrong_before"].iloc[0]), float(visits["expected_wrong_after"].iloc[-1])
        return (
            f"Outlined and numbered: the plan's next **{len(plan)} visits** (1 = first), chosen for "
            f"{benchmark}; after them the expected number of wrong meets/does-not-meet decisions falls "
            f"from {before:.1f} to {after:.1f}."
        )
