"""Nothing lost: every file libra-opt writes (plans, problems, plots, CSV
tables) replaces the old one whole or not at all, and leaves no temporary file
behind (:mod:`libra_opt.atomic`); the CLI checks destinations before working;
plans read and write ``.gz`` and reject mistyped fields."""
from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import textwrap

import pytest

from libra_opt.atomic import atomic_write, check_writable, write_text
from libra_opt.cli import main
from libra_opt.apps.compare import Row, rows_to_csv
from libra_opt.errors import OutputPathError, ProblemFileError
from libra_opt.apps.plots import plot_memory_timeline
from libra_opt.ir.problem import DeviceProfile, ProblemBuilder
from libra_opt.ir.problem_io import load_problem, save_problem
from libra_opt.ir.schedule import Compute, Schedule, no_remat_schedule
from libra_opt.passes.simulator import simulate

OLD = b"the old file, which must survive\n"


def _writers(p, plan):
    """name -> function(path) writing one kind of file through the library."""
    return {
        "plan": lambda path: plan.save(path),
        "plan.gz": lambda path: plan.save(str(path) + ".gz"),
        "problem": lambda path: save_problem(p, path),
        "text": lambda path: write_text(path, "benchmark results\n" * 100),
        "plot": lambda path: plot_memory_timeline(p, [simulate(p)], str(path) + ".png"),
        "csv": lambda path: rows_to_csv([Row("tiny", 300, 1.0, "none", "optimal", 0.0, 4.0, 4.0, 300, 0.01, None,
                                             None, None, None, "")], path),
    }


WRITERS = ["csv", "plan", "plan.gz", "plot", "problem", "text"]


def _target(tmp_path, name):
    return tmp_path / {"plan.gz": "out.gz", "plot": "out.png"}.get(name, "out")


@pytest.mark.parametrize("name", WRITERS)
def test_a_write_that_fails_on_a_full_disk_keeps_the_old_file_and_no_temp(name, tmp_path, monkeypatch, tiny_problem,
                                                                          tiny_recompute_plan):
    writer = _writers(tiny_problem, tiny_recompute_plan)[name]
    target = _target(tmp_path, name)
    target.write_bytes(OLD)

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OutputPathError, match="No space left on device"):
        writer(tmp_path / "out")
    assert target.read_bytes() == OLD
    assert sorted(f.name for f in tmp_path.iterdir()) == [target.name]


@pytest.mark.parametrize("name", WRITERS)
def test_every_writer_replaces_the_old_file_whole(name, tmp_path, tiny_problem, tiny_recompute_plan):
    target = _target(tmp_path, name)
    target.write_bytes(OLD)
    os.chmod(target, 0o640)
    _writers(tiny_problem, tiny_recompute_plan)[name](tmp_path / "out")
    data = target.read_bytes()
    assert data != OLD and len(data) > 0
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o640)   # the old file's permissions are kept
    assert sorted(f.name for f in tmp_path.iterdir()) == [target.name]


def test_a_new_file_gets_the_permissions_open_would_give(tmp_path):
    old = os.umask(0o027)
    try:
        write_text(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / "new.txt").st_mode & 0o777) == oct(0o640)   # 0o666 minus the umask


def test_an_exception_or_ctrl_c_mid_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "plan.json"
    target.write_bytes(OLD)
    for exc in (RuntimeError("writer failed"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with atomic_write(target) as f:
                f.write("{" * 100_000)
                raise exc
        assert target.read_bytes() == OLD
        assert os.listdir(tmp_path) == ["plan.json"]


def test_a_symlink_at_the_old_fixed_temp_name_is_not_followed(tmp_path, tiny_problem):
    victim = tmp_path / "victim"
    victim.write_bytes(OLD)
    os.symlink(victim, tmp_path / "p.json.tmp")
    save_problem(tiny_problem, tmp_path / "p.json")
    assert victim.read_bytes() == OLD
    assert load_problem(tmp_path / "p.json").nodes == tiny_problem.nodes


def test_a_real_file_size_limit_mid_write_keeps_the_old_plan(tmp_path, tiny_problem):
    """A filesystem that runs out of room mid-write (RLIMIT_FSIZE: writes past
    64 bytes fail with EFBIG), through ``libra-opt solve -o``: exit 2 with one
    line, the old plan intact, no temporary file."""
    problem = save_problem(tiny_problem, tmp_path / "p.json")
    plan = tmp_path / "plan.json"
    Schedule([Compute(0)]).save(plan)
    old = plan.read_bytes()
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from libra_opt.cli import main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
        sys.exit(main(["solve", {str(problem)!r}, "--budget", "100%", "-o", {str(plan)!r}]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "File too large" in r.stderr, r.stderr
    assert plan.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["p.json", "plan.json"]
    assert main(["solve", str(problem), "--budget", "100%", "-o", str(plan)]) == 0   # without the limit it fits
    assert len(Schedule.load(plan)) == len(no_remat_schedule(tiny_problem))


def test_check_writable_names_the_problem(tmp_path):
    assert check_writable(tmp_path / "x.json") == tmp_path / "x.json"
    with pytest.raises(OutputPathError, match="does not exist"):
        check_writable(tmp_path / "missing" / "x.json")
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputPathError, match="not a directory"):
        check_writable(tmp_path / "f" / "x.json")
    with pytest.raises(OutputPathError, match="is a directory"):
        check_writable(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_check_writable_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        with pytest.raises(OutputPathError, match="not writable"):
            check_writable(ro / "x.json")
    finally:
        os.chmod(ro, 0o755)


@pytest.mark.parametrize("argv", [["solve", "{p}", "--budget", "90%", "-o", "{d}/plan.json"],
                                  ["solve", "{p}", "--budget", "90%", "--plot", "{d}/t.png"],
                                  ["simulate", "{p}", "--plot", "{d}/t.png"],
                                  ["compare", "{p}", "--csv", "{d}/rows.csv"],
                                  ["compare", "{p}", "--plot", "{d}/c.png"]])
def test_cli_checks_the_destination_before_working(argv, tmp_path, monkeypatch, capsys, tiny_problem):
    import libra_opt.frontend.importers

    problem = save_problem(tiny_problem, tmp_path / "p.json")

    def no_work(*a, **k):
        raise AssertionError("the problem was read before the destination was checked")

    monkeypatch.setattr(libra_opt.frontend.importers, "load_problem_any", no_work)
    argv = [a.format(p=problem, d=tmp_path / "missing") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not exist" in err and str(tmp_path / "missing") in err


def test_plans_read_and_write_gzip(tmp_path, capsys, tiny_problem, tiny_recompute_plan):
    save_problem(tiny_problem, tmp_path / "p.json")
    tiny_recompute_plan.save(tmp_path / "plan.json.gz")
    raw = (tmp_path / "plan.json.gz").read_bytes()
    assert json.loads(gzip.decompress(raw))["instructions"][0] == ["Compute", 0]
    assert Schedule.load(tmp_path / "plan.json.gz") == tiny_recompute_plan
    assert main(["simulate", str(tmp_path / "p.json"), "--plan", str(tmp_path / "plan.json.gz")]) == 0
    assert "(210 bytes) graph memory" in capsys.readouterr().out


@pytest.mark.parametrize("field,value", [("instructions", [["Compute", 1.7]]), ("instructions", [["Compute", "3"]]),
                                         ("instructions", [["Compute", True]]), ("instructions", [["Compute", -1]]),
                                         ("instructions", [["Compute", 1, 2]]), ("instructions", {"Compute": 1}),
                                         ("version", 1.0), ("version", True), ("version", "1"), ("meta", [1])])
def test_plan_fields_of_the_wrong_type_are_rejected_not_coerced(field, value, tmp_path, tiny_recompute_plan):
    d = tiny_recompute_plan.to_dict()
    d[field] = value
    (tmp_path / "plan.json").write_text(json.dumps(d))
    with pytest.raises(ProblemFileError) as e:
        Schedule.load(tmp_path / "plan.json")
    assert e.value.field == (f"{field}[0]" if field == "instructions" and isinstance(value, list) else field)


def test_memory_lower_bound_reads_the_kind_of_a_views_base():
    """An activation that is a view of an input (e.g. ``x.t()``, an output)
    aliases the input's storage: fixed memory, so the bound is 0, as the
    no-remat peak is."""
    from libra_opt.passes.bounds import memory_lower_bound, node_memory_lower_bounds

    bld = ProblemBuilder()
    x = bld.input("x", 888)
    (v,) = bld.op("t", [x], [("v", 0, x)])
    p = bld.build([v], device=DeviceProfile(name="test"), name="view-of-input")
    assert p.tensors[v].kind == "activation" and p.tensors[v].storage == x
    assert simulate(p).peak_bytes == 0
    assert list(node_memory_lower_bounds(p)) == [0]
    assert memory_lower_bound(p) == 0
