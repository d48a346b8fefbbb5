"""kernels/: Triton kernels with pure-torch twins. Torch tensors in, torch tensors out.

Dispatch: CUDA tensors run the Triton kernel; CPU tensors run the twin, unless TRITON_INTERPRET=1
was set before import (CI), in which case the Triton kernels run in the interpreter.
"""

from ._common import HAS_TRITON, INTERPRET, use_triton
from .apply_bitmask import apply_token_bitmask_inplace, apply_token_bitmask_inplace_ref, unpack_bitmask
from .sampling import sample, sample_ref
from .speculative import masked_argmax, verify_draft, verify_draft_ref
from .state_table import StateTable, advance_ref
from .transfer import to_device


def constrained_step(
    logits,
    table: StateTable,
    states,
    **sampling,
):
    """One decode step with no host round trip: sample under each row's state mask, then advance.

    Returns (tokens, next_states, miss, all_masked). Rows with a negative state are unconstrained
    and keep their state. Where `miss` is set the host computes the next state, stores it with
    `table.add_states` / `add_transitions`, and patches `next_states`.
    """
    tokens, all_masked = sample(logits, table.masks, states, **sampling)
    next_states, miss = table.advance(states, tokens.clamp(min=0))
    miss = miss & ~all_masked
    return tokens, next_states, miss, all_masked


__all__ = [
    "HAS_TRITON",
    "INTERPRET",
    "StateTable",
    "advance_ref",
    "apply_token_bitmask_inplace",
    "apply_token_bitmask_inplace_ref",
    "constrained_step",
    "masked_argmax",
    "sample",
    "sample_ref",
    "to_device",
    "unpack_bitmask",
    "use_triton",
    "verify_draft",
    "verify_draft_ref",
]
