"""Reading and writing :class:`~libra_opt.problem.RematProblem` as JSON.

The file format (``schema = "libra-opt/remat-problem"``, ``version = 1``)::

    {"schema": "libra-opt/remat-problem", "version": 1,
     "name": str, "provenance": {...}, "device": {...}, "fixed": {...},
     "nodes":   [{"id", "name", "target", "phase", "time_s", "workspace_bytes",
                  "recomputable", "inputs", "outputs", "module", "pointwise"}, ...],
     "tensors": [{"id", "name", "producer", "storage", "nbytes", "kind",
                  "shape", "dtype"}, ...],
     "outputs": [tensor id, ...], "executor": str}

Fields added without a version change, optional on load (files written
before them load with their defaults): ``nodes[].pointwise`` (bool, default false: the node is a
memory-bound fusible op, :func:`libra_opt.costs.is_fusible_op`),
``device.memory_bytes_per_s`` (float or null, default null: measured
device-memory bandwidth, bytes read + written per second), ``executor``
(``"eager"`` default or ``"inductor"``: the recompute cost model of
:mod:`libra_opt.costs`).  Profiling spread and calibration are recorded in
``provenance.extra["profile"]`` (see :func:`libra_opt.profiling.profile_step`).

Units are those of the IR: seconds (``time_s``), bytes (``*_bytes``,
``nbytes``), bytes per second (``h2d_bytes_per_s``, ``d2h_bytes_per_s``).
Tensor **consumers are derived** from the nodes' ``inputs`` on load, never
trusted from the file (a ``consumers`` list, if present, must agree).  A path
ending in ``.gz`` is read and written gzip-compressed.  The writer puts one
node or tensor per line so that problem files under ``problems/`` diff well.

Every field is type-checked on load: a corrupt file, a wrong schema or
version, or a missing or mistyped field raises
:class:`~libra_opt.errors.ProblemFileError` whose ``field`` is the dotted
path of the offending field (``"nodes[12].time_s"``); a file whose fields are
well typed but break an invariant of the IR (order, producers before
consumers, storage accounting) raises it too, naming the file.

Round trip is exact: ``problem_from_dict(problem_to_dict(p))`` has equal
nodes, tensors, outputs, fixed memory, device, provenance and name (floats are
written with Python's shortest round-tripping ``repr``).  ``Provenance.extra``
must hold JSON values; tuples in it come back as lists.

Source: the IR of :mod:`libra_opt.problem` (``DESIGN.md``, "The problem IR");
JSON via the standard :mod:`json` and :mod:`gzip` modules.
"""
from __future__ import annotations

import gzip
import io
import json
import logging
import math
import os
import zlib
from pathlib import Path
from typing import Any, Callable

from ..atomic import atomic_write
from ..errors import ProblemError, ProblemFileError
from .problem import (ACTIVATION, EXECUTORS, INPUT, PHASES, TENSOR_KINDS, DeviceProfile, FixedMemory, Node,
                      Provenance, RematProblem, Tensor)

log = logging.getLogger(__name__)

PROBLEM_SCHEMA = "libra-opt/remat-problem"
PROBLEM_VERSION = 1

__all__ = ["PROBLEM_SCHEMA", "PROBLEM_VERSION", "save_problem", "load_problem", "problem_to_dict",
           "problem_from_dict", "read_json", "is_problem_dict"]


# --------------------------------------------------------------------- writing
def problem_to_dict(problem: RematProblem) -> dict:
    """The JSON-ready dictionary of ``problem`` (see the module docstring).

    Parameters
    ----------
    problem : RematProblem

    Returns
    -------
    dict
        Plain ``dict``/``list``/``str``/``int``/``float``/``bool``/``None`` values.
        Tensor consumers are omitted (they are derived on load).
    """
    fx, dv, pv = problem.fixed, problem.device, problem.provenance
    return {
        "schema": PROBLEM_SCHEMA,
        "version": PROBLEM_VERSION,
        "name": problem.name,
        "provenance": {"source": pv.source, "model": pv.model, "batch": pv.batch, "seq": pv.seq,
                       "dtype": pv.dtype, "torch_version": pv.torch_version, "date": pv.date,
                       "extra": dict(pv.extra)},
        "device": {"name": dv.name, "total_memory_bytes": dv.total_memory_bytes,
                   "h2d_bytes_per_s": dv.h2d_bytes_per_s, "d2h_bytes_per_s": dv.d2h_bytes_per_s,
                   "copies_overlap_compute": dv.copies_overlap_compute,
                   "memory_bytes_per_s": dv.memory_bytes_per_s},
        "fixed": {"parameters_bytes": fx.parameters_bytes, "buffers_bytes": fx.buffers_bytes,
                  "gradients_bytes": fx.gradients_bytes, "optimizer_state_bytes": fx.optimizer_state_bytes,
                  "inputs_bytes": fx.inputs_bytes, "optimizer": fx.optimizer},
        "nodes": [{"id": n.id, "name": n.name, "target": n.target, "phase": n.phase, "time_s": n.time_s,
                   "workspace_bytes": n.workspace_bytes, "recomputable": n.recomputable,
                   "inputs": list(n.inputs), "outputs": list(n.outputs), "module": n.module,
                   "pointwise": n.pointwise}
                  for n in problem.nodes],
        "tensors": [{"id": t.id, "name": t.name, "producer": t.producer, "storage": t.storage,
                     "nbytes": t.nbytes, "kind": t.kind,
                     "shape": None if t.shape is None else list(t.shape), "dtype": t.dtype}
                    for t in problem.tensors],
        "outputs": list(problem.outputs),
        "executor": problem.executor,
    }


def _dumps(d: dict) -> str:
    """JSON text with one node/tensor per line (diff-friendly)."""
    dump = lambda v: json.dumps(v, allow_nan=False, ensure_ascii=False)  # noqa: E731
    lines = ["{"]
    keys = list(d)
    for k, key in enumerate(keys):
        comma = "," if k < len(keys) - 1 else ""
        val = d[key]
        if key in ("nodes", "tensors") and val:
            lines.append(f"  {dump(key)}: [")
            lines.extend(f"    {dump(item)}{',' if j < len(val) - 1 else ''}" for j, item in enumerate(val))
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {dump(key)}: {dump(val)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def save_problem(problem: RematProblem, path: str | os.PathLike) -> Path:
    """Write ``problem`` to ``path`` as JSON (gzip-compressed if it ends in ``.gz``).

    The file is written with :func:`libra_opt.atomic.atomic_write` (a fresh
    temporary file next to ``path``, fsync, rename), so an interrupted or
    failed write leaves the old file, and no temporary file, behind.

    Parameters
    ----------
    problem : RematProblem
    path : str or PathLike

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ProblemError
        A value cannot be written as JSON (a non-finite time or bandwidth, or
        a non-JSON value in ``provenance.extra``).
    OutputPathError
        ``path`` cannot be written (a missing or read-only directory, a full
        disk).
    """
    path = Path(path)
    try:
        text = _dumps(problem_to_dict(problem))
    except (TypeError, ValueError) as e:
        raise ProblemError(f"problem {problem.name!r} cannot be written as JSON ({e}): times and bandwidths "
                           f"must be finite and provenance.extra must hold JSON values") from e
    data = text.encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip_bytes(data)
    with atomic_write(path, "wb") as f:
        f.write(data)
    log.info("wrote problem %r (%d nodes, %d tensors) to %s", problem.name, len(problem.nodes),
             len(problem.tensors), path)
    return path


def gzip_bytes(data: bytes) -> bytes:
    """``data`` gzip-compressed with ``mtime=0`` and no file name, so the same
    data always gives the same bytes (:class:`gzip.GzipFile`)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


# --------------------------------------------------------------------- reading
def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file, gunzipping it first if ``path`` ends in ``.gz``.

    Raises
    ------
    FileNotFoundError
        No such file.
    ProblemFileError
        The file is not valid (gzip-compressed) UTF-8 JSON; the message names
        the file and the position.
    """
    path = Path(path)
    raw = path.read_bytes()
    try:
        if path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
        return json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, zlib.error) as e:
        raise ProblemFileError(f"{path}: not a valid gzip file ({e}); write it with save_problem or gzip") from e
    except UnicodeDecodeError as e:
        raise ProblemFileError(f"{path}: not UTF-8 text ({e})") from e
    except json.JSONDecodeError as e:
        raise ProblemFileError(f"{path}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from e


def is_problem_dict(d: Any) -> bool:
    """True if ``d`` claims to be a libra-opt problem (its ``schema`` field)."""
    return isinstance(d, dict) and d.get("schema") == PROBLEM_SCHEMA


class _FieldError(Exception):
    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message = message
        self.field = field


_MISSING = object()


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _get(obj: dict, key: str, path: str, check: Callable[[Any, str], Any], default: Any = _MISSING) -> Any:
    where = f"{path}.{key}" if path else key
    if key not in obj:
        if default is _MISSING:
            raise _FieldError(f"missing field {where!r}", where)
        return default
    return check(obj[key], where)


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise _FieldError(f"{where} must be an integer, got {v!r} ({_type_name(v)})", where)
    return int(v)


def _nonneg_int(v: Any, where: str) -> int:
    v = _int(v, where)
    if v < 0:
        raise _FieldError(f"{where} must be >= 0, got {v}", where)
    return v


def _opt_int(v: Any, where: str) -> int | None:
    return None if v is None else _int(v, where)


def _float(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _FieldError(f"{where} must be a finite number, got {v!r} ({_type_name(v)})", where)
    return float(v)


def _pos_float(v: Any, where: str) -> float:
    v = _float(v, where)
    if v <= 0:
        raise _FieldError(f"{where} must be > 0, got {v}", where)
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise _FieldError(f"{where} must be a string, got {v!r} ({_type_name(v)})", where)
    return v


def _opt_str(v: Any, where: str) -> str | None:
    return None if v is None else _str(v, where)


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise _FieldError(f"{where} must be true or false, got {v!r} ({_type_name(v)})", where)
    return v


def _choice(choices: tuple[str, ...]) -> Callable[[Any, str], str]:
    def check(v: Any, where: str) -> str:
        if v not in choices:
            raise _FieldError(f"{where} must be one of {list(choices)}, got {v!r}", where)
        return v
    return check


def _obj(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise _FieldError(f"{where} must be an object, got {_type_name(v)}", where)
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise _FieldError(f"{where} must be a list, got {_type_name(v)}", where)
    return v


def _int_list(v: Any, where: str) -> tuple[int, ...]:
    return tuple(_int(x, f"{where}[{k}]") for k, x in enumerate(_list(v, where)))


def _opt_shape(v: Any, where: str) -> tuple[int, ...] | None:
    return None if v is None else tuple(_nonneg_int(x, f"{where}[{k}]") for k, x in enumerate(_list(v, where)))


def _no_unknown(obj: dict, known: set[str], path: str) -> None:
    extra = sorted(set(obj) - known)
    if extra:
        where = f"{path}.{extra[0]}" if path else extra[0]
        raise _FieldError(f"unknown field {where!r}; known fields here: {sorted(known)}", where)


def _read_node(d: Any, k: int) -> Node:
    p = f"nodes[{k}]"
    d = _obj(d, p)
    _no_unknown(d, {"id", "name", "target", "phase", "time_s", "workspace_bytes", "recomputable", "inputs",
                    "outputs", "module", "pointwise"}, p)
    nid = _get(d, "id", p, _int)
    if nid != k:
        raise _FieldError(f"{p}.id is {nid} but the node is at position {k}; ids must equal the eager order",
                          f"{p}.id")
    name = _get(d, "name", p, _str)
    inputs = _get(d, "inputs", p, _int_list)
    if len(set(inputs)) != len(inputs):
        raise _FieldError(f"{p}.inputs lists a tensor twice ({list(inputs)}); list each input once",
                          f"{p}.inputs")
    return Node(id=nid, name=name, target=_get(d, "target", p, _str, name),
                phase=_get(d, "phase", p, _choice(PHASES)),
                time_s=_get(d, "time_s", p, _float), workspace_bytes=_get(d, "workspace_bytes", p, _nonneg_int, 0),
                recomputable=_get(d, "recomputable", p, _bool, True), inputs=inputs,
                outputs=_get(d, "outputs", p, _int_list), module=_get(d, "module", p, _str, ""),
                pointwise=_get(d, "pointwise", p, _bool, False))


def _read_tensor(d: Any, k: int, consumers: dict[int, list[int]]) -> Tensor:
    p = f"tensors[{k}]"
    d = _obj(d, p)
    _no_unknown(d, {"id", "name", "producer", "storage", "nbytes", "kind", "shape", "dtype", "consumers"}, p)
    tid = _get(d, "id", p, _int)
    if tid != k:
        raise _FieldError(f"{p}.id is {tid} but the tensor is at position {k}", f"{p}.id")
    producer = _get(d, "producer", p, _opt_int)
    derived = tuple(consumers.get(k, ()))
    if "consumers" in d and _get(d, "consumers", p, _int_list) != derived:
        raise _FieldError(f"{p}.consumers is {d['consumers']} but the nodes reading tensor {k} are "
                          f"{list(derived)}; drop the field (consumers are derived from nodes[].inputs)",
                          f"{p}.consumers")
    return Tensor(id=tid, name=_get(d, "name", p, _str), producer=producer, consumers=derived,
                  storage=_get(d, "storage", p, _int, tid), nbytes=_get(d, "nbytes", p, _nonneg_int),
                  kind=_get(d, "kind", p, _choice(TENSOR_KINDS), INPUT if producer is None else ACTIVATION),
                  shape=_get(d, "shape", p, _opt_shape, None), dtype=_get(d, "dtype", p, _opt_str, None))


def _read_fixed(d: Any) -> FixedMemory:
    p = "fixed"
    d = _obj(d, p)
    ints = ("parameters_bytes", "buffers_bytes", "gradients_bytes", "optimizer_state_bytes", "inputs_bytes")
    _no_unknown(d, set(ints) | {"optimizer"}, p)
    return FixedMemory(**{f: _get(d, f, p, _nonneg_int, 0) for f in ints},
                       optimizer=_get(d, "optimizer", p, _str, "none"))


def _read_device(d: Any) -> DeviceProfile:
    p = "device"
    d = _obj(d, p)
    _no_unknown(d, {"name", "total_memory_bytes", "h2d_bytes_per_s", "d2h_bytes_per_s", "copies_overlap_compute",
                    "memory_bytes_per_s"}, p)
    default = DeviceProfile()
    tm = _get(d, "total_memory_bytes", p, lambda v, w: None if v is None else _nonneg_int(v, w), None)
    return DeviceProfile(name=_get(d, "name", p, _str, default.name), total_memory_bytes=tm,
                         h2d_bytes_per_s=_get(d, "h2d_bytes_per_s", p, _pos_float, default.h2d_bytes_per_s),
                         d2h_bytes_per_s=_get(d, "d2h_bytes_per_s", p, _pos_float, default.d2h_bytes_per_s),
                         copies_overlap_compute=_get(d, "copies_overlap_compute", p, _bool,
                                                     default.copies_overlap_compute),
                         memory_bytes_per_s=_get(d, "memory_bytes_per_s", p,
                                                 lambda v, w: None if v is None else _pos_float(v, w), None))


def _read_provenance(d: Any) -> Provenance:
    p = "provenance"
    d = _obj(d, p)
    _no_unknown(d, {"source", "model", "batch", "seq", "dtype", "torch_version", "date", "extra"}, p)
    return Provenance(source=_get(d, "source", p, _str, "manual"), model=_get(d, "model", p, _str, ""),
                      batch=_get(d, "batch", p, _opt_int, None), seq=_get(d, "seq", p, _opt_int, None),
                      dtype=_get(d, "dtype", p, _str, ""), torch_version=_get(d, "torch_version", p, _str, ""),
                      date=_get(d, "date", p, _str, ""), extra=dict(_get(d, "extra", p, _obj, {})))


def _from_dict(d: Any) -> RematProblem:
    if not isinstance(d, dict):
        raise _FieldError(f"the top level must be an object, got {_type_name(d)}", "")
    if d.get("schema") != PROBLEM_SCHEMA:
        raise _FieldError(f"not a libra-opt problem: schema is {d.get('schema')!r}, expected {PROBLEM_SCHEMA!r} "
                          f"(for a networkx node-link graph use libra_opt.importers.load_problem_any)", "schema")
    version = d.get("version")
    if version != PROBLEM_VERSION:
        raise _FieldError(f"problem file version {version!r} is not supported; this libra-opt reads version "
                          f"{PROBLEM_VERSION}: re-export the problem with this version", "version")
    _no_unknown(d, {"schema", "version", "name", "provenance", "device", "fixed", "nodes", "tensors", "outputs",
                    "executor"}, "")
    nodes = [_read_node(n, k) for k, n in enumerate(_get(d, "nodes", "", _list))]
    consumers: dict[int, list[int]] = {}
    for n in nodes:
        for t in n.inputs:
            consumers.setdefault(t, []).append(n.id)
    tensors = [_read_tensor(t, k, consumers) for k, t in enumerate(_get(d, "tensors", "", _list))]
    outputs = _get(d, "outputs", "", _int_list)
    return RematProblem(nodes, tensors, outputs,
                        fixed=_get(d, "fixed", "", lambda v, w: _read_fixed(v), FixedMemory()),
                        device=_get(d, "device", "", lambda v, w: _read_device(v), DeviceProfile()),
                        provenance=_get(d, "provenance", "", lambda v, w: _read_provenance(v), Provenance()),
                        name=_get(d, "name", "", _str, ""),
                        executor=_get(d, "executor", "", _choice(EXECUTORS), "eager"))


def problem_from_dict(d: Any, *, source: str | None = None) -> RematProblem:
    """Build a :class:`RematProblem` from :func:`problem_to_dict`'s dictionary.

    Parameters
    ----------
    d : dict
    source : str, optional
        Where ``d`` came from (a file name), put at the start of error messages.

    Returns
    -------
    RematProblem
        Validated; tensor consumers derived from the nodes' inputs.

    Raises
    ------
    ProblemFileError
        Wrong schema or version, a missing, unknown or mistyped field
        (``field`` is its dotted path, e.g. ``"nodes[12].time_s"``), or an IR
        invariant broken (``field`` is ``None``; the message is the
        :class:`~libra_opt.errors.ProblemError`'s).
    """
    prefix = f"{source}: " if source else ""
    try:
        return _from_dict(d)
    except _FieldError as e:
        raise ProblemFileError(prefix + e.message, e.field or None) from None
    except ProblemFileError:
        raise
    except ProblemError as e:
        raise ProblemFileError(f"{prefix or 'problem: '}{e}") from e


def load_problem(path: str | os.PathLike) -> RematProblem:
    """Read a problem JSON file written by :func:`save_problem` (``.gz`` too).

    Parameters
    ----------
    path : str or PathLike

    Returns
    -------
    RematProblem

    Raises
    ------
    FileNotFoundError
        No such file.
    ProblemFileError
        Corrupt file, wrong schema or version, a bad field (``field`` names
        it) or a broken invariant; the message names the file.
    """
    problem = problem_from_dict(read_json(path), source=str(path))
    log.info("read problem %r (%d nodes, %d tensors) from %s", problem.name, len(problem.nodes),
             len(problem.tensors), path)
    return problem
