"""Reports of a search: a Markdown analysis with PNG figures (``autopar solve --report out.md``).

    write_report(result, model, hardware, training, gpus, path, advice=[...]) -> [out.md, out_memory.png,
    out_pareto.png]

matplotlib is imported only while the figures are drawn (Agg canvas, no pyplot)."""

from autopar.report.markdown import render_markdown, report_paths, write_report

__all__ = ["render_markdown", "report_paths", "write_report"]
