"""Deciding whether a declared property name matches a ``patternProperties`` regex.

Declared names are known strings, so this is a plain search with Python's ``re`` after mapping
the ECMA-262 spellings that differ (``\\d``/``\\w`` are ASCII in ECMA, named groups, ``$`` never
matches before a final newline). Keys that are not declared are handled in the grammar instead.
"""

from __future__ import annotations

import re
from functools import lru_cache

from constrain.grammars.errors import SchemaError

__all__ = ["pattern_search"]

_ECMA_TO_PY = [
    (re.compile(r"(?<!\\)((?:\\\\)*)\\d"), r"\g<1>0-9", True),
    (re.compile(r"(?<!\\)((?:\\\\)*)\\w"), r"\g<1>A-Za-z0-9_", True),
    (re.compile(r"\(\?<(?![=!])"), "(?P<", False),
]


def _translate(pattern: str) -> str:
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in "dw":
                body = "0-9" if nxt == "d" else "A-Za-z0-9_"
                out.append(body if in_class else f"[{body}]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        elif c == "$" and not in_class:
            c = r"(?!.|\n)"
        out.append(c)
        i += 1
    return re.sub(r"\(\?<(?![=!])", "(?P<", "".join(out))


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern:
    try:
        return re.compile(_translate(pattern))
    except re.error as exc:
        raise SchemaError(f"cannot evaluate pattern {pattern!r} on declared property names: {exc}",
                          "", "patternProperties") from None


def pattern_search(pattern: str, text: str) -> bool:
    """Whether ECMA regex ``pattern`` matches somewhere in ``text``."""
    return _compiled(pattern).search(text) is not None
