"""``libra-opt profile --model NAME --batch N [--seq L] [--dtype float32|bf16] [--device cpu|cuda] -o FILE``

Builds a model (a zoo name such as ``gpt2``, ``bert-base``, ``llama``,
``vit-base``, ``resnet50``, their ``*-tiny`` versions, or
``package.module:callable`` for your own), captures one training step as a
joint forward+backward graph, times every op on the device and writes the
resulting problem (``.json`` or ``.json.gz``).  Prints the node count, the
simulated no-remat peak (graph memory, and with parameters, optimizer state
and inputs) and the step time.  Nothing is downloaded: zoo models are built
from ``transformers`` configs with random weights.
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import time

from .common import check_outputs

_DTYPES = {"float32": "float32", "fp32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
           "fp16": "float16", "float16": "float16"}

from .common import description, positive_int


#: the zoo's names, written out so that --help does not import torch (tests/test_cli_usage.py
#: checks them against libra_opt.zoo.known_models())
ZOO_NAMES = ("gpt2", "gpt2-medium", "bert-base", "llama", "vit-base", "resnet50", "gpt2-tiny", "bert-tiny",
             "llama-tiny", "vit-tiny", "resnet-tiny")


#: the one-line help of the command in ``libra-opt --help``
HELP = "capture and profile one training step of a model; write its problem file"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``profile`` subcommand; returns its parser."""
    p = subparsers.add_parser(
        "profile", help=HELP,
        description=description(__doc__))
    p.add_argument("--model", required=True, metavar="NAME",
                   help=f"zoo model ({', '.join(ZOO_NAMES)}) or package.module:callable")
    p.add_argument("--batch", required=True, type=positive_int, metavar="N", help="batch size")
    p.add_argument("--seq", type=positive_int, metavar="L",
                   help="sequence length (language models) or image side in pixels (vision); default per model")
    p.add_argument("--dtype", default="float32", choices=sorted(_DTYPES), help="parameter dtype (default float32)")
    p.add_argument("--autocast", default=None, choices=["bf16", "fp16"],
                   help="capture under torch.autocast with this dtype (mixed precision; weights stay --dtype)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--optimizer", default="adam", choices=["none", "sgd", "adam"],
                   help="optimizer whose state counts as fixed memory (default adam)")
    p.add_argument("--warmup", type=int, default=2, help="untimed passes before timing (default 2)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed passes; the median is kept (default 5)")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="CPU only: torch intra-op threads while profiling (default: torch's setting); 1 gives "
                        "steadier op times on a busy machine")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="problem file to write (.json or .json.gz)")
    return p


def command_line(args: argparse.Namespace) -> str:
    """The ``libra-opt profile`` command that reproduces ``args`` (recorded in
    the problem's ``provenance.extra["command"]``)."""
    argv = ["libra-opt", "profile", "--model", args.model, "--batch", str(args.batch)]
    if args.seq is not None:
        argv += ["--seq", str(args.seq)]
    argv += ["--dtype", args.dtype]
    if args.autocast:
        argv += ["--autocast", args.autocast]
    argv += ["--device", args.device, "--optimizer", args.optimizer]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    if (args.warmup, args.repeats) != (2, 5):
        argv += ["--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    argv += ["-o", args.output]
    return shlex.join(argv)


def run(args: argparse.Namespace) -> int:
    """Run ``libra-opt profile``; returns the exit status (0 on success)."""
    import torch

    from libra_opt.ir.problem_io import save_problem
    from libra_opt.frontend.profiling import ProfilingError, profile
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.ir.units import format_bytes, format_seconds
    from libra_opt.apps.zoo import build_model

    check_outputs(args.output)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise ProfilingError(f"--device {args.device} asked but CUDA is not available; use --device cpu")
    if args.threads is not None and args.threads < 1:
        raise ProfilingError(f"--threads must be >= 1, got {args.threads}")
    dtype = getattr(torch, _DTYPES[args.dtype])
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast) if args.autocast else None
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        zm = build_model(args.model, args.batch, args.seq, device=args.device, dtype=dtype)
        print(f"model: {zm.description} ({zm.num_parameters / 1e6:.1f} M parameters, {args.dtype}, "
              f"{args.device})")
        problem = profile(zm, optimizer=args.optimizer, device=args.device, autocast_dtype=autocast,
                          warmup=args.warmup, repeats=args.repeats, progress=not args.no_progress)
    finally:
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - t0
    extra = dict(problem.provenance.extra, command=command_line(args))
    problem = problem.replace(provenance=dataclasses.replace(problem.provenance, extra=extra))
    path = save_problem(problem, args.output)
    peak = no_remat_peak(problem)
    n_fwd = sum(1 for n in problem.nodes if n.phase == "forward")
    print(f"nodes: {problem.num_nodes} ({n_fwd} forward, {problem.num_nodes - n_fwd} backward), "
          f"tensors: {len(problem.tensors)}")
    print(f"no-remat peak: {format_bytes(peak)} graph memory, "
          f"{format_bytes(peak + problem.fixed.resident_bytes)} with parameters, optimizer state and inputs")
    prof = problem.provenance.extra.get("profile", {})
    print(f"step time: {format_seconds(problem.total_compute_s)} (sum of median op times on {problem.device.name}"
          + (f", calibrated x{prof['calibration']:.3f} to the measured step; spread (relative IQR) of the step "
             f"{prof['spread']['step']:.1%}, of the ops {prof['spread']['op_weighted']:.1%})" if prof else ")"))
    print(f"wrote {path} in {elapsed:.1f} s")
    return 0
