"""The picture of `spx report NAME`: the job's training step over wall time (from its submission),
each failure an ×, each recovery shaded, checkpoint saves as dots where recorded; under it the
badput bars (seconds lost per cause, from its account). Drawn with plot.py on svg.py."""

from __future__ import annotations

from spx.daemon.cli.job_story import Account, Story
from spx.daemon.cli.plot import PALETTE, Box, Plot, bars, nice_top
from spx.daemon.cli.svg import Svg

WIDTH, HEIGHT = 880.0, 640.0
STEP_COLOUR, FAILURE_COLOUR, RECOVERY_COLOUR, SAVE_COLOUR = PALETTE[0], PALETTE[1], PALETTE[4], PALETTE[2]
# The account's causes that are no loss: left out of the badput bars.
NOT_BADPUT = ("productive",)
# A cause with less time than this is left out of the table and the bars (the ledger lists every cause).
SHOWN_SECONDS = 0.05


def time_unit(seconds: float) -> tuple[float, str]:
    """The unit the x axis counts in: seconds up to 20 min, minutes up to 10 h, else hours."""
    if seconds <= 1200:
        return 1.0, "s"
    return (60.0, "min") if seconds <= 36000 else (3600.0, "h")


def draw(name: str, story: Story, account: Account) -> str:
    scale, unit = time_unit(story.end - story.origin)

    def t(value: float) -> float:
        return (value - story.origin) / scale

    svg = Svg(WIDTH, HEIGHT, title=f"{name}: training step over wall time")
    top_step = max([s for _, s in story.steps] + [1.0])
    plot = Plot(svg, Box(80, 50, 760, 330), (0.0, max(t(story.end), 1e-9)),
                (0.0, nice_top(top_step)))
    for start, end in story.recoveries:
        plot.span(t(start), t(end), "recovery", "recovery", RECOVERY_COLOUR)
    goodput = "" if account.goodput is None else f", goodput {account.goodput:.1%} ({account.source})"
    plot.axes(f"wall time since submission ({unit})", "step", f"{name}{goodput}")
    if story.steps:
        plot.line([(t(x), s) for x, s in story.steps], "training step", "step", STEP_COLOUR)
    if story.saves:
        plot.legend_entries.append(("marker", SAVE_COLOUR, "checkpoint saved"))
        for x, s in story.saves:
            svg.circle(plot.x(t(x)), plot.y(s), 3, fill=SAVE_COLOUR, class_="marker save")
    plot.markers([(t(f.time), f.step or 0.0) for f in story.failures], "failure", "failure", FAILURE_COLOUR,
                 titles=[f"attempt {f.attempt}: {f.reason or f.reason_class}" for f in story.failures])
    plot.legend()
    badput = sum(s for c, s in account.seconds.items() if c not in NOT_BADPUT)
    lost = sorted(((c, s) for c, s in account.seconds.items() if c not in NOT_BADPUT and s >= SHOWN_SECONDS),
                  key=lambda cs: (-cs[1], cs[0]))
    box = Box(80, 460, 760, 120)
    if lost:
        bars(svg, box, [c for c, _ in lost], [("seconds", [s for _, s in lost])], "seconds",
             f"badput: {badput:.1f} s of {account.wall:.1f} s")
    else:
        svg.text(box.left, box.top, "badput: none", font_size=14, font_weight="bold", class_="title")
    return svg.render()
