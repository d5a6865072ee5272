"""Byte sizes and memory budgets: parsing and formatting.

Budgets are accepted as an ``int`` number of bytes, a string with a binary or
decimal unit (``"12GiB"``, ``"512 MB"``), a percentage of a reference peak
(``"60%"``), or a ``float`` in ``(0, 1]`` meaning that fraction of the reference
peak (the no-rematerialization peak of the problem).
"""
from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """Parse a byte size.

    Parameters
    ----------
    text : str or int or float
        ``1024``, ``"1.5GiB"``, ``"800MB"``, ``"16G"`` (single letters are binary).

    Returns
    -------
    int
        Bytes.

    Raises
    ------
    ValueError
        The text is not a size; the message shows accepted forms.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a byte size: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"a byte size must be >= 0, got {text}")
        return int(text)
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte size: {text!r}; write e.g. 1073741824, '12GiB', '800MB' or '16G'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_budget(budget: str | int | float, reference_bytes: int | None = None) -> int:
    """Turn a memory budget into bytes.

    Parameters
    ----------
    budget : int or float or str
        Bytes (``int``), a fraction in ``(0, 1]`` of ``reference_bytes``
        (``float``), ``"60%"`` of ``reference_bytes``, or a size string such as
        ``"12GiB"``.
    reference_bytes : int, optional
        The peak a fraction refers to (the no-remat peak, bytes).

    Returns
    -------
    int
        The budget in bytes.

    Raises
    ------
    ValueError
        Unparseable budget, a non-positive one, or a fraction without a
        reference.
    """
    if isinstance(budget, float) and not isinstance(budget, bool):
        if 0 < budget <= 1:
            return _fraction(budget, reference_bytes, repr(budget))
        return parse_bytes(budget)
    if isinstance(budget, str) and budget.strip().endswith("%"):
        try:
            pct = float(budget.strip()[:-1])
        except ValueError:
            raise ValueError(f"not a percentage budget: {budget!r}; write e.g. '60%'") from None
        if not 0 < pct:
            raise ValueError(f"a percentage budget must be > 0, got {budget!r}")
        return _fraction(pct / 100.0, reference_bytes, budget)
    value = parse_bytes(budget)
    if value <= 0:
        raise ValueError(f"a memory budget must be > 0 bytes, got {budget!r}")
    return value


def _fraction(frac: float, reference_bytes: int | None, text: str) -> int:
    if reference_bytes is None:
        raise ValueError(f"budget {text} is relative, but no reference peak was given; pass bytes instead")
    return int(frac * reference_bytes)


def format_bytes(n: float) -> str:
    """Format bytes with a binary unit, e.g. ``format_bytes(3 * 2**30) == '3.00 GiB'``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def format_seconds(s: float) -> str:
    """Format seconds as ``'12.3 ms'`` / ``'4.56 s'`` / ``'850 us'``."""
    if abs(s) >= 1:
        return f"{s:.3f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def budget_from_text(text: str) -> str | float:
    """A budget typed on the command line, ready for :func:`parse_budget`.

    ``"0.6"`` becomes the float 0.6 (a fraction of the no-remat peak); a plain
    integer (``"1000000"``, bytes), ``"60%"`` and ``"12GiB"`` stay strings.
    """
    try:
        value = float(text)
    except ValueError:
        return text
    return value if 0 < value <= 1 and not text.strip().isdigit() else text
