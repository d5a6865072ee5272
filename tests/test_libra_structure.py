"""The libra solver's driver modules as parts with declared interfaces (issue 14): the
descent (refine.py), the finish step (finish.py), the exchange moves (exchange.py), the
policy switches (switch.py), the solver (solver.py) and the records and passes they share
(records.py, tidy.py, explain.py) import each other without cycles (lazy and
``TYPE_CHECKING`` imports count), import no underscore name from another module, and the
finish step is composed around the descent, not inherited.  Read from the source (AST), so
no import order hides a cycle."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "solvers" / "libra"
DRIVER = {"refine", "finish", "exchange", "switch", "solver", "explain", "records", "tidy"}


def _imports() -> dict[str, list[tuple[str, list[str]]]]:
    """Module -> ``(imported sibling module, names)`` for every import of a sibling, at any depth."""
    mods = {p.stem for p in PKG.glob("*.py")}
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for p in PKG.glob("*.py"):
        found = []
        for n in ast.walk(ast.parse(p.read_text())):
            if not isinstance(n, ast.ImportFrom):
                continue
            mod = n.module or ""
            names = [a.name for a in n.names]
            if n.level == 1 and mod in mods:
                found.append((mod, names))
            elif n.level == 1 and not mod:
                found += [(a, []) for a in names if a in mods]
            elif mod.startswith("libra_opt.solvers.libra.") and mod.rsplit(".", 1)[1] in mods:
                found.append((mod.rsplit(".", 1)[1], names))
        out[p.stem] = [(m, names) for m, names in found if m != p.stem]
    return out


def test_driver_modules_import_no_cycle():
    graph = {m: {d for d, _ in deps} for m, deps in _imports().items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            for d in graph.get(m, ()):
                if d == goal:
                    return True
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return False

    cyclic = sorted(m for m in DRIVER if m in graph and reaches(m, m))
    assert not cyclic, f"import cycles through {cyclic}"


def test_driver_modules_import_only_public_names():
    bad = [(m, d, name) for m, deps in _imports().items() if m in DRIVER
           for d, names in deps for name in names if name.startswith("_")]
    assert not bad, bad


def test_records_import_none_of_their_users():
    users = {"refine", "finish", "exchange", "switch", "solver", "tidy"}
    deps = {d for d, _ in _imports()["records"]}
    assert not deps & users, deps & users


def test_finish_step_is_composed_around_the_descent():
    from libra_opt.solvers.libra.finish import Finisher
    from libra_opt.solvers.libra.refine import Refiner

    assert Refiner.__bases__ == (object,)
    assert Finisher.__bases__ == (object,)
    assert not hasattr(Finisher, "_caches_of")
