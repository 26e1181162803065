"""A small SVG writer, stdlib only: the pictures of `spx report` and `make bench` need lines,
markers, shaded spans, rectangles and text, and a plotting library is not worth its weight in a
root daemon's install.

Deterministic: elements come out in the order they were added, attributes in the order given, and
every number is written with at most two decimals (`num`), so the same data gives the same bytes
(a test compares two renderings; a figure in git changes only when its data does). Every text and
attribute value is escaped (a job name is the user's: `<`, `&` and quotes in it stay text).
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

Attr = str | int | float | None


def num(value: float) -> str:
    """A coordinate as short, stable text: 2 decimals at most, no trailing zeros, no `-0`."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _attrs(attrs: dict[str, Attr]) -> str:
    out = []
    for key, value in attrs.items():
        if value is None:
            continue
        text = num(value) if isinstance(value, float) else str(value)
        out.append(f" {key.rstrip('_').replace('_', '-')}={quoteattr(text)}")
    return "".join(out)


class Svg:
    """One SVG document of `width` × `height` pixels, built by appending elements. Keyword names
    are attribute names with `-` written `_` (`stroke_width`); `class_` is `class`."""

    def __init__(self, width: float, height: float, title: str | None = None):
        self.width = width
        self.height = height
        self.parts: list[str] = []
        if title:
            self.parts.append(f"<title>{escape(title)}</title>")

    def element(self, tag: str, content: str | None = None, /, **attrs: Attr) -> None:
        """<tag attrs/>, or <tag attrs>content</tag> with the content escaped."""
        if content is None:
            self.parts.append(f"<{tag}{_attrs(attrs)}/>")
        else:
            self.parts.append(f"<{tag}{_attrs(attrs)}>{escape(content)}</{tag}>")

    def line(self, x1: float, y1: float, x2: float, y2: float, **attrs: Attr) -> None:
        self.element("line", x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2), **attrs)

    def polyline(self, points: list[tuple[float, float]], **attrs: Attr) -> None:
        self.element("polyline", points=" ".join(f"{num(x)},{num(y)}" for x, y in points), fill="none", **attrs)

    def rect(self, x: float, y: float, width: float, height: float, **attrs: Attr) -> None:
        self.element("rect", x=float(x), y=float(y), width=float(max(width, 0.0)), height=float(max(height, 0.0)),
                     **attrs)

    def circle(self, x: float, y: float, r: float, **attrs: Attr) -> None:
        self.element("circle", cx=float(x), cy=float(y), r=float(r), **attrs)

    def cross(self, x: float, y: float, size: float, **attrs: Attr) -> None:
        """An × centred on (x, y): a failure's marker (one `path`, so a test counts one per failure)."""
        d = (f"M{num(x - size)},{num(y - size)}L{num(x + size)},{num(y + size)}"
             f"M{num(x - size)},{num(y + size)}L{num(x + size)},{num(y - size)}")
        self.element("path", d=d, fill="none", **attrs)

    def text(self, x: float, y: float, text: str, **attrs: Attr) -> None:
        self.element("text", text, x=float(x), y=float(y), **attrs)

    def begin_group(self, **attrs: Attr) -> None:
        self.parts.append(f"<g{_attrs(attrs)}>")

    def end_group(self) -> None:
        self.parts.append("</g>")

    def render(self) -> str:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{num(self.width)}" height="{num(self.height)}" '
                f'viewBox="0 0 {num(self.width)} {num(self.height)}" font-family="sans-serif" font-size="12">')
        background = f'<rect width="{num(self.width)}" height="{num(self.height)}" fill="white"/>'
        return "\n".join([head, background, *self.parts, "</svg>"]) + "\n"
