"""The package layout of issue 14: every old module path (``libra_opt.zoo``,
``libra_opt.solvers.checkmate_milp``, ...) imports as the moved module itself, through
``libra_opt/_moved.py``, and no file is left at an old path."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from libra_opt._moved import MOVED

REPO = Path(__file__).resolve().parent.parent


def _source_file(dotted: str) -> Path:
    """Where a module of the source tree lives (``libra_opt.solvers.X`` is ``solvers/X.py``)."""
    parts = dotted.split(".")
    if parts[:2] in (["libra_opt", "solvers"], ["libra_opt", "runtime"]):
        parts = parts[1:]
    return REPO.joinpath(*parts[:-1], parts[-1] + ".py")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_moved_module_itself(old):
    new = MOVED[old]
    module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert sys.modules[old] is sys.modules[new] is module
    assert module.__name__ == new and module.__spec__.name == new
    parent, _, leaf = old.rpartition(".")
    assert getattr(sys.modules[parent], leaf) is module
    assert _source_file(new).is_file() and not _source_file(old).exists()


def test_names_import_from_old_paths():
    from libra_opt.solvers.checkmate.milp import MIPOptions as new_mip
    from libra_opt.solvers.checkmate_milp import MIPOptions
    from libra_opt.solvers.libra import LibraOptions, LibraSolver
    from libra_opt.solvers.libra.solver import LibraSolver as new_libra
    from libra_opt.solvers.registry import solver_class
    from libra_opt.zoo import build_model

    assert MIPOptions is new_mip and LibraSolver is new_libra and solver_class("libra") is LibraSolver
    assert LibraOptions().policy == "hybrid"
    assert build_model is importlib.import_module("libra_opt.apps.zoo").build_model


def test_monkeypatching_either_name_patches_the_one_module(monkeypatch):
    import libra_opt.apps.max_batch as new
    import libra_opt.max_batch as old

    marker = object()
    monkeypatch.setattr(old, "search_max_batch", marker)
    assert new.search_max_batch is marker
    monkeypatch.setattr("libra_opt.bounds.memory_lower_bound", marker)
    assert importlib.import_module("libra_opt.passes.bounds").memory_lower_bound is marker


def test_the_capture_module_stays_callable_under_its_old_name():
    import libra_opt.capture as old
    from libra_opt import CallableModule

    assert old is importlib.import_module("libra_opt.frontend.capture")
    assert isinstance(old, CallableModule)   # libra_opt.capture(model, ...) calls capture.capture


def test_a_fresh_interpreter_imports_old_paths_first():
    code = ("import sys, libra_opt.solvers.libra_refine as a, libra_opt.bounds as b\n"
            "import libra_opt.solvers.libra.refine as a2, libra_opt.passes.bounds as b2, libra_opt\n"
            "assert a is a2 and b is b2 and libra_opt.bounds is b2\n"
            "assert 'torch' not in sys.modules\n"
            "try:\n    import libra_opt.no_such_module\nexcept ModuleNotFoundError:\n    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO / "tests")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
