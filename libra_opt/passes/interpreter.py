"""A base class that walks a :class:`~libra_opt.schedule.Schedule` instruction
by instruction, in the shape of ``torch.fx.Interpreter``: one dispatch on the
opcode, one method per instruction for subclasses to override.

The simulator (:class:`~libra_opt.simulator.Simulator`) and the runtime's
lowering to FX graphs (``runtime.partition``: the graph emitter and the
saved-values liveness pass) are subclasses.  A failure inside a step is
re-raised as :class:`~libra_opt.errors.ScheduleError` naming the instruction
(index and text).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..ir.schedule import Op, Schedule

if TYPE_CHECKING:  # pragma: no cover
    from ..ir.problem import RematProblem


class ScheduleInterpreter:
    """Walks a schedule; override :meth:`compute`, :meth:`free`,
    :meth:`swap_out`, :meth:`swap_in`, :meth:`wait`, and optionally
    :meth:`start` / :meth:`finish`.

    Parameters
    ----------
    problem : RematProblem
        The problem the schedule's node and tensor ids refer to.
    """

    def __init__(self, problem: "RematProblem"):
        self.problem = problem
        self.index = -1

    def start(self) -> None:
        """Called once before the first instruction."""

    def finish(self):
        """Called once after the last instruction; its value is :meth:`run`'s."""
        return None

    def compute(self, node: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def free(self, tensor: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def swap_out(self, tensor: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def swap_in(self, tensor: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def wait(self, tensor: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, schedule: Schedule, stop: int | None = None):
        """Run instructions ``[0, stop)`` (all by default), then :meth:`finish`
        (only when the whole schedule ran).

        Raises
        ------
        ScheduleError
            A step failed; the message names the instruction.
        """
        self.start()
        instrs = schedule.instructions if stop is None else schedule.instructions[:stop]
        self.walk(instrs)
        self.index = len(instrs)
        return self.finish() if stop is None else None

    def walk(self, instructions, first: int = 0) -> None:
        """Dispatch each of ``instructions`` (numbered from ``first``: the
        position of the first one in its schedule) to its handler, with
        :attr:`index` set to that position; no :meth:`start` / :meth:`finish`
        (for a subclass that runs a schedule in parts).

        Raises
        ------
        ScheduleError
            An argument is not a node / tensor id, or a step failed; the
            message names the instruction.
        """
        steps = (self.compute, self.free, self.swap_out, self.swap_in, self.wait)
        nt, nn = len(self.problem.tensors), len(self.problem.nodes)
        compute = Op.COMPUTE
        for k, ins in enumerate(instructions, first):
            self.index = k
            op, arg = ins
            if not 0 <= arg < (nn if op == compute else nt):
                limit = nn if op == Op.COMPUTE else nt
                raise ScheduleError(f"argument {arg} is not a {'node' if op == Op.COMPUTE else 'tensor'} id "
                                    f"(0..{limit - 1})", k, repr(ins))
            try:
                steps[op](arg)
            except ScheduleError as e:
                if e.index is not None:
                    raise
                raise type(e)(str(e), k, ins.describe(self.problem)) from None

    def fail(self, message: str, cls=ScheduleError):
        """Raise ``cls(message)``; :meth:`run` adds the instruction."""
        raise cls(message)
