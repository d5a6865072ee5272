"""``libra-opt max-batch --model NAME --memory 16GiB [--solver S] [--seq L] [--simulate]``

The largest batch that trains (a real forward, backward and AdamW step) under
a hard memory cap, and the samples/s at that batch.  The cap is
``torch.cuda.set_per_process_memory_fraction(cap / total)``, so going over it
is an out-of-memory error; the search grows the batch exponentially, then
bisects, catching each OOM and freeing the memory before the next probe.

--solver picks the method: a solver (``libra``, the default, ``checkmate-lp``,
...: the unplanned step is profiled at two small batches only; each probed
batch is planned within cap - resident memory measured on the GPU - reserve,
calibrated by one measured step (closed loop, --no-calibrate to skip) and
trained under the cap), ``none``
(eager PyTorch), or the PyTorch references ``checkpoint`` (per-block
``torch.utils.checkpoint``, non-reentrant) and ``save-on-cpu``
(``torch.autograd.graph.save_on_cpu(pin_memory=True)``).

Without a CUDA GPU it refuses, unless --simulate: then it *predicts* the
largest batch from CPU profiles at two small batches, extrapolated linearly in
the batch, and the simulator.

The summary gives the planned and the measured reserved peak at the max batch
and what limits it: the memory floor (the op whose working set does not fit
at the first batch that failed), the plan / allocator, or --limit.
"""
from __future__ import annotations

import argparse

from .common import description, positive_int

_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "fp16": "float16", "float16": "float16"}


#: the one-line help of the command in ``libra-opt --help``
HELP = "largest batch that trains under a hard memory cap (OOM-safe search), with samples/s"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``max-batch`` subcommand; returns its parser."""
    p = subparsers.add_parser(
        "max-batch", help=HELP,
        description=description(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="NAME",
                   help="zoo name (gpt2, gpt2-medium, bert-base, llama, vit-base, resnet50, *-tiny) or "
                        "'package.module:callable'")
    p.add_argument("--memory", required=True, metavar="CAP", help="the memory cap, e.g. 16GiB")
    p.add_argument("--solver", default="libra", metavar="S",
                   help="a solver name (default libra), 'none' (eager PyTorch), 'checkpoint' or 'save-on-cpu'")
    p.add_argument("--seq", type=positive_int, metavar="L",
                   help="sequence length (language models) / image side (vision)")
    p.add_argument("--dtype", default="fp32", choices=sorted(_DTYPES), help="parameter dtype (default fp32)")
    p.add_argument("--autocast", default=None, choices=["bf16", "fp16"], help="mixed precision (torch.autocast)")
    p.add_argument("--reserve", default=None, metavar="R", type=_reserve,
                   help="kept out of the solver's budget for allocator overhead: a %% of the cap or bytes "
                        "(default: 0 with calibration, which measures that overhead; else 5%%)")
    p.add_argument("--executor", default=None, choices=["eager", "inductor"],
                   help="how a plan runs (default: inductor on CUDA, eager elsewhere)")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="plan without the closed loop (by default each plan runs one measured step and is "
                        "re-planned while its reserved peak is over the budget)")
    p.add_argument("--start", type=positive_int, default=1, metavar="B", help="first batch probed (default 1)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="B", help="never probe above this batch")
    p.add_argument("--guess", type=positive_int, default=None, metavar="B",
                   help="a predicted maximum (e.g. from --simulate): probe it first and bracket the answer "
                        "around it, about half the probes of a search from --start")
    p.add_argument("--steps", type=int, default=2, help="training steps per probe (default 2)")
    p.add_argument("--device", default="cuda", help="CUDA device (default cuda)")
    p.add_argument("--simulate", action="store_true",
                   help="no GPU: predict from CPU profiles + the simulator (a prediction, not a measurement)")
    p.add_argument("--profile-batches", default="2,4", metavar="B1,B2",
                   help="the two small batches the unplanned step is profiled at (on the GPU; on the CPU with "
                        "--simulate); other batches extrapolate their op times (default 2,4)")
    return p


def _reserve(text: str):
    """``--reserve``: a percentage of the cap in [0, 100) (a float fraction)
    or bytes with a unit (an int); anything else is a usage error (exit 2)."""
    import math

    from libra_opt.ir.units import parse_bytes

    t = text.strip()
    try:
        if t.endswith("%"):
            pct = float(t[:-1])
            if not (math.isfinite(pct) and 0 <= pct < 100):
                raise ValueError(f"a percentage of the cap must be in [0, 100), got {text!r}")
            return pct / 100.0
        return parse_bytes(t)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    """Run ``libra-opt max-batch``; returns the exit status (0, or 1 if no batch fits)."""
    import torch

    from libra_opt.errors import LibraOptError
    from libra_opt.apps.max_batch import NO_CUDA_MESSAGE, max_batch, predict_max_batch

    reserve = args.reserve
    dtype = getattr(torch, _DTYPES[args.dtype])
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast)
    try:
        b1, b2 = (int(x) for x in args.profile_batches.split(","))
    except ValueError:
        raise LibraOptError(f"--profile-batches: write two batches like 2,4, got {args.profile_batches!r}"
                            ) from None
    if args.simulate:
        from libra_opt.apps.train_methods import DEFAULT_RESERVE

        reserve = DEFAULT_RESERVE if reserve is None else reserve
        print(f"predicting the largest batch of {args.model} with {args.solver} under {args.memory} "
              f"(profiling on the CPU at batches {b1} and {b2})...", flush=True)
        result = predict_max_batch(args.model, args.memory, args.solver, seq=args.seq, profile_batches=(b1, b2),
                                   reserve=reserve, start=args.start, guess=args.guess,
                                   limit=args.limit if args.limit is not None else 1 << 16, dtype=dtype,
                                   autocast_dtype=autocast)
    else:
        if not torch.cuda.is_available():
            raise LibraOptError(NO_CUDA_MESSAGE)
        print(f"searching the largest batch of {args.model} with {args.solver} under {args.memory} on "
              f"{torch.cuda.get_device_name(torch.device(args.device))}...", flush=True)
        result = max_batch(args.model, args.memory, args.solver, seq=args.seq, device=args.device, dtype=dtype,
                           autocast_dtype=autocast, reserve=reserve, start=args.start, limit=args.limit,
                           steps=args.steps, guess=args.guess, calibrate=args.calibrate,
                           executor=args.executor, profile_batches=(b1, b2))
    print(result.summary())
    return 0 if result.batch > 0 else 1
