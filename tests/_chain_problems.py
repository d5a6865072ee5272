"""A small problem whose recomputation chain regenerates an input freed after its last use
(shared by the lowering's and the ``libra`` swapped-inputs pass's tests)."""
from __future__ import annotations

from libra_opt.ir.problem import ProblemBuilder


def input_of_a_recomputation():
    """``(problem, a, m)``: fo reads m again; regenerating m replays fm, which reads a, freed after
    its last use (fm).  Bytes: a 10, m 20, y 30; 1 s per node."""
    b = ProblemBuilder()
    x = b.input("x", 4)
    (a,) = b.op("fa", [x], [("a", 10)], time_s=1)
    (m,) = b.op("fm", [a], [("m", 20)], time_s=1)
    (y,) = b.op("fy", [m], [("y", 30)], time_s=1)
    (z,) = b.op("fz", [y], [("z", 4)], time_s=1)
    (o,) = b.op("fo", [m, z], [("o", 4)], time_s=1)
    return b.build(outputs=[o]), a, m
