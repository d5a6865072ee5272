"""Speed of the ``libra`` solver: one plan and a sweep of 20 budgets on a
synthetic ~5,000-node transformer-like training step.

Targets (issue 4, on the project's 2-core CPU): one plan in under 1 s and a
20-budget sweep in under 2 s for a 5,000-node problem.  The problem comes from
:func:`transformer_problem`: a GPT-like decoder (layer norm, QKV projection
with head views, attention scores, softmax, dropout, attention output,
projection, residuals, MLP with GELU) and its mirrored backward pass, with op
times and bytes from an H100 model (matmuls at 400 TFLOP/s, memory-bound ops
at 2.5 TB/s, 4 us launch floor) and 55 GB/s pinned host copies each way.

Usage::

    python benchmarks/libra_speed.py                 # 5,000-node problem, every policy
    python benchmarks/libra_speed.py --policy recompute --repeat 5
    python benchmarks/libra_speed.py --problem problems/some.json.gz

Prints a markdown table per policy: wall-clock and process-CPU seconds of one
``solve`` and of one ``solve_many`` over 20 budgets (everything a caller
waits for: descents, finishing, lowering and the validating simulations), and
how many of the 20 budgets got a plan.  CPU seconds are the fairer number on
a shared machine.  The repeats run on one problem object, whose per-problem
caches (lowering tables, simulator tables, the pristine timeline) are then
warm, as in a session that plans one model many times; the "cold" column is
one sweep on a fresh copy of the problem, as on a user's first call.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from libra_opt.ir.problem import BACKWARD, DeviceProfile, ProblemBuilder, Provenance, RematProblem

MATMUL_FLOP_S = 400e12    #: dense bf16 matmul throughput assumed for an H100, FLOP/s
MEM_BYTES_S = 2.5e12      #: HBM bandwidth reached by memory-bound ops, bytes/s
LAUNCH_S = 4e-6           #: per-op floor, s
H100_PCIE_BYTES_S = 55e9  #: pinned host<->device bandwidth each way, bytes/s


def _mm_time(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k / MATMUL_FLOP_S + LAUNCH_S


def _ew_time(nbytes: int) -> float:
    return nbytes / MEM_BYTES_S + LAUNCH_S


def transformer_problem(layers: int = 108, batch: int = 8, seq: int = 1024, hidden: int = 1024, heads: int = 16,
                        dtype_bytes: int = 2, dropout_recomputable: bool = False) -> RematProblem:
    """A GPT-like training step as a :class:`RematProblem` (forward + mirrored backward).

    Per layer the forward has 17 ops (``ln1, qkv, view_q, view_k, view_v,
    scores, softmax, dropout, attn, proj, add1, ln2, fc1, gelu, fc2, dropout2,
    add2``) and the backward 29 (one per differentiable input, plus gradient sums), so ``layers=108`` gives ~5,000
    nodes.  Dropout ops are not recomputable unless ``dropout_recomputable``
    (their RNG state is not replayed).  Weight gradients are step outputs.

    Parameters
    ----------
    layers, batch, seq, hidden, heads : int
    dtype_bytes : int
        Bytes per element (2 for bf16).
    dropout_recomputable : bool

    Returns
    -------
    RematProblem
        Device: 55 GB/s each way, copies overlap compute (an H100 over PCIe).
    """
    b = ProblemBuilder()
    tok = batch * seq
    act = tok * hidden * dtype_bytes
    x = b.input("x", act)
    fwd: list[tuple[int, list[int], list[int], int]] = []   # (node, inputs, saved, output)
    counter = [0]

    def op(name, inputs, nbytes, time_s, saved=None, view_of=None, recomputable=True, ws=0):
        counter[0] += 1
        spec = (f"{name}", 0, view_of) if view_of is not None else (f"{name}", nbytes)
        (t,) = b.op(f"{name}", inputs, [spec], time_s=time_s, recomputable=recomputable, workspace_bytes=ws)
        fwd.append((counter[0] - 1, list(inputs), list(saved if saved is not None else inputs), t))
        return t

    weights = []
    h = x
    hd = hidden // heads
    score_bytes = batch * heads * seq * seq * dtype_bytes
    for i in range(layers):
        w_qkv = b.input(f"l{i}.w_qkv", 3 * hidden * hidden * dtype_bytes)
        w_o = b.input(f"l{i}.w_o", hidden * hidden * dtype_bytes)
        w_1 = b.input(f"l{i}.w_fc1", 4 * hidden * hidden * dtype_bytes)
        w_2 = b.input(f"l{i}.w_fc2", 4 * hidden * hidden * dtype_bytes)
        weights += [w_qkv, w_o, w_1, w_2]
        ln1 = op(f"l{i}.ln1", [h], act, _ew_time(2 * act))
        qkv = op(f"l{i}.qkv", [ln1, w_qkv], 3 * act, _mm_time(tok, 3 * hidden, hidden))
        q = op(f"l{i}.q", [qkv], 0, 1e-7, view_of=qkv)
        k = op(f"l{i}.k", [qkv], 0, 1e-7, view_of=qkv)
        v = op(f"l{i}.v", [qkv], 0, 1e-7, view_of=qkv)
        sc = op(f"l{i}.scores", [q, k], score_bytes, _mm_time(batch * heads * seq, seq, hd))
        sm = op(f"l{i}.softmax", [sc], score_bytes, _ew_time(2 * score_bytes), saved=[])
        dr = op(f"l{i}.attn_dropout", [sm], score_bytes, _ew_time(2 * score_bytes), recomputable=dropout_recomputable)
        at = op(f"l{i}.attn", [dr, v], act, _mm_time(batch * heads * seq, hd, seq))
        pr = op(f"l{i}.proj", [at, w_o], act, _mm_time(tok, hidden, hidden))
        a1 = op(f"l{i}.add1", [pr, h], act, _ew_time(3 * act), saved=[])
        ln2 = op(f"l{i}.ln2", [a1], act, _ew_time(2 * act))
        f1 = op(f"l{i}.fc1", [ln2, w_1], 4 * act, _mm_time(tok, 4 * hidden, hidden))
        ge = op(f"l{i}.gelu", [f1], 4 * act, _ew_time(8 * act))
        f2 = op(f"l{i}.fc2", [ge, w_2], act, _mm_time(tok, hidden, 4 * hidden))
        d2 = op(f"l{i}.dropout2", [f2], act, _ew_time(2 * act), recomputable=dropout_recomputable)
        h = op(f"l{i}.add2", [d2, a1], act, _ew_time(3 * act), saved=[])
    loss = op("loss", [h], 4, _ew_time(act))
    outputs = [loss]
    # mirrored backward: one op per (forward op, differentiable input), accumulating gradients
    grads: dict[int, int] = {h: loss}
    for i, (node, inputs, saved, out) in reversed(list(enumerate(fwd))):
        g = grads.get(out)
        if g is None:
            continue
        base_saved = [t for t in saved if t != x and t not in weights]
        for t in inputs:
            if t == x:
                continue
            if t in weights:
                (gw,) = b.op(f"bw{i}.d_{t}", [g] + base_saved, [(f"grad_w{t}", b._tensors[t]["nbytes"])],
                             time_s=_mm_time(tok, hidden, hidden), phase=BACKWARD)
                outputs.append(gw)
                continue
            nbytes = b._tensors[b._tensors[t]["storage"]]["nbytes"] or act
            (gt,) = b.op(f"bw{i}.d_{t}", [g] + base_saved, [(f"grad{t}.{i}", nbytes)],
                         time_s=2 * _ew_time(2 * nbytes) if nbytes != act else _mm_time(tok, hidden, hidden),
                         phase=BACKWARD)
            if t in grads:
                (gs,) = b.op(f"bw{i}.acc_{t}", [grads[t], gt], [(f"gsum{t}.{i}", nbytes)],
                             time_s=_ew_time(3 * nbytes), phase=BACKWARD)
                grads[t] = gs
            else:
                grads[t] = gt
    return b.build(outputs=outputs, device=DeviceProfile(name="H100 (synthetic)", h2d_bytes_per_s=H100_PCIE_BYTES_S,
                                                         d2h_bytes_per_s=H100_PCIE_BYTES_S),
                   provenance=Provenance(source="manual", model=f"synthetic-gpt-{layers}l", batch=batch, seq=seq,
                                         dtype="bfloat16"),
                   name=f"synthetic-gpt-{layers}l")


def _time_solver(problem, budgets, one_budget, policy, portfolio, repeat, fresh):
    """Median wall-clock and process-CPU seconds of one ``solve`` and of one
    ``solve_many`` over ``budgets`` (the base class's validating simulation of
    each plan included), how many budgets got a plan, and the wall-clock
    seconds of one *cold* ``solve_many`` on ``fresh()``, a new copy of the
    problem (the per-problem caches of the lowering, simulator and solver
    empty, as on a user's first call)."""
    from libra_opt.solvers import get_solver

    rows = []
    for _ in range(repeat):
        solver = get_solver("libra", policy=policy, portfolio=portfolio)
        w, c = time.perf_counter(), time.process_time()
        solver.solve(problem, one_budget, raise_on_infeasible=False)
        one = (time.perf_counter() - w, time.process_time() - c)
        w, c = time.perf_counter(), time.process_time()
        results = solver.solve_many(problem, budgets)
        many = (time.perf_counter() - w, time.process_time() - c)
        rows.append((one, many, sum(r.success for r in results)))
    cold_problem = fresh()
    w = time.perf_counter()
    get_solver("libra", policy=policy, portfolio=portfolio).solve_many(cold_problem, budgets)
    cold = time.perf_counter() - w
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return (med([r[0][0] for r in rows]), med([r[0][1] for r in rows]), med([r[1][0] for r in rows]),
            med([r[1][1] for r in rows]), rows[-1][2], cold)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=108, help="transformer layers (108 -> ~5,000 nodes)")
    ap.add_argument("--problem", default=None, help="a problem file instead of the synthetic one")
    ap.add_argument("--policy", default=None, choices=["hybrid", "recompute", "swap"],
                    help="one policy (default: hybrid with and without portfolio, recompute, swap)")
    ap.add_argument("--one", type=float, default=0.6, help="budget of the single plan (fraction of the "
                                                           "no-remat peak; default 0.6)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    from libra_opt.passes.simulator import no_remat_peak

    if args.problem:
        from libra_opt.ir.problem_io import load_problem

        def fresh():
            return load_problem(args.problem)
    else:
        def fresh():
            return transformer_problem(layers=args.layers)
    problem = fresh()
    peak = no_remat_peak(problem)
    budgets = [round(0.95 - 0.03 * k, 2) for k in range(20)]   # 0.95 .. 0.38 of the no-remat peak
    runs = [(args.policy, True)] if args.policy else [("hybrid", True), ("hybrid", False), ("recompute", True),
                                                       ("swap", True)]
    print(f"problem {problem.name}: {problem.num_nodes} nodes, no-remat peak {peak / 2**30:.2f} GiB; "
          f"one plan at {args.one}, sweep of 20 budgets {budgets[0]}..{budgets[-1]}; median of {args.repeat}")
    print("| policy | one plan wall (s) | one plan CPU (s) | sweep of 20 wall (s) | sweep CPU (s) | "
          "sweep of 20, cold (s) | plans |")
    print("|---|---|---|---|---|---|---|")
    for policy, portfolio in runs:
        label = policy + (" (no portfolio)" if policy == "hybrid" and not portfolio else "")
        ow, oc, mw, mc, found, cold = _time_solver(problem, budgets, args.one, policy, portfolio, args.repeat,
                                                   fresh)
        print(f"| {label} | {ow:.3f} | {oc:.3f} | {mw:.3f} | {mc:.3f} | {cold:.3f} | {found}/20 |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
