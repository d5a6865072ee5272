"""Loader shared by the tests of the benchmark scripts (``test_benchmarks.py``,
``test_hybrid_milp.py``): ``benchmarks/`` is a folder of scripts, not a
package, so each is imported from its file."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` imported as the module ``name``, registered in
    ``sys.modules`` (dataclasses look their module up; a script importing
    another finds it by that name), with ``benchmarks/`` on ``sys.path``
    while it runs."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))
