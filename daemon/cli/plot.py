"""Charts on an `svg.Svg`: an x/y plot (line series, markers, shaded spans, axes with ticks and labels,
a legend) and stacked bars. What `spx report` and bench/figures.py draw with.

Each drawn thing carries a class naming what it is (`series`, `marker`, `span`, `bar`, plus the
caller's name, e.g. `series step`, `marker failure`, `span recovery`), so a reader of the file — a
test, a stylesheet — finds the step line or counts the failures without knowing the pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from spx.daemon.cli.svg import Svg, num

# Colour-blind-safe colours readable on white (Okabe–Ito, then Tol's muted), picked in order.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000",
           "#882255", "#44AA99", "#999933", "#332288", "#AA4499", "#888888")


def nice_ticks(low: float, high: float, count: int = 6) -> list[float]:
    """About `count` round tick values (1, 2 or 5 × 10^k apart) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step + 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-6:
        if value >= low - step * 1e-6:
            ticks.append(round(value, 10))
        value += step
    return ticks


def nice_top(high: float, count: int = 6) -> float:
    """The round value an axis from 0 ends at: the first tick of nice_ticks' spacing at or above `high`."""
    if high <= 0:
        return 1.0
    ticks = nice_ticks(0.0, high, count)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else high
    return ticks[-1] if ticks[-1] >= high else ticks[-1] + step


def tick_label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else num(value)


@dataclass
class Box:
    """The plotting area inside the figure, in pixels: left, top, width, height."""

    left: float
    top: float
    width: float
    height: float

    @property
    def bottom(self) -> float:
        return self.top + self.height

    @property
    def right(self) -> float:
        return self.left + self.width


@dataclass
class Plot:
    """Data coordinates (x from `x_range`, y from `y_range`) mapped onto `box` of `svg`."""

    svg: Svg
    box: Box
    x_range: tuple[float, float]
    y_range: tuple[float, float]
    # (kind: line, marker, span or bar; colour; label), in the order the legend lists them
    legend_entries: list[tuple[str, str, str]] = field(default_factory=list)

    def x(self, value: float) -> float:
        low, high = self.x_range
        return self.box.left + (value - low) / ((high - low) or 1.0) * self.box.width

    def y(self, value: float) -> float:
        low, high = self.y_range
        return self.box.bottom - (value - low) / ((high - low) or 1.0) * self.box.height

    def axes(self, x_label: str, y_label: str, title: str | None = None) -> None:
        s, b = self.svg, self.box
        s.begin_group(class_="axes")
        for value in nice_ticks(*self.y_range):
            s.line(b.left, self.y(value), b.right, self.y(value), stroke="#e5e5e5")
            s.line(b.left - 4, self.y(value), b.left, self.y(value), stroke="#333")
            s.text(b.left - 7, self.y(value) + 4, tick_label(value), text_anchor="end", class_="tick y")
        for value in nice_ticks(*self.x_range):
            s.line(self.x(value), b.bottom, self.x(value), b.bottom + 4, stroke="#333")
            s.text(self.x(value), b.bottom + 17, tick_label(value), text_anchor="middle", class_="tick x")
        s.rect(b.left, b.top, b.width, b.height, fill="none", stroke="#333")
        s.text(b.left + b.width / 2, b.bottom + 34, x_label, text_anchor="middle", class_="label x")
        s.text(b.left - 46, b.top + b.height / 2, y_label, text_anchor="middle", class_="label y",
               transform=f"rotate(-90 {num(b.left - 46)} {num(b.top + b.height / 2)})")
        if title:
            s.text(b.left, b.top - 10, title, font_size=14, font_weight="bold", class_="title")
        s.end_group()

    def line(self, points: list[tuple[float, float]], label: str, name: str, colour: str,
             width: float = 2.0, dashed: bool = False) -> None:
        """A line series through `points` (data coordinates), drawn as one polyline."""
        self.svg.polyline([(self.x(x), self.y(y)) for x, y in points], stroke=colour, stroke_width=width,
                          stroke_dasharray="6 4" if dashed else None, class_=f"series {name}", data_label=label)
        self.legend_entries.append(("line", colour, label))

    def markers(self, points: list[tuple[float, float]], label: str, name: str, colour: str,
                titles: list[str] | None = None) -> None:
        """One × per point; `titles` (one per point) become each marker's tooltip."""
        for i, (x, y) in enumerate(points):
            self.svg.begin_group(class_=f"marker {name}")
            if titles:
                self.svg.element("title", titles[i])
            self.svg.cross(self.x(x), self.y(y), 5, stroke=colour, stroke_width=2.5)
            self.svg.end_group()
        if points:
            self.legend_entries.append(("marker", colour, label))

    def span(self, start: float, end: float, label: str, name: str, colour: str) -> None:
        """A shaded band over the x interval [start, end], the plot's full height."""
        left, right = self.x(max(start, self.x_range[0])), self.x(min(end, self.x_range[1]))
        self.svg.rect(left, self.box.top, right - left, self.box.height, fill=colour, fill_opacity=0.18,
                      class_=f"span {name}")
        if not any(kind == "span" and text == label for kind, _, text in self.legend_entries):
            self.legend_entries.append(("span", colour, label))

    def legend(self, x: float | None = None, y: float | None = None) -> None:
        """The entries drawn so far, one per label, top-left inside the plot unless placed."""
        s = self.svg
        left = self.box.left + 10 if x is None else x
        top = self.box.top + 10 if y is None else y
        s.begin_group(class_="legend")
        for i, (kind, colour, label) in enumerate(self.legend_entries):
            row = top + 16 * i
            if kind == "line":
                s.line(left, row + 6, left + 18, row + 6, stroke=colour, stroke_width=2)
            elif kind == "marker":
                s.cross(left + 9, row + 6, 4, stroke=colour, stroke_width=2)
            elif kind == "bar":
                s.rect(left, row, 18, 12, fill=colour)
            else:
                s.rect(left, row, 18, 12, fill=colour, fill_opacity=0.3)
            s.text(left + 24, row + 10, label)
        s.end_group()


def bars(svg: Svg, box: Box, categories: list[str], stacks: list[tuple[str, list[float]]], y_label: str,
         title: str | None = None, colours: list[str] | None = None) -> Plot:
    """Stacked vertical bars: one per category, its segments `stacks` (label, one value per
    category) bottom to top; each segment's value is written on it when there is room."""
    totals = [sum(values[i] for _, values in stacks) for i in range(len(categories))]
    top = max([*totals, 0.0]) or 1.0
    plot = Plot(svg, box, (0.0, float(len(categories) or 1)), (0.0, nice_top(top)))
    svg.begin_group(class_="axes")
    for value in nice_ticks(*plot.y_range):
        svg.line(box.left, plot.y(value), box.right, plot.y(value), stroke="#e5e5e5")
        svg.text(box.left - 7, plot.y(value) + 4, tick_label(value), text_anchor="end", class_="tick y")
    svg.rect(box.left, box.top, box.width, box.height, fill="none", stroke="#333")
    svg.text(box.left - 46, box.top + box.height / 2, y_label, text_anchor="middle", class_="label y",
             transform=f"rotate(-90 {num(box.left - 46)} {num(box.top + box.height / 2)})")
    if title:
        svg.text(box.left, box.top - 10, title, font_size=14, font_weight="bold", class_="title")
    svg.end_group()
    slot = box.width / max(len(categories), 1)
    for i, category in enumerate(categories):
        base = 0.0
        for k, (label, values) in enumerate(stacks):
            colour = (colours or PALETTE)[k % len(colours or PALETTE)]
            low, high = plot.y(base), plot.y(base + values[i])
            svg.rect(box.left + slot * (i + 0.2), high, slot * 0.6, low - high, fill=colour,
                     class_="bar", data_segment=label, data_category=category,
                     data_value=float(values[i]))
            if low - high >= 14:
                svg.text(box.left + slot * (i + 0.5), (low + high) / 2 + 4, tick_label(values[i]),
                         text_anchor="middle", fill="white", font_size=10)
            base += values[i]
        if len(category) * 5.5 < slot:  # 10 px text: about 5.5 px a character
            svg.text(box.left + slot * (i + 0.5), box.bottom + 16, category, text_anchor="middle", font_size=10,
                     class_="tick x")
        else:  # too long for its slot: slanted, ending under the bar
            x, y = box.left + slot * (i + 0.5), box.bottom + 12
            svg.text(x, y, category, text_anchor="end", font_size=10, class_="tick x",
                     transform=f"rotate(-30 {num(x)} {num(y)})")
    if len(stacks) > 1:  # listed top to bottom, as the segments are stacked
        for k, (label, _) in reversed(list(enumerate(stacks))):
            plot.legend_entries.append(("bar", (colours or PALETTE)[k % len(colours or PALETTE)], label))
    return plot
