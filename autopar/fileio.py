"""Every file autopar reads as input and every file it writes as output goes through here.

Reading (:func:`read_input`): one bounded reader for a regular file, a device (``/dev/zero``), a pipe or FIFO
and standard input (``/dev/stdin``). It reads at most :data:`MAX_INPUT_BYTES` (a wrong file is refused, never
read to the end of the disk or of memory), opens a FIFO without blocking and waits at most
:data:`INPUT_WAIT_S` for each chunk of data (a FIFO with no writer, a terminal nobody types into), so no input
makes autopar hang or exhaust memory.

Writing (:class:`OutputFile`): an output target is checked when the command starts, before any work (its folder
exists, it is not a folder, it can be written), so a long run never ends in "cannot write". A regular file is
written through a temporary file in the same folder and renamed over the target, so a full disk or a crash leaves
the old file as it was; a device or FIFO is written directly. A write that fails is one line and exit 2.

Every failure is an :class:`~autopar.errors.AutoparInputError` naming the path.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import tempfile
import time
from pathlib import Path

from autopar.errors import AutoparInputError

MAX_INPUT_BYTES = 16 * 2 ** 20   # input files (specs, runs CSV, layout lists) are kB; this refuses a wrong file
# A pipe, FIFO or terminal that gives no data for this long is given up on (AUTOPAR_INPUT_WAIT_S overrides it:
# docs/input-bounds.md).
INPUT_WAIT_S = 10.0
_CHUNK = 1 << 16


def show_path(path: Path | str, width: int = 80) -> str:
    """A path as shown in a message: shortened in the middle when longer than ``width`` characters."""
    text = str(path)
    return text if len(text) <= width else f"{text[:width // 2 - 2]}...{text[-(width // 2 - 1):]}"


def _too_large(path: Path | str, size: str) -> AutoparInputError:
    return AutoparInputError(f"{show_path(path)} holds {size} bytes; autopar reads input files of at most "
                             f"{MAX_INPUT_BYTES:,} bytes (model, hardware and runs files are a few kB)")


def input_wait_s() -> float:
    """Seconds a pipe, FIFO or terminal may stay silent: AUTOPAR_INPUT_WAIT_S when it is a positive number."""
    try:
        v = float(os.environ.get("AUTOPAR_INPUT_WAIT_S", ""))
    except ValueError:
        return INPUT_WAIT_S
    return v if 0 < v <= 86_400 else INPUT_WAIT_S


def read_input(path: Path | str, wait_s: float | None = None) -> bytes:
    """The bytes of an input file, at most :data:`MAX_INPUT_BYTES`, from a regular file, a device, a pipe/FIFO or
    standard input; AutoparInputError naming the path for a folder, a file too large, a FIFO with no writer, a
    source silent for ``wait_s`` seconds, or an OS error."""
    wait_s = input_wait_s() if wait_s is None else wait_s
    try:
        st = os.stat(path)
    except OSError as err:
        raise AutoparInputError(f"cannot read {show_path(path)}: {err.strerror or err}") from None
    except ValueError as err:   # a NUL byte in the name
        raise AutoparInputError(f"cannot read {show_path(path)!r}: {err}") from None
    if stat.S_ISDIR(st.st_mode):
        raise AutoparInputError(f"cannot read {show_path(path)}: a folder, not a file")
    if stat.S_ISREG(st.st_mode) and st.st_size > MAX_INPUT_BYTES:
        raise _too_large(path, f"{st.st_size:,}")
    # O_NONBLOCK: opening a FIFO for reading returns at once even with no writer (POSIX open(2)); reads then wait
    # in select() below, with a deadline, instead of in the kernel forever.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise AutoparInputError(f"cannot read {show_path(path)}: {err.strerror or err}") from None
    try:
        return _read_bounded(fd, path, regular=stat.S_ISREG(os.fstat(fd).st_mode), wait_s=wait_s)
    finally:
        os.close(fd)


def _read_bounded(fd: int, path: Path | str, regular: bool, wait_s: float) -> bytes:
    chunks: list[bytes] = []
    total = 0
    fifo = stat.S_ISFIFO(os.fstat(fd).st_mode)
    heard = False          # a FIFO whose writer has not come yet reads as EOF: wait for a writer first
    deadline = time.monotonic() + wait_s
    while True:
        if not regular:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                what = "no writer came" if fifo and not heard else "no more data came"
                raise AutoparInputError(f"cannot read {show_path(path)}: {what} within {wait_s:g} s (a pipe, "
                                        "FIFO or terminal must deliver the whole file)")
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            continue
        except OSError as err:
            raise AutoparInputError(f"cannot read {show_path(path)}: {err.strerror or err}") from None
        if not data:
            if fifo and not heard:
                # A FIFO no writer has opened yet reads empty at once (and select() calls it readable): poll until
                # a writer opens it and writes, or the deadline passes. (A writer that writes nothing at all is
                # indistinguishable from none and ends at the deadline too: an empty input is refused anyway.)
                time.sleep(0.05)
                continue
            return b"".join(chunks)
        heard = True
        deadline = time.monotonic() + wait_s
        chunks.append(data)
        total += len(data)
        if total > MAX_INPUT_BYTES:
            raise _too_large(path, f"more than {MAX_INPUT_BYTES:,}")


def _ensure_parent(path: Path, flag: str) -> None:
    parent = path.parent
    try:
        if not parent.is_dir():
            raise AutoparInputError(f"{flag}: folder {show_path(parent)} does not exist (for {show_path(path)})")
    except OSError as err:
        raise AutoparInputError(f"{flag}: cannot write {show_path(path)}: {err.strerror or err}") from None


def check_output_dir(path: Path | str, flag: str) -> Path:
    """A folder autopar will write into (creating it and its parents if needed): checked now, before the work.
    It must be a folder, or not exist yet under a writable folder. Returns it as a Path."""
    d = Path(path)
    if not str(path).strip():
        raise AutoparInputError(f"{flag}: empty path")
    probe = d
    try:
        while not probe.exists():
            if probe.is_symlink() or probe.parent == probe:
                break
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise AutoparInputError(f"{flag}: {show_path(probe)} is not a folder (for {show_path(d)})")
    except OSError as err:
        raise AutoparInputError(f"{flag}: cannot use {show_path(d)}: {err.strerror or err}") from None
    _probe(probe, flag, d)
    return d


def _probe(folder: Path, flag: str, target: Path) -> None:
    """Create and remove a file in ``folder``: the one check that catches every reason a write will fail there
    (permissions, a read-only file system, /proc, a full inode table); os.access misses most of them for root."""
    try:
        fd, name = tempfile.mkstemp(prefix=".autopar-probe-", dir=folder)
    except OSError as err:
        raise AutoparInputError(f"{flag}: cannot write {show_path(target)}: {err.strerror or err} (in "
                                f"{show_path(folder)})") from None
    os.close(fd)
    os.unlink(name)


class OutputFile:
    """An output target, checked now and written later (:meth:`write`). ``flag`` names it in messages."""

    def __init__(self, path: Path | str, flag: str, *, overwrite: bool = True):
        if not str(path).strip():
            raise AutoparInputError(f"{flag}: empty path")
        self.path, self.flag = Path(path), flag
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except (OSError, ValueError) as err:
            raise AutoparInputError(f"{flag}: cannot write {show_path(self.path)}: "
                                    f"{getattr(err, 'strerror', None) or err}") from None
        self.regular = st is None or stat.S_ISREG(st.st_mode)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise AutoparInputError(f"{flag}: {show_path(self.path)} is a folder, not a file")
        if st is not None and self.regular and not overwrite:
            raise AutoparInputError(f"{flag}: {show_path(self.path)} exists; pass --force to overwrite it "
                                    "(or choose another path)")
        if self.regular:
            _ensure_parent(self.path, flag)
            # the write goes through a temporary file in the folder: prove the folder takes one now, before the work
            _probe(self.path.parent, flag, self.path)
            if st is not None and not os.access(self.path, os.W_OK):
                raise AutoparInputError(f"{flag}: cannot write {show_path(self.path)}: the file is read-only")
        elif stat.S_ISFIFO(st.st_mode):
            pass   # checked when written: opening a FIFO for writing waits for a reader
        elif not os.access(self.path, os.W_OK):
            raise AutoparInputError(f"{flag}: cannot write {show_path(self.path)}: permission denied")

    def write(self, text: str | bytes) -> None:
        """Write the whole text: a regular file atomically (the old one stays intact on failure), anything else
        directly. AutoparInputError naming the path when it fails (a full disk, a read-only file system)."""
        data = text.encode() if isinstance(text, str) else text
        if not self.regular:
            return self._write_direct(data)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if self.path.exists():
                os.chmod(tmp, stat.S_IMODE(os.stat(self.path).st_mode))
            else:
                os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, self.path)
            tmp = None
        except OSError as err:
            raise AutoparInputError(f"{self.flag}: cannot write {show_path(self.path)}: "
                                    f"{err.strerror or err}") from None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _write_direct(self, data: bytes) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            why = "no process reads the FIFO" if err.errno == errno.ENXIO else err.strerror or str(err)
            raise AutoparInputError(f"{self.flag}: cannot write {show_path(self.path)}: {why}") from None
        try:
            os.set_blocking(fd, True)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as err:
            raise AutoparInputError(f"{self.flag}: cannot write {show_path(self.path)}: "
                                    f"{err.strerror or err}") from None
        finally:
            os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
