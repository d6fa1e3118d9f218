"""Terminal rendering shared by the commands (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autopar.cost.legend import APPROX_NOTE, MEMORY_LEGEND, TIME_LEGEND
from autopar.cost.result import Estimate
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """stdout closed early (``| head``): let the CLI entry end quietly with status 141, as for print()."""
        raise BrokenPipeError


def console(stderr: bool = False, width: int | None = None) -> Console:
    """A rich console as wide as the terminal (rich reads it, or $COLUMNS; 80 when the output is not a terminal),
    unless ``width`` is given."""
    return _Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def fitted_table(width: int, title: str, headers: list[str], rows: list[list[str]], left: tuple[str, ...] = (),
                 optional: tuple[str, ...] = (), wrap_at: int = 28) -> list[Table | str]:
    """A table that fits ``width`` columns without cutting a number: numeric columns are exactly as wide as their
    longest cell or header word (headers fold onto several lines); text columns (``left``) wrap at spaces, and
    fold a word longer than the column, at ``wrap_at`` characters a line at most. While that is too wide, the
    ``optional`` columns are dropped, last first (a name that is not among ``headers`` is skipped: callers add
    columns only in some runs, and other helpers add new ones), and a line after the table names them. If even the
    required columns do not fit, each row prints as one record per line (:func:`records`). Cells are plain text
    (no markup). Returns what to print."""
    def cell_width(i: int) -> int:
        words = [len(w) for w in headers[i].split()] or [1]
        if headers[i] in left:
            return max(words + [min(len(r[i]), wrap) for r in rows])
        return max(words + [len(r[i]) for r in rows])

    def need(cols: list[int]) -> int:
        return 1 + sum(3 + cell_width(i) for i in cols)

    cols = list(range(len(headers)))
    # the widest text columns that fit (up to 40 characters a line), narrowing to wrap_at before dropping columns
    for wrap in [w for w in (40, 28) if w > wrap_at] + [wrap_at]:
        if need(cols) <= width:
            break
    dropped = []
    for name in reversed(optional):
        if need(cols) <= width:
            break
        if name not in headers:
            continue
        cols.remove(headers.index(name))
        dropped.append(name)
    if need(cols) > width:
        return records(width, title, headers, rows)
    t = Table(title=escape(title), title_justify="left")
    for i in cols:
        if headers[i] in left:
            t.add_column(escape(headers[i]), justify="left", width=cell_width(i), overflow="fold")
        else:
            t.add_column(escape(headers[i]), justify="right", width=cell_width(i))
    for r in rows:
        t.add_row(*(escape(r[i]) for i in cols))
    if not dropped:
        return [t]
    return [t, f"[dim]not shown at {width} columns: {escape(', '.join(reversed(dropped)))} (a wider terminal or "
               "--json shows them)[/dim]"]


def records(width: int, title: str, headers: list[str], rows: list[list[str]]) -> list[str]:
    """Rows too wide for any table at ``width``: one record per row, its ``header value`` pairs joined by ``; `` and
    wrapped at ``width`` (continuation lines indented by two). Returns one string to print."""
    import textwrap
    w = max(width, 20)
    out = textwrap.wrap(f"{title} (one record per row: too wide for a table at {width} columns)", w)
    for r in rows:
        text = "; ".join(f"{h} {v}" for h, v in zip(headers, r) if v != "")
        out += textwrap.wrap(text, width=w, subsequent_indent="  ", break_on_hyphens=False)
    return [escape("\n".join(out))]


def header(model: ModelSpec, hw: HardwareSpec, tr: TrainingSpec, gpus: int) -> str:
    return (f"{model.summary()}\n{gpus} x {hw.name} ({hw.hbm_gib:.1f} GiB HBM, NVLink domain {hw.nvlink_domain_size}); "
            f"seq {tr.seq_len}, global batch {tr.global_batch} ({tr.tokens_per_step / 1e6:.2f}M tokens), "
            f"{tr.precision}, {tr.grad_dtype} gradients; overlap {tr.overlaps()}")


def print_estimate(est: Estimate, model: ModelSpec, hw: HardwareSpec, tr: TrainingSpec, out: Console) -> None:
    L = est.layout
    out.print(header(model, hw, tr, est.gpus))
    out.print(f"[bold]Layout[/bold] {L.short()}   (EDP {L.edp}, min_gpus = PP·max(TP·CP, EP·ETP) = {L.min_gpus()})")
    mem = Table(title=f"Memory per GPU — pipeline stage {est.worst_stage} of {L.pp} (the fullest)",
                title_justify="left")
    mem.add_column("term")
    mem.add_column("GiB", justify="right")
    mem.add_column("what it counts")
    for k, v in est.memory_gib.to_dict().items():
        if k != "total":
            mem.add_row(k, f"{v:.2f}", MEMORY_LEGEND[k])
    used = est.memory_gib.total / est.hbm_gib
    verdict = "[green]fits[/green]" if est.fits else "[red]DOES NOT FIT[/red]"
    mem.add_row("[bold]total[/bold]", f"[bold]{est.memory_gib.total:.2f}[/bold]",
                f"of {est.hbm_gib:.1f} GiB HBM ({used:.0%}) — {verdict}")
    out.print(mem)
    tt = Table(title="Step time (critical path of the slowest stage)", title_justify="left")
    tt.add_column("term")
    tt.add_column("seconds", justify="right")
    tt.add_column("share", justify="right")
    tt.add_column("what it counts")
    step = est.step_time_s
    for k, v in est.time_s.to_dict().items():
        if k == "offload" and not est.layout.offload_activations:
            continue
        tt.add_row(k, f"{v:.4f}", f"{v / step:.1%}", TIME_LEGEND[k])
    tt.add_row("[bold]step[/bold]", f"[bold]{step:.4f}[/bold]", "100%", "")
    out.print(tt)
    out.print(f"Throughput: [bold]{est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU[/bold], "
              f"{est.model_tflops_per_gpu:,.0f} model TFLOP/s/GPU, MFU {est.mfu:.1%} "
              f"(of the {tr.precision} dense peak {hw.peak_tflops(tr.precision):,.0f} TFLOP/s)")
    out.print(f"Bottleneck: [bold]{est.bottleneck}[/bold] ({TIME_LEGEND[est.bottleneck]})")
    if est.layout.offload_activations:
        out.print(f"Offloaded activations in host memory: {est.host_offload_gib:.1f} GiB per GPU")
    for n in est.notes:
        out.print(f"note: {n}")
    out.print(f"[dim]{APPROX_NOTE}[/dim]")


def terminal_width() -> int:
    """The width plain-text output is fitted to: the terminal's, or $COLUMNS, else 80 (as rich decides)."""
    import shutil
    return max(shutil.get_terminal_size((80, 24)).columns, 20)


def wrap(text: str, width: int | None = None, indent: str | None = None) -> str:
    """Plain text with every line longer than ``width`` wrapped at spaces, continuation lines indented by
    ``indent`` (default: two more than the line's own indent; a word longer than a line is broken)."""
    import textwrap
    width = width or terminal_width()
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = " " * (len(line) - len(line.lstrip(" ")))
        out += textwrap.wrap(line.strip(" "), width=width, initial_indent=lead,
                             subsequent_indent=lead + "  " if indent is None else indent, break_on_hyphens=False)
    return "\n".join(out)


def wrap_comments(text: str, width: int | None = None) -> str:
    """Launcher settings for the terminal: a ``# `` comment line longer than ``width`` continues on further ``# ``
    lines (same meaning in a shell, a TOML file or Python); every other line (a flag, an override, code) is left
    exactly as emitted."""
    import textwrap
    width = width or terminal_width()
    out = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        lead = line[:len(line) - len(body)]
        if len(line) > width and body.startswith("# "):
            out += textwrap.wrap(body[2:], width=width, initial_indent=lead + "# ", subsequent_indent=lead + "#   ",
                                 break_on_hyphens=False, break_long_words=False)
        else:
            out.append(line)
    return "\n".join(out)
