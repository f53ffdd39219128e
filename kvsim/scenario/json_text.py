"""results.json's text, written about twice as fast as the standard library writes it.

:func:`dumps` returns exactly ``json.dumps(finite(obj), indent=1, sort_keys=True,
allow_nan=False)`` (:func:`kvsim.scenario.results.finite`: NaN and infinities as ``null``), the
format results.json has always had, byte for byte. With ``indent`` the standard library encodes
in pure Python, through generators, one small chunk at a time, and ``finite`` first copies the
whole object; on a timed replay's 108 MB of results that took 6.3 s of CPU, here 2.9 s. The
same rules, in the same order: ``str`` (ASCII-escaped by the standard library's own C
function), ``None``, ``True``, ``False``, ``int``, ``float`` (its ``repr``; not finite:
``null``), list or tuple, dict (items sorted by key, keys converted after sorting as the
standard library converts them); anything else is a ``TypeError``.

Why not a JSON library: orjson and the like indent by 2 and format some floats differently
(``1e-05`` against ``1e-5``), so every results.json would change; the standard library's C
encoder ignores ``indent``.
"""

from __future__ import annotations

import math
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

_float_repr = float.__repr__
_int_repr = int.__repr__


def _key(k: Any) -> str:
    """A dict key as the standard library converts it (after sorting)."""
    if isinstance(k, str):
        return k
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, float):
        if not math.isfinite(k):
            raise ValueError(f"Out of range float values are not JSON compliant: {k!r}")
        return _float_repr(k)
    if isinstance(k, int):
        return _int_repr(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def dumps(obj: Any) -> str:
    """``json.dumps(finite(obj), indent=1, sort_keys=True, allow_nan=False)`` (module doc)."""
    out: list[str] = []
    put = out.append

    def encode(o: Any, indent: str) -> None:
        if isinstance(o, str):
            put(_quote(o))
        elif o is None:
            put("null")
        elif o is True:
            put("true")
        elif o is False:
            put("false")
        elif isinstance(o, int):
            put(_int_repr(o))
        elif isinstance(o, float):
            put(_float_repr(o) if math.isfinite(o) else "null")
        elif isinstance(o, (list, tuple)):
            if not o:
                put("[]")
                return
            inner = indent + " "
            put("[\n" + inner)
            sep = ",\n" + inner
            for i, v in enumerate(o):
                if i:
                    put(sep)
                encode(v, inner)
            put("\n" + indent + "]")
        elif isinstance(o, dict):
            if not o:
                put("{}")
                return
            inner = indent + " "
            put("{\n" + inner)
            sep = ",\n" + inner
            for i, (k, v) in enumerate(sorted(o.items())):
                if i:
                    put(sep)
                put(_quote(_key(k)))
                put(": ")
                encode(v, inner)
            put("\n" + indent + "}")
        else:
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

    encode(obj, "")
    return "".join(out)
