"""The page a person reads in a run folder (`report.md`), and the figure and tables on it.

Every run's page has one shape: a title, the headline in bold, what was done, the figure,
the tables (some under a heading), how it was measured, and which files rebuild it. The
probes and the sweep fill in a `ReportPage` rather than list the lines themselves.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from kvphase.runfolder.files import save_atomic

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class ReportPage:
    """A report page; `markdown()` sets each part apart by a blank line and leaves out empty ones."""

    title: str  # the "# " heading
    headline: str  # the finding in one line, in bold under the title
    prose: str = ""  # what was done and how to read the numbers; "" for none
    figure: tuple[str, str] | None = None  # (file in the folder, alt text), shown after the prose
    sections: Sequence[tuple[str | None, ...]] = ()  # (heading or None, markdown block, ...) in order
    measured: Sequence[str] = ()  # bullet lines under "## How this was measured"; none: no such section
    files: str = ""  # the closing line: which files the folder holds and which rebuild this page

    def markdown(self) -> str:
        blocks = [f"# {self.title}", f"**{self.headline}**", self.prose, self.figure and figure_link(*self.figure)]
        for heading, *body in self.sections:
            blocks += [heading and f"## {heading}", *body]
        if self.measured:
            blocks += ["## How this was measured", "\n".join(f"- {line}" for line in self.measured)]
        blocks.append(self.files)
        return "\n\n".join(block for block in blocks if block) + "\n"


def figure_link(file: str, alt: str) -> str:
    """The markdown that shows a figure of the folder."""
    return f"![{alt}]({file})"


def markdown_table(frame: pd.DataFrame) -> str:
    """A markdown table from a frame (no tabulate dependency)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


@contextmanager
def figure(path: Path, nrows: int = 1, ncols: int = 1, **options):
    """(figure, axes) drawn on the Agg canvas and saved to `path` on exit. pyplot is not
    imported: its import alone costs a third of a second, a sixth of a `kvphase gates` run.
    `options`: Figure's (figsize, dpi) and subplots' (squeeze)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    squeeze = options.pop("squeeze", True)
    fig = Figure(**options)
    FigureCanvasAgg(fig)
    yield fig, fig.subplots(nrows, ncols, squeeze=squeeze)
    fig.tight_layout()
    path = Path(path)
    save_atomic(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip(".") or None))
