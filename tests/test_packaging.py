"""The package as users install it: the wheel holds every module of the source tree (the CLI and
every subpackage), the console script, and the extras; the repository is self-contained; the
``--help`` path does not import torch; a missing extra fails with the ``pip install`` command."""
from __future__ import annotations

import configparser
import email
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: source folder -> the package it is installed as (pyproject.toml's package-dir)
SOURCE_PACKAGES = {"libra_opt": "libra_opt", "solvers": "libra_opt/solvers", "runtime": "libra_opt/runtime"}


def source_modules() -> set[str]:
    """Every .py file of the source tree, as its path inside the installed package."""
    out = set()
    for src, pkg in SOURCE_PACKAGES.items():
        for f in (REPO / src).rglob("*.py"):
            out.add(f"{pkg}/{f.relative_to(REPO / src).as_posix()}")
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the source tree (so the build leaves nothing in the
    repository) without build isolation (offline: setuptools comes with the test extra)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in SOURCE_PACKAGES:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True, capture_output=True, text=True)
    (whl,) = out.glob("libra_opt-*.whl")
    return whl


def test_the_wheel_holds_every_module_of_the_source_tree(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {n for n in names if n.endswith(".py")}
    assert in_wheel == source_modules()
    assert "libra_opt/cli/__init__.py" in in_wheel and "libra_opt/frontend/generators.py" in in_wheel


def test_the_wheel_declares_the_script_and_one_scheme_of_extras(wheel):
    zf = zipfile.ZipFile(wheel)
    dist_info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    eps = configparser.ConfigParser()
    eps.read_string(zf.read(f"{dist_info}/entry_points.txt").decode())
    assert eps["console_scripts"]["libra-opt"] == "libra_opt.cli:main"
    meta = email.message_from_bytes(zf.read(f"{dist_info}/METADATA"))
    assert set(meta.get_all("Provides-Extra")) == {"zoo", "plot", "huggingface", "lightning", "highs", "demo", "test",
                                                     "all"}
    requires = meta.get_all("Requires-Dist")
    core = [r for r in requires if "extra ==" not in r]
    assert not any(r.startswith(("transformers", "matplotlib")) for r in core)  # extras, not core

    def of(extra):
        return {re.split(r"[<>=!; \[]", r)[0] for r in requires if f'extra == "{extra}"' in r}

    from libra_opt.extras import EXTRAS

    for extra, dists in EXTRAS.items():
        assert set(dists) <= of(extra)
    assert {"pytest", "hypothesis"} <= of("test")


def test_the_repository_is_self_contained():
    """Nothing in the README, the tests or the package points outside the repository."""
    files = [REPO / "README.md", *REPO.glob("tests/*.py"), *REPO.glob("benchmarks/*.py"),
             *(f for src in SOURCE_PACKAGES for f in (REPO / src).rglob("*.py"))]
    needle = "../" + "shared"  # written in two parts so this file does not match itself
    offenders = [str(f.relative_to(REPO)) for f in files if needle in f.read_text()]
    assert offenders == []


def _modules_after(argv: list[str]) -> list[str]:
    code = ("import sys\nfrom libra_opt.cli import main\n"
            f"main({argv!r})\n"
            "print(sorted(m for m in ('numpy', 'torch', 'transformers', 'matplotlib', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))).stdout
    return eval(out.strip().splitlines()[-1])


def test_help_imports_neither_torch_nor_numpy():
    """``libra-opt --help`` loads only argparse and the command modules; a subcommand's help adds
    the solver registry (numpy), never torch."""
    assert _modules_after(["--help"]) == []
    for cmd in ("solve", "compare", "profile", "demo"):
        assert "torch" not in _modules_after([cmd, "--help"])


def test_profile_help_names_every_zoo_model(capsys):
    from libra_opt.cli import main
    from libra_opt.cli.profile import ZOO_NAMES
    from libra_opt.apps.zoo import known_models

    assert main(["profile", "--help"]) == 0
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert sorted(ZOO_NAMES) == sorted(known_models())
    assert all(name in out for name in ZOO_NAMES)


@pytest.mark.parametrize("module, extra, call", [
    ("transformers", "zoo", lambda: __import__("libra_opt.apps.zoo", fromlist=["x"]).build_model("gpt2-tiny", 1)),
    ("matplotlib", "plot", lambda: __import__("libra_opt.apps.plots", fromlist=["x"])._figure((2, 2))),
])
def test_a_missing_extra_names_the_pip_install(monkeypatch, module, extra, call):
    from libra_opt.errors import MissingExtraError

    for m in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if it were not installed
    with pytest.raises(MissingExtraError, match=re.escape(f"pip install 'libra-opt[{extra}]'")) as ei:
        call()
    assert isinstance(ei.value, ImportError) and ei.value.extra == extra
