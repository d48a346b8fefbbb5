"""Shared pieces of the engine tests: one loaded demo model per test process, and the
constraints the tests generate under, each with a checker that validates an output
independently of constrain (``re``, ``jsonschema``, ``lark``)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema
import lark


@functools.lru_cache(maxsize=1)
def engine() -> Any:
    """The demo model (SmolLM2-135M-Instruct) on CPU; loaded once per test process."""
    from constrain.engine.api import Engine

    return Engine.from_pretrained(device="cpu", max_batch=16)


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

GREETING_LARK = r"""
start: GREETING " " NAME "!"
GREETING: "hello" | "hi"
NAME: /[A-Z][a-z]{1,8}/
"""


def checker(kind: str, source: Any) -> Callable[[str], bool]:
    """A validator for an output of ``kind`` built without constrain."""
    if kind == "regex":
        pat = re.compile(source)
        return lambda text: pat.fullmatch(text) is not None
    if kind == "choices":
        return lambda text: text in source
    if kind == "grammar":
        parser = lark.Lark(source, start="start")

        def ok(text: str) -> bool:
            try:
                parser.parse(text)
                return True
            except lark.exceptions.LarkError:
                return False

        return ok
    if kind == "json_schema":

        def ok_json(text: str) -> bool:
            try:
                jsonschema.validate(json.loads(text), source)
                return True
            except (json.JSONDecodeError, jsonschema.ValidationError):
                return False

        return ok_json
    return lambda text: True
