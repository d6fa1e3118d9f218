"""The Markdown report: report + two PNG figures, every plan in the ranked table, never a silent overwrite."""

import pytest

from autopar.cost import Estimator
from autopar.errors import AutoparInputError
from autopar.report import report_paths, write_report
from autopar.report.plots import Point, pareto_front
from autopar.search import SearchOptions, SolveResult, solve
from autopar.search.advice import advise
from autopar.specs import TrainingSpec
from autopar.specs.loaders import load_hardware, load_model

GPUS = 8
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def problem():
    model, hw, tr = load_model("llama3_8b"), load_hardware("h100_sxm"), TrainingSpec()
    res = solve(model, hw, tr, GPUS, SearchOptions(top_k=3, mbs=[1, 2], vpp=[1], zero=[1, 3]))
    assert res.plans
    adv = advise(Estimator(model, hw, tr, GPUS), res.plans[0].estimate)
    return model, hw, tr, res, adv


def _write(problem, path, **kw):
    model, hw, tr, res, adv = problem
    return write_report(res, model, hw, tr, GPUS, path, advice=adv, **kw)


def test_writes_markdown_and_two_pngs(problem, tmp_path):
    model, hw, tr, res, adv = problem
    out = tmp_path / "out.md"
    paths = _write(problem, out)
    md, mem, par = tmp_path / "out.md", tmp_path / "out_memory.png", tmp_path / "out_pareto.png"
    assert paths == [md, mem, par]
    assert report_paths(out) == (md, mem, par)
    for png in (mem, par):
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
    text = md.read_text(encoding="utf-8")
    assert "](out_memory.png)" in text and "](out_pareto.png)" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for p in res.plans:
        L, e = p.layout, p.estimate
        prefix = f"| {p.rank} | {L.tp} | {L.dp} | {L.pp} | {L.vpp} | {L.cp} | {L.ep} | {L.etp} |"
        row = [r for r in rows if r.startswith(prefix) and f"| {e.step_time_s:.3f} |" in r]
        assert row, f"no ranked-table row for plan {p.rank}: {prefix}"
        assert f"| {e.memory_gib.total:.1f} |" in row[0] and f"| {e.mfu:.1%} |" in row[0]
    assert "| heur. |" in text
    for section in ("## Model", "## Training", "## Hardware", "## Ranked layouts", "### Column legend",
                    "#1 in detail", "## Comparison with the rules-of-thumb layout", "## What to try next",
                    "## Solver"):
        assert section in text, section
    for a in adv:
        assert a in text
    assert res.status in text and f"{res.space_size:,}" in text
    assert f"{res.heuristic.estimate.step_time_s / res.plans[0].estimate.step_time_s:.2f}×" in text
    assert "approximate" in text.splitlines()[-1]
    assert model.name in text and hw.name in text and f"{tr.seq_len:,}" in text


def test_refuses_to_overwrite_anything(problem, tmp_path):
    out = tmp_path / "out.md"
    _write(problem, out)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(AutoparInputError, match="out.md"):
        _write(problem, out)
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_refuses_when_only_a_figure_exists_and_writes_nothing(problem, tmp_path):
    fig = tmp_path / "rep_pareto.png"
    fig.write_bytes(b"the user's own picture")
    with pytest.raises(AutoparInputError, match="rep_pareto.png"):
        _write(problem, tmp_path / "rep.md")
    assert fig.read_bytes() == b"the user's own picture"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep_pareto.png"]


def test_overwrite_true_replaces_the_files(problem, tmp_path):
    out = tmp_path / "out.md"
    out.write_text("old report")
    paths = _write(problem, out, overwrite=True)
    assert len(paths) == 3
    assert out.read_text(encoding="utf-8").startswith("# autopar layout analysis")
    assert _write(problem, out, overwrite=True) == paths


def test_a_folder_is_not_a_report_path(problem, tmp_path):
    (tmp_path / "dir.md").mkdir()
    with pytest.raises(AutoparInputError, match="folder"):
        _write(problem, tmp_path / "dir.md")


def test_report_without_plans(problem, tmp_path):
    model, hw, tr, res, _ = problem
    empty = SolveResult([], "INFEASIBLE", 0.0, 0.1, 10, 2, "cpsat", explanation=["binding constraint groups: hbm"])
    paths = write_report(empty, model, hw, tr, GPUS, tmp_path / "none.md", advice=[])
    assert paths == [tmp_path / "none.md"]
    text = paths[0].read_text(encoding="utf-8")
    assert "No layout fits" in text and "binding constraint groups: hbm" in text and ".png" not in text


def test_pareto_front(problem):
    _, _, _, res, _ = problem
    pts = [Point(f"#{p.rank}", p.estimate) for p in res.plans] + [Point("heuristic", res.heuristic.estimate)]
    front = pareto_front(pts)
    assert front
    for p in pts:
        e = p.estimate
        dominated = any(q.estimate.step_time_s <= e.step_time_s and q.estimate.memory_gib.total <= e.memory_gib.total
                        and (q.estimate.step_time_s, q.estimate.memory_gib.total)
                        != (e.step_time_s, e.memory_gib.total) for q in pts)
        if dominated:
            assert p not in front
    mems = [p.estimate.memory_gib.total for p in front]
    steps = [p.estimate.step_time_s for p in front]
    assert mems == sorted(mems) and steps == sorted(steps, reverse=True)
