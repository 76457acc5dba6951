"""A simulation's timeline as a PNG, drawn with Pillow (no matplotlib): `plot_timeline(report, path)`.

Three panels over the same time axis: arrivals and each policy's ready capacity (events/s), the
backlog (events waiting or in service), the replicas asked for; one colour per policy, a legend,
ticks and labels on both axes. Each series is reduced to one value per pixel column (the largest,
so that a spike stays visible). The same report gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from consumers.ops.capacity.report import SimulationReport

__all__ = ["HEIGHT", "WIDTH", "plot_timeline"]

WIDTH, HEIGHT = 1200, 900
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 20, 40, 50
_GAP = 30
_COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (140, 86, 75)]
_BLACK, _GREY, _LIGHT = (0, 0, 0), (110, 110, 110), (225, 225, 225)

Font = ImageFont.ImageFont | ImageFont.FreeTypeFont


def _nice_step(span: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 x 10^k) giving about `ticks` ticks over `span`."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * power:
            return float(m * power)
    return float(10 * power)


def _label(value: float) -> str:
    if abs(value) >= 10000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _columns(
    t: Sequence[float], values: Sequence[float], t_max: float, width: int
) -> list[tuple[int, float]]:
    """(pixel column, largest value in it) for each column that holds a sample."""
    out: dict[int, float] = {}
    for x, v in zip(t, values, strict=True):
        col = min(width - 1, int(x / t_max * (width - 1)))
        if col not in out or v > out[col]:
            out[col] = v
    return sorted(out.items())


class _Panel:
    def __init__(
        self, draw: ImageDraw.ImageDraw, font: Font, box: tuple[int, int, int, int], t_max: float
    ) -> None:
        self.draw, self.font = draw, font
        self.left, self.top, self.right, self.bottom = box
        self.t_max = t_max
        self.y_max = 1.0

    def axes(self, title: str, y_max: float, x_label: bool) -> None:
        step = _nice_step(y_max)
        self.y_max = max(step, math.ceil(y_max / step) * step)
        d = self.draw
        tick = 0.0
        while tick <= self.y_max + 1e-9:
            y = self.y(tick)
            d.line([(self.left, y), (self.right, y)], fill=_LIGHT)
            d.line([(self.left - 5, y), (self.left, y)], fill=_BLACK)
            d.text((self.left - 8, y), _label(tick), fill=_BLACK, font=self.font, anchor="rm")
            tick += step
        t_step = _nice_step(self.t_max, 8)
        tick = 0.0
        while tick <= self.t_max + 1e-9:
            x = self.x(tick)
            d.line([(x, self.bottom), (x, self.bottom + 5)], fill=_BLACK)
            if x_label:
                d.text((x, self.bottom + 8), _label(tick), fill=_BLACK, font=self.font, anchor="mt")
            tick += t_step
        d.rectangle([self.left, self.top, self.right, self.bottom], outline=_BLACK)
        d.text((self.left, self.top - 6), title, fill=_BLACK, font=self.font, anchor="lb")

    def x(self, t: float) -> float:
        return self.left + (self.right - self.left) * t / self.t_max

    def y(self, v: float) -> float:
        return self.bottom - (self.bottom - self.top) * min(v, self.y_max) / self.y_max

    def series(
        self, t: Sequence[float], values: Sequence[float], colour: tuple[int, int, int], width: int
    ) -> None:
        cols = _columns(t, values, self.t_max, self.right - self.left)
        points = [(self.left + c, self.y(v)) for c, v in cols]
        if len(points) > 1:
            self.draw.line(points, fill=colour, width=width)

    def legend(self, entries: Sequence[tuple[str, tuple[int, int, int]]]) -> None:
        widest = max(self.draw.textlength(name, font=self.font) for name, _ in entries)
        x, y = self.right - 10 - widest, self.top + 8
        self.draw.rectangle(
            [x - 40, y - 4, self.right - 4, y + 16 * len(entries)], fill="white", outline=_LIGHT
        )
        for name, colour in entries:
            self.draw.line([(x - 32, y + 6), (x - 8, y + 6)], fill=colour, width=3)
            self.draw.text((x, y), name, fill=_BLACK, font=self.font, anchor="lt")
            y += 16


def plot_timeline(report: SimulationReport, path: Path) -> Path:
    """Draw the report's timelines into a PNG of WIDTH x HEIGHT at `path`."""
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    scenario = report.scenario
    t_max = scenario.duration_s
    names = list(report.timelines)
    colours = {name: _COLOURS[i % len(_COLOURS)] for i, name in enumerate(names)}
    first = report.timelines[names[0]]
    title = f"{scenario.name} (seed {report.seed}): objective {scenario.objective_s:g} s, time in s"
    draw.text((WIDTH // 2, 8), title, fill=_BLACK, font=font, anchor="mt")

    height = (HEIGHT - _TOP - _BOTTOM - 2 * _GAP) // 3
    boxes = [
        (_LEFT, _TOP + i * (height + _GAP), WIDTH - _RIGHT, _TOP + i * (height + _GAP) + height)
        for i in range(3)
    ]
    rates = _Panel(draw, font, boxes[0], t_max)
    peak_rate = max([*first.arrivals, *(c for tl in report.timelines.values() for c in tl.capacity), 1.0])
    rates.axes("arrivals and ready capacity (events/s)", peak_rate, x_label=False)
    rates.series(first.t, first.arrivals, _GREY, 1)
    for name in names:
        rates.series(report.timelines[name].t, report.timelines[name].capacity, colours[name], 2)
    rates.legend([("arrivals", _GREY), *((f"{n} capacity", colours[n]) for n in names)])

    backlog = _Panel(draw, font, boxes[1], t_max)
    backlog.axes(
        "backlog (events waiting or in service)",
        max([1.0, *(max(tl.backlog) for tl in report.timelines.values())]),
        x_label=False,
    )
    for name in names:
        backlog.series(report.timelines[name].t, report.timelines[name].backlog, colours[name], 2)
    backlog.legend([(n, colours[n]) for n in names])

    replicas = _Panel(draw, font, boxes[2], t_max)
    replicas.axes(
        "replicas (asked for, starting included)",
        max([1.0, *(max(tl.replicas) for tl in report.timelines.values())]),
        x_label=True,
    )
    for name in names:
        replicas.series(report.timelines[name].t, report.timelines[name].replicas, colours[name], 2)
    replicas.legend([(n, colours[n]) for n in names])

    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=False)
    return path
