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
DRIVER = {"refine", "finish", "exchange", "switch", "solver", "explain", "records", "tidy", "continued"}


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


def _cyclic(graph: dict[str, set[str]]) -> list[str]:
    """The modules of ``graph`` (module -> modules it imports) that reach themselves."""
    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for d in graph.get(todo.pop(), ()):
                if d == goal:
                    return True
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return False

    return sorted(m for m in graph if reaches(m, m))


def test_driver_modules_import_no_cycle():
    graph = {m: {d for d, _ in deps} for m, deps in _imports().items()}
    cyclic = [m for m in _cyclic(graph) if m in DRIVER]
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


# ------------------------------------------------------------------ all of solvers/ (issue 14's "done when")
SOLVERS = Path(__file__).resolve().parents[1] / "solvers"


def _module_name(p: Path) -> str:
    parts = list(p.relative_to(SOLVERS.parent).with_suffix("").parts)
    parts = ["libra_opt", *parts]            # solvers/ is installed as libra_opt.solvers
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _solver_modules() -> dict[str, tuple[Path, ast.Module]]:
    return {_module_name(p): (p, ast.parse(p.read_text())) for p in SOLVERS.rglob("*.py")}


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Module -> the solvers/ modules it imports (at any depth: lazy and TYPE_CHECKING
    imports count), and the underscore names imported from another project module."""
    mods = _solver_modules()
    graph, private = {}, []
    for m, (p, tree) in mods.items():
        pkg = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        deps = set()
        for n in ast.walk(tree):
            if not isinstance(n, ast.ImportFrom):
                continue
            base = ".".join(pkg[:len(pkg) - n.level + 1] + ([n.module] if n.module else [])) if n.level \
                else n.module or ""
            for a in n.names:
                if f"{base}.{a.name}" in mods:
                    deps.add(f"{base}.{a.name}")
                elif base in mods or base.startswith("libra_opt."):
                    if base in mods:
                        deps.add(base)
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        private.append((m, base, a.name))
        deps.discard(m)
        graph[m] = deps
    return graph, private


def test_no_module_under_solvers_imports_one_that_imports_it_back():
    graph, _ = _graph()
    assert len(graph) > 20
    assert not _cyclic(graph)


def test_no_module_under_solvers_imports_an_underscore_name_of_the_project():
    _, private = _graph()
    assert not private, private


def test_no_class_under_solvers_is_built_from_two_project_classes():
    multi = [(m, n.name, [ast.unparse(b) for b in n.bases]) for m, (_, tree) in _solver_modules().items()
             for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
             and sum(not ast.unparse(b).startswith(("typing.", "Protocol", "NamedTuple", "Enum", "str", "int",
                                                     "Exception", "Warning")) for b in n.bases) >= 2]
    assert not multi, multi
