"""Importing constrain and compiling leave the process as they found it (no recursion limit
raised, no environment variable set): a library must not change its host's settings. Nor do they
import torch, which only bitmask tensors need: a second of start-up, and ~150,000 objects that
every full garbage collection of the host then walks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import json, os, sys
before = (sys.getrecursionlimit(), dict(os.environ))
import constrain
from constrain.tokenizers import gpt2
vocab = gpt2()
constrain.compile_json_schema({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}, vocab)
constrain.compile_regex(r"\d{4}-\d{2}-\d{2}", vocab)
constrain.compile_lark('start: "(" start ")" | "x"', vocab).matcher().allowed_token_ids()
after = (sys.getrecursionlimit(), dict(os.environ))
print(json.dumps({"limit": [before[0], after[0]], "torch": "torch" in sys.modules,
                  "changed": sorted(k for k in before[1].keys() | after[1].keys() if before[1].get(k) != after[1].get(k))}))
"""


def test_import_and_compile_change_no_process_setting() -> None:
    # Without the offline switches a library might like to set, so that setting one shows.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600, check=True,
                          env=env)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["limit"][0] == report["limit"][1]
    assert report["changed"] == []
    assert report["torch"] is False
