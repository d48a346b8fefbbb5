"""What is measured on one compiled schema: random constrained walks and labelled instances.

Walk: fill the mask (timed), pick a random allowed token, accept it; EOS is taken when it is the
only choice, or with probability `p_eos` when allowed; half the other picks are drawn from the
allowed "structural" tokens (made only of `"{}[],:`) so documents close before the length cap.
Every finished document is decoded and judged by the caller (UNSOUND if it is not valid).

Instance: the canonical token ids of the compact serialization are fed one by one; each must be
allowed by the mask and accepted, and EOS must be allowed and accepted at the end.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.engines import Compiled
from bench.tok import Tok
from constrain.testing.corpus import VALIDATOR_ERROR

STRUCTURAL = frozenset(b'"{}[],:')


class Masks:
    """The bitmask row shared by all matchers of a worker, and numpy views of it."""

    def __init__(self, tok: Tok) -> None:
        self.tok = tok
        self.words = (tok.vocab_size + 31) // 32
        self.bitmask = torch.full((1, self.words), -1, dtype=torch.int32)
        self.bytes = self.bitmask[0].numpy().view(np.uint8)
        self.structural = np.array([b is not None and len(b) > 0 and all(c in STRUCTURAL for c in b)
                                    for b in tok.token_bytes] + [False] * (tok.vocab_size - len(tok.token_bytes)))
        self.eos = np.zeros(tok.vocab_size, dtype=bool)
        self.eos[list(tok.eos_token_ids)] = True

    def reset(self) -> None:
        self.bitmask.fill_(-1)

    def allowed(self, token: int) -> bool:
        return bool((self.bytes[token >> 3] >> (token & 7)) & 1)

    def allowed_ids(self) -> np.ndarray:
        bits = np.unpackbits(self.bytes, bitorder="little")[: self.tok.vocab_size]
        return np.flatnonzero(bits)


def random_walk(compiled: Compiled, masks: Masks, rng: random.Random, max_tokens: int = 300,
                p_eos: float = 0.5) -> dict[str, Any]:
    """One walk: {"status": finished|truncated|dead_end|refused|error, "tokens", "mask_ns", "doc"}."""
    m = compiled.matcher()
    ids: list[int] = []
    mask_ns: list[int] = []
    status = "truncated"
    detail = ""
    try:
        while len(ids) < max_tokens:
            masks.reset()
            t0 = time.perf_counter_ns()
            m.fill(masks.bitmask)
            mask_ns.append(time.perf_counter_ns() - t0)
            allowed = masks.allowed_ids()
            is_eos = masks.eos[allowed]
            eos_ids = allowed[is_eos]
            others = allowed[~is_eos]
            if len(allowed) == 0:
                status = "dead_end"
                break
            if len(eos_ids) and (len(others) == 0 or rng.random() < p_eos):
                eos = int(eos_ids[0])
                status = "finished" if m.accept_eos(eos) else "refused"
                if status == "refused":
                    detail = "EOS allowed by the mask but refused"
                break
            pool = others
            if rng.random() < 0.5:
                struct = others[masks.structural[others]]
                if len(struct):
                    pool = struct
            token = int(pool[rng.randrange(len(pool))])
            if not m.accept(token):
                status = "refused"
                detail = f"token {token} {masks.tok.token_bytes[token]!r} allowed by the mask but refused"
                break
            ids.append(token)
    except Exception as e:  # an engine raising mid-walk is a result, not a harness failure
        status = "error"
        detail = f"{type(e).__name__}: {str(e)[:300]}"
    return {"status": status, "tokens": len(ids), "mask_ns": mask_ns, "doc": masks.tok.decode(ids),
            "detail": detail}


def check_instance(compiled: Compiled, masks: Masks, ids: list[int]) -> dict[str, Any]:
    """Feed `ids` then EOS: {"accepted": bool, "pos": first refused position (len(ids) = EOS), "why"}."""
    m = compiled.matcher()
    mask_ns: list[int] = []
    try:
        for pos, token in enumerate(ids + [masks.tok.eos_token_ids[0]]):
            masks.reset()
            t0 = time.perf_counter_ns()
            m.fill(masks.bitmask)
            mask_ns.append(time.perf_counter_ns() - t0)
            in_mask = masks.allowed(token)
            if pos == len(ids):
                took = in_mask and m.accept_eos(token)
                if not took:
                    return {"accepted": False, "pos": pos, "why": "eos" if not in_mask else "eos refused",
                            "mask_ns": mask_ns}
                break
            if not in_mask:
                return {"accepted": False, "pos": pos, "why": "mask", "mask_ns": mask_ns}
            if not m.accept(token):
                return {"accepted": False, "pos": pos, "why": "accept refused a masked-in token", "mask_ns": mask_ns}
    except Exception as e:
        return {"accepted": False, "pos": -1, "why": f"error {type(e).__name__}: {str(e)[:200]}", "mask_ns": mask_ns}
    return {"accepted": True, "pos": len(ids), "why": "", "mask_ns": mask_ns}


def judge_doc(doc: bytes, check: Callable[[Any], tuple[bool, bool, str]]) -> tuple[str, str]:
    """A finished walk's document -> ("valid"|"format"|"unsound"|"unjudged", message)."""
    import json

    try:
        value = json.loads(doc.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        return "unsound", f"not JSON: {e}"
    ok, format_ok, msg = check(value)
    if msg.startswith(VALIDATOR_ERROR):  # e.g. a pattern Python's `re` cannot compile: no verdict
        return "unjudged", msg
    if not ok:
        return "unsound", msg
    return ("valid", "") if format_ok else ("format", msg)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
