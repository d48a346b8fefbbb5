"""Per-sequence constraint state with the verbs engines already know from the anchors."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from constrain.arguments import check_index, check_instance, check_int
from constrain.automaton import TokenAutomaton
from constrain.bitmask import write_row

if TYPE_CHECKING:
    import torch

# The state after a stop token (no grammar state has a negative id).
TERMINATED = -2


def close_bytes(tokens_left: int) -> int:
    """Bytes the budget-aware close leaves the rest of the document after the next token: one
    token is that token, one the stop token, and every other token can be one byte."""
    return tokens_left - 2


def budget_level(completions: list[float], tokens_left: int) -> int:
    """How many of a state's ``next_completions()`` fit ``tokens_left``. The budget-aware mask
    keeps a token iff the state it leads to fits, so two budgets of the same level give the same
    mask: engines key cached close masks by (state, level) instead of (state, tokens_left)."""
    return bisect.bisect_right(completions, close_bytes(tokens_left))


class Matcher:
    """Tracks one sequence through a compiled grammar.

    The state is one integer; the history of states makes ``rollback`` unbounded and O(n).
    Matchers are cheap: create one per request and share the ``CompiledGrammar``.
    """

    __slots__ = ("_automaton", "_history")

    def __init__(self, automaton: TokenAutomaton, state: int | None = None) -> None:
        self._automaton = automaton
        self._history: list[int] = [automaton.initial_state if state is None else state]

    @property
    def state(self) -> int:
        """The current automaton state id (-2 once a stop token was accepted)."""
        return self._history[-1]

    def accept_token(self, token_id: int) -> bool:
        """Advance by ``token_id``; False (and no change) when the constraint forbids it.

        An id outside the vocabulary (``[0, vocab_size)``) is a ValueError, not a refusal.
        """
        automaton = self._automaton
        size = automaton.vocab.vocab_size
        if type(token_id) is not int or not 0 <= token_id < size:
            token_id = check_index(token_id, "Matcher.accept_token(token_id)", size,
                                   f"the token ids of {automaton.vocab.name}")
        return self._accept((token_id,)) == 1

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        """Advance by each of ``token_ids`` in order, up to the first one the constraint forbids;
        returns how many were accepted (llguidance's ``consume_tokens``). A run of tokens in one
        call costs about a third of an ``accept_token`` call per token: an engine whose GPU state
        table already advanced past them catches its matcher up this way."""
        automaton = self._automaton
        size = automaton.vocab.vocab_size
        return self._accept([t if type(t) is int and 0 <= t < size else
                             check_index(t, "Matcher.accept_tokens(token_ids)", size,
                                         f"the token ids of {automaton.vocab.name}") for t in token_ids])

    def _accept(self, token_ids: Sequence[int]) -> int:
        history = self._history
        s = history[-1]
        if s == TERMINATED:
            return 0
        automaton = self._automaton
        after = automaton.walk(s, token_ids)  # up to a stop token or a refused one
        history.extend(after)
        n = len(after)
        if n < len(token_ids) and token_ids[n] in automaton.eos_token_ids:
            if automaton.is_accepting(after[-1] if after else s):
                history.append(TERMINATED)
                n += 1
        return n

    def accept_bytes(self, data: bytes) -> bool:
        """Advance by raw bytes (forced text); False (and no change) if they leave the language."""
        check_instance(data, "Matcher.accept_bytes(data)", (bytes, bytearray, memoryview), "bytes")
        s = self._history[-1]
        if s == TERMINATED:
            return False
        table = self._automaton.table
        for b in data:
            s = int(table.row(s)[b])
            if s == 0:
                return False
        self._history.append(s)
        return True

    def fill_next_token_bitmask(self, bitmask: torch.Tensor | np.ndarray, index: int = 0, *,
                                tokens_left: int | None = None) -> None:
        """Write the allowed next tokens into row ``index`` of an int32 bitmask (a torch tensor
        on any device, or a numpy array) of shape ``(batch, >= ceil(vocab_size/32))``.

        ``tokens_left`` (the budget-aware close): at most that many more tokens, the stop token
        included, may follow. Near the limit only tokens that keep a complete document within
        reach are allowed, so generation ends valid instead of being cut. It counts one byte per
        token for the rest, which byte-level vocabularies (all 256 single-byte tokens) guarantee.
        """
        automaton = self._automaton
        if tokens_left is not None and (type(tokens_left) is not int or tokens_left < 0):
            if check_int(tokens_left, "Matcher.fill_next_token_bitmask(tokens_left)") < 0:
                raise ValueError(f"Matcher.fill_next_token_bitmask(tokens_left)={tokens_left} must be >= 0")
        s = self._history[-1]
        if s == TERMINATED:
            words = automaton.terminated_mask()
        elif tokens_left is not None and self.budget_binds(tokens_left):
            words = automaton.budget_mask(s, close_bytes(tokens_left))
        else:
            words = automaton.mask(s)
        write_row(bitmask, index, words)

    def allowed_token_ids(self) -> np.ndarray:
        """The allowed next token ids (debugging and tests; engines use the bitmask)."""
        bits = np.zeros((1, self._automaton.n_words), dtype=np.int32)
        self.fill_next_token_bitmask(bits)
        flags = np.unpackbits(bits.view(np.uint8), bitorder="little")
        return np.nonzero(flags)[0]

    def mask_is_cached(self, tokens_left: int | None = None) -> bool:
        """Whether the next fill with this ``tokens_left`` reads a cached mask: no walk, no new
        state (``BatchMatcher`` fills such rows itself and gives the others to its threads)."""
        s = self._history[-1]
        if s == TERMINATED:
            return True
        return self._automaton.mask_is_cached(s, None if tokens_left is None else close_bytes(tokens_left))

    def prepare_mask(self, tokens_left: int | None = None) -> None:
        """Compute and cache what the next fill with this ``tokens_left`` reads: the state's mask
        and, with ``tokens_left``, whether the close binds (``BatchMatcher.prepare`` runs this on
        its threads; a close that binds is built by the fill itself, as it is never cached)."""
        s = self._history[-1]
        if s == TERMINATED:
            return
        self._automaton.mask(s)
        if tokens_left is not None:
            self.budget_binds(tokens_left)

    def budget_binds(self, tokens_left: int) -> bool:
        """Whether ``tokens_left`` makes the budget-aware mask differ from the plain one: some
        allowed token leads to a state whose shortest completion no longer fits. Engines use it
        to take the plain (cached, GPU-resident) mask whenever the close changes nothing."""
        s = self._history[-1]
        return s != TERMINATED and self._automaton.max_next_completion(s) > close_bytes(tokens_left)

    def next_completions(self) -> list[float]:
        """The distinct shortest completions (bytes), ascending, of the states the allowed
        non-stop tokens lead to (empty after a stop token): where the budget-aware mask can
        change (``budget_level``). One walk of the vocabulary, cached with the state's close masks."""
        s = self._history[-1]
        return [] if s == TERMINATED else self._automaton.next_completions(s)

    def min_completion_bytes(self) -> float:
        """Bytes in the shortest completion of the document so far (0 when it may end here)."""
        s = self._history[-1]
        return 0 if s == TERMINATED else self._automaton.table.min_completion(s)

    def is_accepting(self) -> bool:
        """Whether the text so far is a complete document (a stop token would be accepted)."""
        s = self._history[-1]
        return s == TERMINATED or self._automaton.is_accepting(s)

    def is_terminated(self) -> bool:
        """Whether a stop token has been accepted."""
        return self._history[-1] == TERMINATED

    def rollback(self, num_tokens: int = 1) -> None:
        """Undo the last ``num_tokens`` accepted tokens (or byte strings)."""
        num_tokens = check_int(num_tokens, "Matcher.rollback(num_tokens)")
        if num_tokens < 0 or num_tokens >= len(self._history):
            raise ValueError(f"Matcher.rollback(num_tokens): cannot roll back {num_tokens} tokens: only {len(self._history) - 1} accepted")
        if num_tokens:
            del self._history[-num_tokens:]

    def reset(self) -> None:
        """Back to the start of the document."""
        del self._history[1:]

    def fork(self) -> Matcher:
        """An independent copy sharing the compiled grammar."""
        other = Matcher(self._automaton)
        other._history = list(self._history)
        return other

    def find_jump_forward_bytes(self) -> bytes:
        """Bytes the constraint forces next (empty when there is a choice or the document may end)."""
        s = self._history[-1]
        return b"" if s == TERMINATED else self._automaton.forced_bytes(s)

    def find_jump_forward_string(self) -> str:
        """The forced bytes decoded as UTF-8 (a trailing partial character is left out)."""
        return self.find_jump_forward_bytes().decode("utf-8", "ignore")
