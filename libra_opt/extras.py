"""Optional dependencies, grouped into the package's extras.

One naming scheme (``pyproject.toml``'s ``[project.optional-dependencies]``):
an extra is named after what it enables.

===============  ================================  =======================================================
extra            installs                          enables
===============  ================================  =======================================================
``zoo``          ``transformers``                  :mod:`libra_opt.zoo` models, ``profile --model``
``plot``         ``matplotlib``                    :mod:`libra_opt.plots`, every ``--plot``
``huggingface``  ``transformers``, ``accelerate``  :mod:`libra_opt.integrations.huggingface` (``Trainer``)
``lightning``    ``lightning``                     :mod:`libra_opt.integrations.lightning`
``demo``         ``zoo`` + ``plot``                ``libra-opt demo``
``test``         all of the above + pytest         the test suite
``all``          all of the above
===============  ================================  =======================================================

Code that needs an extra calls :func:`require`, which imports the module or
raises :class:`~libra_opt.errors.MissingExtraError` naming the ``pip install``
command.  Source: PEP 508 extras; :func:`importlib.import_module`.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingExtraError

#: extra -> the distributions it installs (mirrors pyproject.toml; checked by tests/test_packaging.py)
EXTRAS: dict[str, tuple[str, ...]] = {
    "zoo": ("transformers",),
    "plot": ("matplotlib",),
    "huggingface": ("transformers", "accelerate"),
    "lightning": ("lightning",),
}


def install_hint(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'libra-opt[EXTRA]'``."""
    return f"pip install 'libra-opt[{extra}]'"


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` (e.g. ``"transformers"``) that ``what`` needs.

    Parameters
    ----------
    module : str
        The module to import.
    extra : str
        The extra that installs it (a key of :data:`EXTRAS`).
    what : str
        What needs it, for the message (``"the model zoo"``).

    Returns
    -------
    module

    Raises
    ------
    MissingExtraError
        ``module`` is not installed (also an ``ImportError``); the message is
        ``"<what> needs <module>: pip install 'libra-opt[<extra>]'"``.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name.split(".")[0] != top:
            raise  # the module is there but one of its own imports failed: show that
        raise MissingExtraError(f"{what} needs {top}, which is not installed: {install_hint(extra)}",
                                extra=extra, name=top) from e
