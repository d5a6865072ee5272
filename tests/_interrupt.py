"""Ctrl-C harness shared by the MILP interrupt tests (``test_milp_interrupt.py``,
``test_hybrid_milp.py``): run a driver script in a child Python with its own
TMPDIR, wait until its native MILP solve has started, send SIGINT, and return
what it printed and how it exited."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

#: a profiled problem whose MILP runs for seconds (it finds plans but proves none optimal quickly)
PROBLEM = str(Path(__file__).resolve().parents[1] / "problems" / "resnet-tiny-b8-s32-cpu.json.gz")

#: driver prologue: OR-Tools' native solve prints ``MILP-START`` to stderr as it starts (see :func:`marker_seen`)
ANNOUNCE_NATIVE_SOLVE = """
import sys
from ortools.linear_solver.python import model_builder_helper

_native_solve = model_builder_helper.ModelSolverHelper.solve

def _announced(*args, **kwargs):
    print("MILP-START", file=sys.stderr, flush=True)
    return _native_solve(*args, **kwargs)

model_builder_helper.ModelSolverHelper.solve = _announced
"""


def processes_mentioning(text: str, but: int | None = None) -> list[str]:
    """Command lines of the running processes, other than ``but``, that mention ``text``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in (os.getpid(), but):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(f"{pid}: {cmd}")
    return out


def interrupt(code: str, argv: list[str], tmp_path: Path, started) -> subprocess.CompletedProcess:
    """Run ``python -c code *argv`` with its own TMPDIR, wait until
    ``started(proc, tmpdir)`` is true, send SIGINT, and return its result."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1")
    # SIGINT at its default in the child, as in a terminal: a shell that starts the test run in the
    # background (``cmd &`` in a script) ignores SIGINT, the child inherits that, and Python then installs
    # no KeyboardInterrupt handler, so the interrupt this sends would be dropped
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        t0 = time.monotonic()
        while not started(proc, str(tmpdir)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 90, "the MILP solve did not start"
            time.sleep(0.05)
        time.sleep(1.0)                                  # well inside the native solve
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def marker_seen(proc, tmpdir) -> bool:
    line = proc.stderr.readline()
    return "MILP-START" in line


def interrupt_native_solve(body: str, argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """:func:`interrupt` of ``body`` (a driver script) run after
    :data:`ANNOUNCE_NATIVE_SOLVE`, 1 s after OR-Tools' native solve starts."""
    return interrupt(ANNOUNCE_NATIVE_SOLVE + textwrap.dedent(body), argv, tmp_path, marker_seen)
