"""The report's two figures, rendered to PNG bytes with matplotlib's Agg backend.

No pyplot: each figure is a ``matplotlib.figure.Figure`` on its own ``FigureCanvasAgg``, so making a report
never touches the process-wide backend or opens a window. matplotlib is imported inside the functions
(planning stays importable without it)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from autopar.cost.result import Estimate

# Memory terms in stacking order (bottom to top) and their colours (matplotlib's tab10).
MEMORY_TERMS = (("weights", "W", "#1f77b4"), ("grads", "G", "#ff7f0e"), ("optimizer", "O", "#2ca02c"),
                ("activations", "Act", "#d62728"), ("buffers", "Buf", "#9467bd"), ("reserve", "Rsv", "#7f7f7f"))


@dataclass(frozen=True)
class Point:
    """One layout on the figures: a short label ('#1', 'heuristic'), its layout text and its prediction."""

    label: str
    estimate: Estimate

    @property
    def name(self) -> str:
        return f"{self.label}: {self.estimate.layout.short()}"


def pareto_front(points: list[Point]) -> list[Point]:
    """The points no other point beats on both step time and peak memory (lower is better on both),
    sorted by memory. A point equal to another on both axes is kept once (the first given)."""
    front: list[Point] = []
    for p in sorted(points, key=lambda q: (q.estimate.memory_gib.total, q.estimate.step_time_s)):
        if not front or p.estimate.step_time_s < front[-1].estimate.step_time_s:
            front.append(p)
    return front


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def memory_png(points: list[Point], hbm_gib: float, title: str) -> bytes:
    """Stacked bars of the per-GPU memory breakdown of ``points`` with the HBM capacity as a line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.0, 1.1 * len(points) + 3.0), 4.8))
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(points)))
    bottom = [0.0] * len(points)
    for term, short, colour in MEMORY_TERMS:
        vals = [getattr(p.estimate.memory_gib, term) for p in points]
        ax.bar(xs, vals, bottom=bottom, color=colour, label=f"{short} ({term})", width=0.65)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for x, total in zip(xs, bottom):
        ax.text(x, total, f"{total:.1f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(hbm_gib, color="black", linestyle="--", linewidth=1.2, label=f"HBM {hbm_gib:.1f} GiB")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{p.label}\n{_wrap(p.estimate.layout.short())}" for p in points], fontsize=7)
    ax.set_ylabel("GiB per GPU (fullest pipeline stage)")
    ax.set_ylim(0, max([hbm_gib, *bottom]) * 1.15)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def pareto_png(points: list[Point], hbm_gib: float, best: Point | None, title: str) -> bytes:
    """Step time against peak memory of every point, the Pareto front of the layouts that fit as a step line, the
    best starred. Labels of nearby points are staggered so they do not print over each other."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot(1, 1, 1)
    xs = [p.estimate.memory_gib.total for p in points]
    ys = [p.estimate.step_time_s for p in points]
    xspan = (max(xs + [hbm_gib]) - min(xs)) or 1.0
    yspan = (max(ys) - min(ys)) or max(ys) or 1.0
    placed: list[tuple[float, float]] = []
    for p in sorted(points, key=lambda q: (q.estimate.step_time_s, q.estimate.memory_gib.total)):
        e = p.estimate
        heur = p.label == "heuristic"
        ax.scatter([e.memory_gib.total], [e.step_time_s], s=45, zorder=3,
                   marker="s" if heur else ("o" if e.fits else "x"),
                   color="#ff7f0e" if heur else ("#1f77b4" if e.fits else "#d62728"))
        # a point close to earlier-labelled ones (8% of the memory span, 6% of the time span) puts its label on the
        # other side, then a line lower
        near = sum(1 for x, y in placed if abs(x - e.memory_gib.total) < 0.08 * xspan
                   and abs(y - e.step_time_s) < 0.06 * yspan)
        placed.append((e.memory_gib.total, e.step_time_s))
        left = near % 2 == 1
        ax.annotate(p.label + ("" if e.fits else " (does not fit)"), (e.memory_gib.total, e.step_time_s),
                    textcoords="offset points", fontsize=8, ha="right" if left else "left",
                    xytext=(6, 4) if not near else (-24 if left else 24, 12 - 12 * (near // 2)),
                    arrowprops=None if not near else {"arrowstyle": "-", "color": "0.5", "linewidth": 0.6})
    front = pareto_front([p for p in points if p.estimate.fits])
    if len(front) > 1:
        ax.plot([p.estimate.memory_gib.total for p in front], [p.estimate.step_time_s for p in front],
                drawstyle="steps-post", color="#2ca02c", linewidth=1.2, label="Pareto front of the layouts that fit")
    elif front:
        f = front[0].estimate
        ax.scatter([f.memory_gib.total], [f.step_time_s], s=160, facecolors="none", edgecolors="#2ca02c",
                   label="Pareto front of the layouts that fit", zorder=2)
    if best is not None:
        b = best.estimate
        ax.scatter([b.memory_gib.total], [b.step_time_s], marker="*", s=260, color="gold", edgecolors="black",
                   zorder=4, label=f"best ({best.label})")
    ax.axvline(hbm_gib, color="black", linestyle="--", linewidth=1.0, label=f"HBM {hbm_gib:.1f} GiB")
    ax.scatter([], [], marker="s", color="#ff7f0e", label="rules-of-thumb layout")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def _wrap(text: str, width: int = 16) -> str:
    """Break a layout label into lines of about ``width`` characters at spaces."""
    lines, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}".strip()
    lines.append(cur)
    return "\n".join(lines)
