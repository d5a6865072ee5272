"""Regenerate the profiled problem instances in ``problems/`` and their README table.

Each instance is made by the ``libra-opt profile`` command (run in-process
through :func:`libra_opt.cli.main`), which records its own command line in
the problem's ``provenance.extra["command"]``.  The README table is then
rebuilt from the files themselves (model, batch, sequence / resolution,
dtype, device, torch version, node count, simulated no-remat peak, step time,
command).

Usage::

    python benchmarks/make_problems.py                  # CPU set (a few minutes on 2 cores)
    python benchmarks/make_problems.py --device cuda    # GPU set at training batch sizes
    python benchmarks/make_problems.py --only gpt2 resnet50
    python benchmarks/make_problems.py --readme-only    # just rebuild the table

The GPU set uses the batch sizes a user would train with on an 80 GB GPU
(GPT-2 small b8 s1024, GPT-2 medium b4 s1024, ResNet-50 b128, ViT-B/16 b64,
BERT-base b32 s512, Llama b8 s1024); the CPU set uses sizes that profile in
well under a few minutes each on 2 cores.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "problems"

#: (model, batch, seq or None) per device kind
CPU_SET = [
    ("gpt2-tiny", 2, 32),
    ("resnet-tiny", 8, 32),
    ("gpt2", 2, 128),
    ("bert-base", 2, 128),
    ("llama", 2, 128),
    ("vit-base", 2, None),
    ("resnet50", 4, None),
]
CUDA_SET = [
    ("gpt2", 8, 1024),
    ("gpt2-medium", 4, 1024),
    ("bert-base", 32, 512),
    ("llama", 8, 1024),
    ("vit-base", 64, None),
    ("resnet50", 128, None),
]

log = logging.getLogger("make_problems")


def device_tag(device: str) -> str:
    """``"cpu"``, or a short GPU name such as ``"h100"`` (``"cuda"`` if unknown)."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    name = torch.cuda.get_device_name(torch.device(device)).lower()
    m = re.search(r"\b([a-z]\d{2,4}[a-z]?)\b", name)
    return m.group(1) if m else "cuda"


def file_name(model: str, batch: int, seq: int | None, tag: str, dtype: str) -> str:
    """``<model>-b<batch>[-s<seq>]-<device>[-<dtype>].json.gz``."""
    parts = [model, f"b{batch}"] + ([f"s{seq}"] if seq else []) + [tag]
    if dtype != "float32":
        parts.append(dtype)
    return "-".join(parts) + ".json.gz"


def make(model: str, batch: int, seq: int | None, device: str, dtype: str, autocast: str | None,
         optimizer: str, threads: int | None = None) -> Path:
    """Profile one instance with ``libra-opt profile``; returns the file written."""
    from libra_opt.cli import main

    out = PROBLEMS / file_name(model, batch, seq, device_tag(device), autocast or dtype)
    argv = ["profile", "--model", model, "--batch", str(batch)]
    if seq:
        argv += ["--seq", str(seq)]
    argv += ["--dtype", dtype]
    if autocast:
        argv += ["--autocast", autocast]
    argv += ["--device", device, "--optimizer", optimizer]
    if threads:
        argv += ["--threads", str(threads)]
    argv += ["-o", str(out.relative_to(ROOT))]
    log.info("running: libra-opt %s", " ".join(argv))
    t0 = time.perf_counter()
    rc = main(argv)
    if rc != 0:
        raise SystemExit(f"libra-opt profile failed for {model} (exit {rc})")
    log.info("%s done in %.1f s", out.name, time.perf_counter() - t0)
    return out


def readme_rows() -> list[str]:
    """One markdown table row per problem file in ``problems/``."""
    from libra_opt.ir.problem_io import load_problem
    from libra_opt.passes.simulator import no_remat_peak
    from libra_opt.ir.units import format_bytes, format_seconds

    rows = []
    for path in sorted(PROBLEMS.glob("*.json*")):
        p = load_problem(path)
        pv, ex = p.provenance, p.provenance.extra
        vision = any(k in pv.model for k in ("vit", "resnet"))
        size = "" if pv.seq is None else (f"{pv.seq}x{pv.seq} px" if vision else f"{pv.seq} tokens")
        dtype = pv.dtype + (f" (autocast {ex['autocast_dtype']})" if ex.get("autocast_dtype") else "")
        peak = no_remat_peak(p)
        rows.append(f"| `{path.name}` | {pv.model} | {pv.batch} | {size} | {dtype} | {p.device.name} | "
                    f"{pv.torch_version} | {p.num_nodes} | {format_bytes(peak)} | "
                    f"{format_seconds(p.total_compute_s)} | `{ex.get('command', '')}` |")
    return rows


BEGIN, END = "<!-- table:begin -->", "<!-- table:end -->"


def write_readme() -> None:
    """Replace the table between the markers in ``problems/README.md``."""
    readme = PROBLEMS / "README.md"
    header = ("| file | model | batch | sequence / resolution | dtype | device | torch | nodes | "
              "no-remat peak | step time | command |\n"
              "| --- | --- | ---: | --- | --- | --- | --- | ---: | ---: | ---: | --- |")
    table = "\n".join([BEGIN, header, *readme_rows(), END])
    text = readme.read_text() if readme.exists() else f"# Problem instances\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text:
        text += f"\n{BEGIN}\n{END}\n"
    pre, rest = text.split(BEGIN, 1)
    post = rest.split(END, 1)[1] if END in rest else ""
    from libra_opt.atomic import write_text

    write_text(readme, pre + table + post)
    log.info("wrote %s", readme)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bf16"])
    ap.add_argument("--autocast", choices=["bf16", "fp16"], help="capture under autocast (mixed precision)")
    ap.add_argument("--optimizer", default="adam", choices=["none", "sgd", "adam"])
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU only: torch threads while profiling (default 1: steadier on a shared machine)")
    ap.add_argument("--only", nargs="+", metavar="MODEL", help="only these zoo models")
    ap.add_argument("--readme-only", action="store_true", help="only rebuild the README table")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    PROBLEMS.mkdir(exist_ok=True)
    if not args.readme_only:
        todo = CUDA_SET if args.device.startswith("cuda") else CPU_SET
        if args.only:
            todo = [t for t in todo if t[0] in args.only]
        for model, batch, seq in todo:
            make(model, batch, seq, args.device, args.dtype, args.autocast, args.optimizer,
                 None if args.device.startswith("cuda") else args.threads)
    write_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
