"""autopar.fileio: the one bounded reader of every input, and output targets checked before the work."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from autopar.errors import AutoparInputError
from autopar.fileio import MAX_INPUT_BYTES, OutputFile, check_output_dir, read_input


def test_a_device_is_read_up_to_the_bound_not_to_the_end_of_memory():
    with pytest.raises(AutoparInputError, match="/dev/zero holds more than 16,777,216 bytes"):
        read_input("/dev/zero")


def test_a_regular_file_over_the_bound_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)          # sparse: no 16 MiB written
    with pytest.raises(AutoparInputError, match="holds 16,777,217 bytes"):
        read_input(big)


def test_a_fifo_with_no_writer_is_given_up_on_instead_of_hanging(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    with pytest.raises(AutoparInputError, match="no writer came within 0.3 s"):
        read_input(fifo, wait_s=0.3)


def test_a_fifo_with_a_writer_is_read_whole(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    data = b"num_layers: 2\n" * 10_000               # more than one pipe buffer
    t = threading.Thread(target=lambda: fifo.write_bytes(data), daemon=True)
    t.start()
    assert read_input(fifo, wait_s=30) == data
    t.join()


def test_a_pipe_on_stdin_is_read(tmp_path):
    r, w = os.pipe()
    os.write(w, b"hello\n")
    os.close(w)
    try:
        assert read_input(f"/proc/self/fd/{r}", wait_s=5) == b"hello\n"
    finally:
        os.close(r)


def test_a_folder_and_a_missing_file_are_one_line_each(tmp_path):
    with pytest.raises(AutoparInputError, match="a folder, not a file"):
        read_input(tmp_path)
    with pytest.raises(AutoparInputError, match="No such file"):
        read_input(tmp_path / "nope.yaml")


def test_an_output_is_checked_before_the_work(tmp_path):
    with pytest.raises(AutoparInputError, match="--out: folder .*nope does not exist"):
        OutputFile(tmp_path / "nope" / "x.json", "--out")
    with pytest.raises(AutoparInputError, match="is a folder"):
        OutputFile(tmp_path, "--out")
    (tmp_path / "old.json").write_text("old")
    with pytest.raises(AutoparInputError, match="exists; pass --force"):
        OutputFile(tmp_path / "old.json", "--out", overwrite=False)
    with pytest.raises(AutoparInputError, match="--out: cannot write /proc/autopar-x.json"):
        OutputFile("/proc/autopar-x.json", "--out")        # a read-only file system, even for root
    with pytest.raises(AutoparInputError, match="--report: cannot write"):
        check_output_dir("/proc/autopar-report", "--report")


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("the user's plan")
    out = OutputFile(target, "--out")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(AutoparInputError, match="--out: cannot write .*plan.json: No space left on device"):
        out.write("new plan")
    assert target.read_text() == "the user's plan"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_device_output_is_written_directly_and_its_failure_is_one_line():
    with pytest.raises(AutoparInputError, match="--out: cannot write /dev/full: No space left on device"):
        OutputFile("/dev/full", "--out").write("x")
    OutputFile("/dev/null", "--out").write("x")


def test_a_fifo_output_without_a_reader_is_one_line(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    with pytest.raises(AutoparInputError, match="no process reads the FIFO"):
        OutputFile(fifo, "--out").write("x")
