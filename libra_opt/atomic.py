"""Writing files so that nothing is lost: all of the new file or none of it.

Every file libra-opt writes (plans, problems, plots, CSV tables) goes through
:func:`atomic_write`: the data goes to a fresh temporary file in the same
directory (:func:`tempfile.mkstemp`, so no fixed name that an existing symlink
could redirect), is flushed and ``fsync``-ed, and only then renamed over the
destination with :func:`os.replace` (atomic on POSIX and Windows within one
filesystem).  On any failure (a full disk, an exception in the writer,
Ctrl-C) the temporary file is removed and the old file, if any, is untouched.

:func:`check_writable` checks a destination before a long computation
(a solve, a profile) so that a missing or read-only directory is reported
first, not after the work is done.

Source: the write-temp-then-rename pattern of POSIX ``rename(2)``; Python's
:func:`tempfile.mkstemp`, :func:`os.fsync`, :func:`os.replace`.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterator

from .errors import OutputPathError

__all__ = ["atomic_write", "check_writable", "write_text"]


def check_writable(path: str | os.PathLike) -> Path:
    """Check that a file can be written at ``path`` (by :func:`atomic_write`).

    The parent directory must exist, be a directory, and be writable; ``path``
    itself must not be a directory.  Nothing is created.

    Parameters
    ----------
    path : str or PathLike
        The destination file.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OutputPathError
        The directory is missing, is not a directory, or is not writable, or
        ``path`` is a directory; the message says which.
    """
    path = Path(path)
    parent = path.parent
    if path.name in ("", ".", ".."):
        raise OutputPathError(f"cannot write {str(path)!r}: give a file name, not a directory")
    if not parent.exists():
        raise OutputPathError(f"cannot write {path}: directory {parent} does not exist; create it first "
                              f"(mkdir -p {parent})")
    if not parent.is_dir():
        raise OutputPathError(f"cannot write {path}: {parent} is not a directory")
    if path.is_dir():
        raise OutputPathError(f"cannot write {path}: it is a directory; give a file name inside it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {path}: directory {parent} is not writable; choose another "
                              f"directory or change its permissions")
    return path


def _new_file_mode(path: Path) -> int:
    """Permission bits the written file gets: the old file's, else what
    ``open(path, "w")`` would give (0o666 minus the umask)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        pass
    try:  # Linux: read the umask without changing it (os.umask would, for a moment, for every thread)
        with open("/proc/self/status") as f:
            umask = next(int(ln.split()[1], 8) for ln in f if ln.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8",
                 newline: str | None = None) -> Iterator[IO]:
    """Context manager: a file object whose contents replace ``path`` only if
    the ``with`` block finishes without an exception.

    >>> with atomic_write("plan.json") as f:   # doctest: +SKIP
    ...     json.dump(d, f)

    The data is written to a temporary file next to ``path`` (same directory,
    so the rename stays in one filesystem), flushed, ``fsync``-ed, given the
    old file's permission bits (or ``0o666`` minus the umask for a new file)
    and renamed over ``path``.  A symlink at ``path`` is replaced by the file,
    not followed.

    Parameters
    ----------
    path : str or PathLike
        The destination file.
    mode : {"w", "wb"}
        Text or binary.
    encoding : str, optional
        Text mode only (default UTF-8).
    newline : str, optional
        Text mode only, as for :func:`open` (``""`` for :mod:`csv`).

    Yields
    ------
    file object
        Open for writing.

    Raises
    ------
    OutputPathError
        The destination cannot be written (see :func:`check_writable`), or
        writing failed (a full disk: ``ENOSPC``); the message names the file
        and the old file is unchanged.
    ValueError
        ``mode`` is not ``"w"`` or ``"wb"``.
    Any exception of the ``with`` block
        Re-raised after the temporary file is removed (``KeyboardInterrupt``
        included).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', not {mode!r}")
    path = check_writable(path)
    file_mode = _new_file_mode(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputPathError(f"cannot write {path}: {e.strerror}") from e
    try:
        if mode == "wb":
            f = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding=encoding, newline=newline)
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, OutputPathError):
            raise OutputPathError(f"cannot write {path}: {e.strerror or e}; the old file (if any) is "
                                  f"unchanged") from e
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` with :func:`atomic_write`: the
    all-or-nothing form of ``Path.write_text``.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    OutputPathError
        ``path`` cannot be written; the old file is unchanged.
    """
    with atomic_write(path) as f:
        f.write(text)
    return Path(path)
