"""Problem JSON files (:mod:`libra_opt.problem_io`): exact round trip, gzip,
and ProblemFileError naming the field for corrupt / wrong-version / mistyped files."""
from __future__ import annotations

import copy
import gzip
import json

import pytest

from libra_opt.errors import ProblemError, ProblemFileError
from libra_opt.ir.problem import BACKWARD, DeviceProfile, FixedMemory, ProblemBuilder, Provenance
from libra_opt.ir.problem_io import (PROBLEM_SCHEMA, PROBLEM_VERSION, load_problem, problem_from_dict,
                                     problem_to_dict, save_problem)


def rich_problem():
    """Every feature of the IR: inputs, views, multi-output, workspace, a
    non-recomputable op, both phases, shapes/dtypes, fixed memory, device, provenance."""
    bld = ProblemBuilder()
    x = bld.input("x", 4096, shape=(8, 128), dtype="float32")
    w = bld.input("w", 512, shape=(128,), dtype="float32")
    (a,) = bld.op("mm", [x, w], [("a", 1024, None, (8, 32), "float32")], time_s=1.25e-4, target="aten.mm.default",
                  module="layer1.linear")
    (v,) = bld.op("view", [a], [("a_view", 0, a, (256,), "float32")], time_s=0.0, target="aten.view.default")
    (d, m) = bld.op("dropout", [v], [("d", 1024), ("mask", 256)], time_s=1 / 3, recomputable=False,
                    target="aten.native_dropout.default", workspace_bytes=77)
    (g,) = bld.op("grad", [d, m, x], [("g", 4096)], time_s=2.5e-4, phase=BACKWARD)
    return bld.build(outputs=[g, d],
                     fixed=FixedMemory(parameters_bytes=512, buffers_bytes=8, gradients_bytes=512,
                                       optimizer_state_bytes=1024, inputs_bytes=4096, optimizer="adam"),
                     device=DeviceProfile(name="NVIDIA H100 PCIe", total_memory_bytes=80 * 2**30,
                                          h2d_bytes_per_s=5.51e10, d2h_bytes_per_s=5.37e10),
                     provenance=Provenance(source="capture", model="tiny", batch=8, seq=None, dtype="float32",
                                           torch_version="2.13.0", date="2025-01-01",
                                           extra={"note": "hand made", "sizes": [1, 2]}),
                     name="tiny-step")


def assert_same(p, q):
    assert q.nodes == p.nodes
    assert q.tensors == p.tensors
    assert q.outputs == p.outputs
    assert q.fixed == p.fixed
    assert q.device == p.device
    assert q.provenance == p.provenance
    assert q.name == p.name


@pytest.mark.parametrize("filename", ["p.json", "p.json.gz"])
def test_round_trip_through_a_file_is_exact(tmp_path, filename):
    p = rich_problem()
    path = save_problem(p, tmp_path / filename)
    assert_same(p, load_problem(path))
    # the time 1/3 survives bit for bit
    assert load_problem(path).nodes[2].time_s == 1 / 3


def test_round_trip_of_the_dict():
    p = rich_problem()
    d = problem_to_dict(p)
    assert d["schema"] == PROBLEM_SCHEMA and d["version"] == PROBLEM_VERSION
    assert problem_to_dict(problem_from_dict(d)) == d
    assert_same(p, problem_from_dict(json.loads(json.dumps(d))))


def test_gz_file_is_gzip_and_deterministic(tmp_path):
    p = rich_problem()
    a = save_problem(p, tmp_path / "a.json.gz").read_bytes()
    b = save_problem(p, tmp_path / "b.json.gz").read_bytes()
    assert a[:2] == b"\x1f\x8b" and a == b
    assert json.loads(gzip.decompress(a))["name"] == "tiny-step"


def test_consumers_are_derived_not_read(tmp_path):
    d = problem_to_dict(rich_problem())
    assert all("consumers" not in t for t in d["tensors"])
    q = problem_from_dict(d)
    assert q.tensors[0].consumers == (0, 3)  # x is read by mm and grad
    # a consumers list that disagrees with the nodes is rejected, naming the field
    bad = copy.deepcopy(d)
    bad["tensors"][0]["consumers"] = [0]
    with pytest.raises(ProblemFileError) as e:
        problem_from_dict(bad)
    assert e.value.field == "tensors[0].consumers"


def test_optional_fields_take_defaults():
    d = {"schema": PROBLEM_SCHEMA, "version": PROBLEM_VERSION,
         "nodes": [{"id": 0, "name": "f", "phase": "forward", "time_s": 1, "inputs": [], "outputs": [0]}],
         "tensors": [{"id": 0, "name": "a", "producer": 0, "nbytes": 8}], "outputs": [0]}
    p = problem_from_dict(d)
    n, t = p.nodes[0], p.tensors[0]
    assert (n.target, n.workspace_bytes, n.recomputable, n.module, n.time_s) == ("f", 0, True, "", 1.0)
    assert (t.storage, t.kind, t.shape, t.dtype) == (0, "activation", None, None)
    assert p.device == DeviceProfile() and p.fixed == FixedMemory()


def _write(tmp_path, d, name="bad.json"):
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


def _load_error(path) -> ProblemFileError:
    with pytest.raises(ProblemFileError) as e:
        load_problem(path)
    assert str(path) in str(e.value), "the message names the file"
    return e.value


def test_corrupt_json_names_the_file_and_position(tmp_path):
    path = tmp_path / "corrupt.json"
    path.write_text('{"schema": "libra-opt/remat-problem", "version": 1, "nodes": [')
    err = _load_error(path)
    assert "not valid JSON" in str(err) and "line 1" in str(err)


def test_corrupt_gzip_names_the_file(tmp_path):
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    assert "gzip" in str(_load_error(path))


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_problem(tmp_path / "nope.json")


def test_wrong_schema(tmp_path):
    d = problem_to_dict(rich_problem())
    d["schema"] = "something/else"
    assert _load_error(_write(tmp_path, d)).field == "schema"


def test_wrong_version(tmp_path):
    d = problem_to_dict(rich_problem())
    d["version"] = 99
    err = _load_error(_write(tmp_path, d))
    assert err.field == "version" and "99" in str(err)


def _mutate(d, path, value):
    """Set (or delete, for value=...) the field at a dotted path like 'nodes[2].time_s'."""
    obj = d
    keys = []
    for part in path.split("."):
        if "[" in part:
            name, idx = part[:-1].split("[")
            keys += [name, int(idx)]
        else:
            keys.append(part)
    for k in keys[:-1]:
        obj = obj[k]
    if value is ...:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value


BAD_FIELDS = [
    ("nodes[2].time_s", "fast"),          # mistyped
    ("nodes[2].time_s", ...),             # missing
    ("nodes[2].time_s", float("nan")),    # not finite (json writes NaN)
    ("nodes[1].phase", "sideways"),
    ("nodes[0].inputs", "x"),
    ("nodes[0].inputs[1]", 1.5),          # an id must be an integer
    ("nodes[3].recomputable", "yes"),
    ("nodes[2].workspace_bytes", -3),
    ("nodes[1].id", 5),
    ("nodes[1].colour", "red"),           # unknown field
    ("tensors[3].nbytes", "12"),
    ("tensors[3].nbytes", True),
    ("tensors[2].shape[1]", "x"),
    ("tensors[4].kind", "weights"),
    ("tensors[4].name", ...),
    ("device.h2d_bytes_per_s", 0),
    ("device.copies_overlap_compute", 1),
    ("fixed.parameters_bytes", "lots"),
    ("provenance.batch", "eight"),
    ("provenance.extra", []),
    ("outputs", {"a": 1}),
    ("nodes", {}),
    ("name", 3),
]


@pytest.mark.parametrize("field, value", BAD_FIELDS, ids=[f"{f}={v!r}" for f, v in BAD_FIELDS])
def test_bad_field_is_named(tmp_path, field, value):
    d = problem_to_dict(rich_problem())
    _mutate(d, field, value)
    err = _load_error(_write(tmp_path, d))
    assert err.field == field, str(err)
    assert f"(field: {field})" in str(err)


def test_top_level_must_be_an_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    err = _load_error(path)
    assert "object" in str(err)


def test_invariant_violation_is_a_problem_file_error_naming_the_file(tmp_path):
    d = problem_to_dict(rich_problem())
    # node 0 ("mm") reads tensor 5 ("g"), produced by the last node: not topological
    d["nodes"][0]["inputs"] = [0, 1, 6]
    err = _load_error(_write(tmp_path, d))
    assert isinstance(err, ProblemError) and err.field is None
    assert "not topological" in str(err)


def test_saving_a_non_finite_time_raises(tmp_path):
    bld = ProblemBuilder()
    (a,) = bld.op("f", [], [("a", 4)], time_s=float("inf"))
    p = bld.build([a])
    with pytest.raises(ProblemError, match="finite"):
        save_problem(p, tmp_path / "inf.json")
    assert not (tmp_path / "inf.json").exists()


def test_every_ir_field_is_written():
    """Guard against drift: a field added to the IR dataclasses must reach the file."""
    import dataclasses

    from libra_opt.ir.problem import Node, Tensor

    d = problem_to_dict(rich_problem())
    assert set(d["nodes"][0]) == {f.name for f in dataclasses.fields(Node)}
    assert set(d["tensors"][0]) == {f.name for f in dataclasses.fields(Tensor)} - {"consumers"}
    assert set(d["fixed"]) == {f.name for f in dataclasses.fields(FixedMemory)}
    assert set(d["device"]) == {f.name for f in dataclasses.fields(DeviceProfile)}
    assert set(d["provenance"]) == {f.name for f in dataclasses.fields(Provenance)}
