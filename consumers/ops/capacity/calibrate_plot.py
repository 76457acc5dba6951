"""`docstream calibrate`'s PNG: the real run and the simulation, curve against curve (Pillow).

Two panels over the run's time: the time lag (seconds, with the objective drawn across) and the
replicas asked for; per policy one colour, the real run a thick line, the simulation a thin one
of a lighter shade. The panels are `consumers.ops.capacity.plot`'s (`_Panel`), so that both
commands draw alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from consumers.ops.capacity.calibrate_compare import Curve
from consumers.ops.capacity.plot import _Panel  # the shared panel (axes, series, legend)

__all__ = ["plot_calibration"]

WIDTH, HEIGHT = 1200, 760
_LEFT, _RIGHT, _TOP, _BOTTOM, _GAP = 80, 20, 40, 50, 40
_COLOURS = {"reactive": (214, 39, 40), "docstream": (31, 119, 180)}
_OTHER = (44, 160, 44)
_BLACK, _GREY = (0, 0, 0), (110, 110, 110)


def _lighter(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    r, g, b = colour
    return (r + (255 - r) // 2, g + (255 - g) // 2, b + (255 - b) // 2)


def plot_calibration(
    curves: Mapping[str, tuple[Curve, Curve]], objective_s: float, path: Path, title: str = ""
) -> Path:
    """Draw each policy's (real, simulated) curves into a PNG at `path`."""
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    everything = [c for pair in curves.values() for c in pair]
    t_max = max([1.0, *(c.t[-1] for c in everything if c.t)])
    heading = (
        title or f"calibration: real (thick) and simulated (thin), objective {objective_s:g} s, time in s"
    )
    draw.text((WIDTH // 2, 8), heading, fill=_BLACK, font=font, anchor="mt")
    height = (HEIGHT - _TOP - _BOTTOM - _GAP) // 2
    boxes = [
        (_LEFT, _TOP + i * (height + _GAP), WIDTH - _RIGHT, _TOP + i * (height + _GAP) + height)
        for i in range(2)
    ]
    colours = {name: _COLOURS.get(name, _OTHER) for name in curves}
    legend = [
        entry
        for name in curves
        for entry in ((f"{name} real", colours[name]), (f"{name} sim", _lighter(colours[name])))
    ]

    lag = _Panel(draw, font, boxes[0], t_max)
    lag.axes(
        "time lag (s): the oldest unsettled event, as the lag model sees it",
        max([objective_s * 1.5, *(max(c.time_lag, default=0.0) for c in everything)]),
        x_label=False,
    )
    y = lag.y(objective_s)
    draw.line([(lag.left, y), (lag.right, y)], fill=_GREY, width=1)
    draw.text((lag.left + 4, y - 2), f"objective {objective_s:g} s", fill=_GREY, font=font, anchor="lb")
    for name, (real, sim) in curves.items():
        lag.series(sim.t, sim.time_lag, _lighter(colours[name]), 2)
        lag.series(real.t, real.time_lag, colours[name], 3)
    lag.legend(legend)

    replicas = _Panel(draw, font, boxes[1], t_max)
    replicas.axes(
        "replicas (asked for, starting included)",
        max([1.0, *(max(c.replicas, default=0.0) for c in everything)]),
        x_label=True,
    )
    for name, (real, sim) in curves.items():
        replicas.series(sim.t, sim.replicas, _lighter(colours[name]), 2)
        replicas.series(real.t, real.replicas, colours[name], 3)
    replicas.legend(legend)

    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=False)
    return path
