"""GPU-resident constraint state: mask rows per state and a (state, token) -> next-state hash.

Why a hash and not per-state sorted token lists: the host learns transitions one (state, token)
at a time, on misses, so rows of a CSR layout would have to be rebuilt as they fill. An
open-addressing table takes inserts in any order and stays one flat tensor pair.

Layout (all on `device`, growable by doubling; kernels take capacities as runtime arguments, so
growth never recompiles, but it does reallocate: `generation` increments and a captured CUDA
graph must then be captured again; `reserve()` up front avoids that in steady state):
- `masks`   int32 (state_capacity, words): row s is the bitmask of state s (0 = nothing allowed
  until `add_states` fills it); `present` int8 (state_capacity,) says which rows are filled.
- `defaults` int32 (state_capacity,): a state's default next state, -1 = none. Why: a state that
  allows most of the vocabulary (a string body) sends ~99% of its tokens to one state; hashing
  its ~120k pairs costs ~100 ms of host time and megabytes, while the default plus the few
  exceptions in the hash (`set_default`) cost one load. A lookup that finds no key falls back to
  the default, so a state may get one only once *all* its other transitions are in the hash.
- `aliases` int32 (state_capacity,): the state whose transitions a row leaves by, -1 = its own.
  Why: a row may hold another mask of a state (the budget-aware close's, which only removes
  tokens); pointing it at that state's transitions (`set_alias`) lets a sampled token advance
  on the GPU as it would from the state itself, with no keys of its own.
- `keys`    int64 (slots,): (state << 32) | token, -1 = empty; `values` int32 (slots,): next state.
  Linear probing; every key is stored within MAX_PROBE slots of its home, so a lookup is a
  fixed MAX_PROBE loads with no data-dependent loop (graph- and warp-friendly). An insert that
  cannot honour that bound, or a load factor over 1/2, doubles the table.

State ids are used directly as row indices, so they should be dense small integers (the lazy
compiler hands them out in order). Inserts are computed on a host mirror of the key array and
only the touched slots are copied to the device: the host already holds the new state then.

Inserts are staged on the host and reach the device together (``flush``: one upload of one int32
buffer, one kernel writing rows, keys, values, defaults and aliases; `_apply_kernel` and its twin
`apply_updates_ref`). Why: an engine step that resolves misses inserts rows, keys and a default
or two; as separate uploads and indexed writes that was ten device operations, each 20-70 us of
host time on the H200's host while a forward is queued (``add_transitions`` of one key: 440 us).
Every read of the device tensors through this class flushes first; a captured CUDA graph reads
them directly, so its replayer calls ``flush()`` before replaying (``GraphRunner.sample``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
import torch

from ._common import HAS_TRITON, MASK32, _mix_ref, tl, triton, use_triton
from .transfer import to_device

if HAS_TRITON:
    from ._common import _mix

MAX_PROBE = 8
# targets of a staged entry (target, index, low, high): keys[index] = high << 32 | low (unsigned),
# values / defaults / aliases / the flush's ``into`` tensor [index] = low
_KEY, _VALUE, _DEFAULT, _ALIAS, _INTO = 0, 1, 2, 3, 4
_HASH_MUL = 0x61C88647


def _hash_np(keys: np.ndarray) -> np.ndarray:
    """Home slot hash of packed keys (before masking by capacity); twin of `_slot_hash`. (The
    same arithmetic as `_hash_ref`, on numpy arrays: an insert of a few keys costs microseconds.)"""
    return _mix_ref(((keys >> 32) * _HASH_MUL & MASK32) ^ (keys & MASK32))  # type: ignore[arg-type, return-value]


def _hash_ref(states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    s = states.to(torch.int64) & MASK32
    t = tokens.to(torch.int64) & MASK32
    return _mix_ref(((s * _HASH_MUL) & MASK32) ^ t)


def advance_ref(
    keys: torch.Tensor,
    values: torch.Tensor,
    present: torch.Tensor,
    states: torch.Tensor,
    tokens: torch.Tensor,
    defaults: torch.Tensor | None = None,
    aliases: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch twin of the advance kernel (same probing, same outputs). Without `defaults`
    a pair missing from the hash is a miss; without `aliases` every state leaves by its own."""
    cap = keys.numel()
    states = states.to(torch.int32)
    active = states >= 0
    if aliases is not None:
        a = aliases[states.clamp(min=0, max=aliases.numel() - 1).long()]
        states = torch.where(active & (states < aliases.numel()) & (a >= 0), a, states)
    key = (states.to(torch.int64).clamp(min=0) << 32) | tokens.to(torch.int64)
    home = _hash_ref(states.clamp(min=0), tokens)
    nxt = torch.full_like(states, -1)
    found = torch.zeros_like(active)
    for p in range(MAX_PROBE):
        slot = (home + p) & (cap - 1)
        hit = (keys[slot] == key) & ~found
        nxt = torch.where(hit, values[slot], nxt)
        found |= hit
    if defaults is not None:
        d = defaults[states.clamp(min=0, max=defaults.numel() - 1).long()]
        use = ~found & (d >= 0) & (states < defaults.numel())
        nxt = torch.where(use, d, nxt)
        found |= use
    in_table = found & (nxt < present.numel())
    ok = in_table & (present[nxt.clamp(min=0, max=present.numel() - 1).long()] != 0)
    miss = active & ~ok
    out = torch.where(active, torch.where(ok, nxt, torch.full_like(nxt, -1)), states)
    return out, miss


if HAS_TRITON:

    @triton.jit
    def _slot_hash(s, t):
        """Home slot hash of (state, token) before masking by capacity (twin: `_hash_ref`)."""
        return _mix((s.to(tl.uint32) * 0x61C88647) ^ t.to(tl.uint32))

    @triton.jit
    def _advance_kernel(
        keys_ptr,
        values_ptr,
        present_ptr,
        defaults_ptr,
        aliases_ptr,
        states_ptr,
        tokens_ptr,
        out_ptr,
        miss_ptr,
        n,
        cap,
        n_states,
        MAX_PROBE_: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < n
        s = tl.load(states_ptr + offs, mask=inb, other=-1)
        t = tl.load(tokens_ptr + offs, mask=inb, other=0)
        active = s >= 0
        s0 = tl.maximum(s, 0)
        alias = tl.load(aliases_ptr + s0, mask=inb & active & (s0 < n_states), other=-1)
        s0 = tl.where(alias >= 0, alias, s0)
        key = (s0.to(tl.int64) << 32) | t.to(tl.int64)
        slot = (_slot_hash(s0, t) & (cap - 1)).to(tl.int64)
        nxt = tl.full([BLOCK], -1, tl.int32)
        found = tl.zeros([BLOCK], tl.int1)
        for _ in tl.static_range(MAX_PROBE_):
            k = tl.load(keys_ptr + slot, mask=inb & active, other=-1)
            hit = (k == key) & (~found)
            v = tl.load(values_ptr + slot, mask=hit, other=-1)
            nxt = tl.where(hit, v, nxt)
            found = found | hit
            slot = (slot + 1) & (cap - 1)
        dflt = tl.load(defaults_ptr + s0, mask=inb & active & (~found) & (s0 < n_states), other=-1)
        use = (~found) & (dflt >= 0)
        nxt = tl.where(use, dflt, nxt)
        found = found | use
        pres = tl.load(present_ptr + tl.maximum(nxt, 0), mask=found & (nxt < n_states), other=0)
        ok = found & (pres != 0)
        miss = active & (~ok)
        out = tl.where(active, tl.where(ok, nxt, -1), s)
        tl.store(out_ptr + offs, out, mask=inb)
        tl.store(miss_ptr + offs, miss.to(tl.int8), mask=inb)


def apply_updates_ref(buf: torch.Tensor, n_rows: int, n_sets: int, masks: torch.Tensor, present: torch.Tensor,
                      keys: torch.Tensor, values: torch.Tensor, defaults: torch.Tensor, aliases: torch.Tensor,
                      into: torch.Tensor) -> None:
    """Twin of `_apply_kernel`: ``buf`` (int32) holds ``n_rows`` row ids, their rows, then
    ``n_sets`` entries (target, index, low, high); indices are distinct per target."""
    words = masks.shape[1]
    if n_rows:
        ids = buf[:n_rows].long()
        masks[ids] = buf[n_rows: n_rows * (1 + words)].view(n_rows, words)
        present[ids] = 1
    if not n_sets:
        return
    ents = buf[n_rows * (1 + words):].view(n_sets, 4).long()
    target, index, low, high = ents.unbind(1)
    dsts = {_KEY: keys, _VALUE: values, _DEFAULT: defaults, _ALIAS: aliases, _INTO: into}
    for t in target.unique().tolist():  # (most flushes carry one or two targets: this is on the step's path)
        sel = target == t
        got = high[sel] << 32 | low[sel] & MASK32 if t == _KEY else low[sel]
        dsts[t][index[sel]] = got.to(dsts[t].dtype)


def apply_updates(buf: torch.Tensor, n_rows: int, n_sets: int, masks: torch.Tensor, present: torch.Tensor,
                  keys: torch.Tensor, values: torch.Tensor, defaults: torch.Tensor, aliases: torch.Tensor,
                  into: torch.Tensor) -> None:
    """Write staged rows and entries (layout: `apply_updates_ref`) into the table's tensors and
    ``into`` (an int32 tensor of the caller's)."""
    if not use_triton(buf):
        apply_updates_ref(buf, n_rows, n_sets, masks, present, keys, values, defaults, aliases, into)
        return
    block = 1024
    grid = (n_rows + triton.cdiv(n_sets, block),)
    if grid[0]:
        words = masks.shape[1]
        _apply_kernel[grid](buf, n_rows, n_rows * (1 + words), n_sets, words, masks, present, keys, values, defaults,
                            aliases, into, BLOCK=block, num_warps=4)


if HAS_TRITON:

    # Counts change every flush: specialising on them (a value of 1, multiples of 16) would compile
    # a variant of the kernel inside the decode loop the first time each one is met.
    @triton.jit(do_not_specialize=["n_rows", "sets_at", "n_sets"])
    def _apply_kernel(buf_ptr, n_rows, sets_at, n_sets, words, masks_ptr, present_ptr, keys_ptr, values_ptr, defaults_ptr,
                      aliases_ptr, into_ptr, BLOCK: tl.constexpr):
        """Programs ``0..n_rows-1`` copy one mask row each; the rest write BLOCK entries each (from
        ``sets_at`` on)."""
        pid = tl.program_id(0)
        if pid < n_rows:
            row = tl.load(buf_ptr + pid).to(tl.int64)
            src = buf_ptr + n_rows + pid.to(tl.int64) * words
            for start in range(0, words, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                inb = cols < words
                tl.store(masks_ptr + row * words + cols, tl.load(src + cols, mask=inb), mask=inb)
            tl.store(present_ptr + row, 1)
        else:
            i = (pid - n_rows) * BLOCK + tl.arange(0, BLOCK)
            inb = i < n_sets
            ent = buf_ptr + sets_at + 4 * i
            target = tl.load(ent, mask=inb, other=-1)
            index = tl.load(ent + 1, mask=inb, other=0).to(tl.int64)
            low = tl.load(ent + 2, mask=inb, other=0)
            high = tl.load(ent + 3, mask=inb, other=0)
            key = (high.to(tl.int64) << 32) | low.to(tl.uint32, bitcast=True).to(tl.int64)
            # targets as in ``_KEY, _VALUE, _DEFAULT, _ALIAS, _INTO``
            tl.store(keys_ptr + index, key, mask=inb & (target == 0))
            tl.store(values_ptr + index, low, mask=inb & (target == 1))
            tl.store(defaults_ptr + index, low, mask=inb & (target == 2))
            tl.store(aliases_ptr + index, low, mask=inb & (target == 3))
            tl.store(into_ptr + index, low, mask=inb & (target == 4))


class _Flushed:
    """A device tensor of the table (held as ``_name``), read after its staged inserts are applied."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = "_" + name

    @overload
    def __get__(self, table: None, owner: type) -> _Flushed: ...
    @overload
    def __get__(self, table: StateTable, owner: type | None = None) -> torch.Tensor: ...

    def __get__(self, table: StateTable | None, owner: type | None = None) -> torch.Tensor | _Flushed:
        if table is None:  # on the class (help(), introspection)
            return self
        table.flush()
        return getattr(table, self.attr)


class StateTable:
    """Per compiled grammar: mask rows of states seen so far and their transitions, on the GPU."""

    masks = _Flushed("int32 (state_capacity, words): row s is the bitmask of state s.")
    present = _Flushed("int8 (state_capacity,): which rows are filled.")
    defaults = _Flushed("int32 (state_capacity,): each state's default next state, -1 = none.")
    aliases = _Flushed("int32 (state_capacity,): the state whose transitions a row leaves by, -1 = its own.")
    keys = _Flushed("int64 (slots,): (state << 32) | token, -1 = empty.")
    values = _Flushed("int32 (slots,): the next state of the key in the same slot.")

    def __init__(
        self,
        mask_words: int,
        device: torch.device | str = "cpu",
        state_capacity: int = 64,
        transition_capacity: int = 1024,
    ) -> None:
        self.words = int(mask_words)
        self.device = torch.device(device)
        self.generation = 0
        self._masks = torch.zeros(_pow2(state_capacity), self.words, dtype=torch.int32, device=self.device)
        self._present = torch.zeros(self._masks.shape[0], dtype=torch.int8, device=self.device)
        self._defaults = torch.full((self._masks.shape[0],), -1, dtype=torch.int32, device=self.device)
        self._aliases = torch.full_like(self._defaults, -1)
        self._staged_rows: list[tuple[np.ndarray, np.ndarray]] = []  # (ids, rows) not on the device yet
        self._staged_sets: list[np.ndarray] = []  # (n, 4) int32 entries (target, index, low, high)
        self._alloc_slots(_pow2(max(transition_capacity, 16)))

    # ---- capacity -------------------------------------------------------------------------
    @property
    def state_capacity(self) -> int:
        return self._masks.shape[0]

    @property
    def transition_capacity(self) -> int:
        return self._keys.numel()

    def _alloc_slots(self, cap: int) -> None:
        self.num_transitions = 0
        self._keys_np = np.full(cap, -1, dtype=np.int64)
        self._values_np = np.full(cap, -1, dtype=np.int32)
        self._keys = torch.full((cap,), -1, dtype=torch.int64, device=self.device)
        self._values = torch.full((cap,), -1, dtype=torch.int32, device=self.device)

    def reserve(self, states: int = 0, transitions: int = 0) -> None:
        """Grow ahead of time so steady-state decoding never reallocates (keeps graphs valid)."""
        if states > self.state_capacity:
            self._grow_states(states)
        if 2 * transitions > self.transition_capacity:
            self._rehash(_pow2(2 * transitions))

    def _grow_states(self, need: int) -> None:
        cap = _pow2(max(need, 2 * self.state_capacity))
        masks = torch.zeros(cap, self.words, dtype=torch.int32, device=self.device)
        present = torch.zeros(cap, dtype=torch.int8, device=self.device)
        masks[: self.state_capacity] = self._masks
        present[: self.state_capacity] = self._present
        defaults = torch.full((cap,), -1, dtype=torch.int32, device=self.device)
        defaults[: self.state_capacity] = self._defaults
        aliases = torch.full_like(defaults, -1)
        aliases[: self.state_capacity] = self._aliases
        self._masks, self._present, self._defaults, self._aliases = masks, present, defaults, aliases
        self.generation += 1

    def _rehash(self, cap: int) -> None:
        old = self._keys_np != -1
        keys, values = self._keys_np[old], self._values_np[old]
        while True:
            self._alloc_slots(cap)
            if self._place(keys, values) is not None:
                break
            cap *= 2
        self._keys.copy_(torch.from_numpy(self._keys_np), non_blocking=True)
        self._values.copy_(torch.from_numpy(self._values_np), non_blocking=True)
        # the host mirror is whole again: staged key and value entries named the old slots
        self._staged_sets = [e[(e[:, 0] != _KEY) & (e[:, 0] != _VALUE)] for e in self._staged_sets]
        self.generation += 1

    # ---- host inserts (staged; ``flush`` moves them to the device) ---------------------------
    def add_state(self, state_id: int, mask_words: torch.Tensor) -> None:
        """Store the mask row (int32 words) of one state."""
        self.add_states(torch.tensor([state_id]), mask_words.reshape(1, -1))

    def add_states(self, state_ids: object, mask_rows: object) -> None:
        """Store mask rows (n, words) int32 for states `state_ids` (n,) (later duplicates win)."""
        ids = _host_array(state_ids, np.int64).reshape(-1)
        if ids.size == 0:
            return
        rows = _host_array(mask_rows, np.int32).reshape(ids.size, self.words)
        if int(ids.min()) < 0:
            raise ValueError("state ids must be >= 0")
        need = int(ids.max()) + 1
        if need > self.state_capacity:
            self._grow_states(need)
        self._staged_rows.append((ids.astype(np.int32), rows))

    def set_default(self, state: int, next_state: int) -> None:
        """Every token of `state` that has no key in the hash leads to `next_state`. Call only
        after all of `state`'s other transitions were added (a lookup never misses it again)."""
        self._set(_DEFAULT, state, next_state)

    def set_alias(self, state: int, target: int) -> None:
        """Row `state` leaves by `target`'s transitions (and default) from now on; its own mask
        row stays what `add_states` stored. `target` must not have an alias itself."""
        self._set(_ALIAS, state, target)

    def _set(self, target: int, state: int, value: int) -> None:
        if state < 0 or value < 0:
            raise ValueError("states must be >= 0")
        if max(state, value) >= self.state_capacity:
            self._grow_states(max(state, value) + 1)
        self._staged_sets.append(np.array([[target, state, value, 0]], dtype=np.int32))

    def add_transitions(self, states: object, tokens: object, next_states: object) -> None:
        """Record (state, token) -> next_state for each element (later duplicates win); any
        integer sequences, arrays or tensors of one length."""
        s, t, v = (_host_array(x, np.int64).reshape(-1) for x in (states, tokens, next_states))
        if s.size == 0:
            return
        if min(s.min(), t.min(), v.min()) < 0:
            raise ValueError("states, tokens and next states must be >= 0")
        keys, values = (s << 32) | t, v.astype(np.int32)
        keep = _last_of_each(keys)
        if keep is not None:
            keys, values = keys[keep], values[keep]
        if 2 * (self.num_transitions + keys.size) > self.transition_capacity:
            self._rehash(_pow2(2 * (self.num_transitions + keys.size)))
        touched = self._place(keys, values)
        while touched is None:  # probe bound exceeded: double and re-place everything
            self._rehash(2 * self.transition_capacity)
            touched = self._place(keys, values)
        if touched.size:  # a key entry and a value entry per touched slot
            k = self._keys_np[touched]
            ents = np.empty((2 * touched.size, 4), dtype=np.int32)
            ents[0::2, 0], ents[1::2, 0] = _KEY, _VALUE
            ents[:, 1] = np.repeat(touched, 2)
            ents[0::2, 2] = (k & MASK32).astype(np.uint32).view(np.int32)
            ents[0::2, 3] = k >> 32
            ents[1::2, 2] = self._values_np[touched]
            ents[1::2, 3] = 0
            self._staged_sets.append(ents)

    def flush(self, into: tuple[torch.Tensor, Sequence[int], Sequence[int]] | None = None) -> None:
        """Apply the staged inserts on the device: one upload, one kernel (queued, no wait).
        ``into = (tensor, indices, values)``: int32 writes of the caller's riding along (an
        engine's per-row states, patched before the sample that reads them)."""
        if into is not None and len(into[1]):
            ents = np.zeros((len(into[1]), 4), dtype=np.int32)
            ents[:, 0] = _INTO
            ents[:, 1] = into[1]
            ents[:, 2] = into[2]
            self._staged_sets.append(ents)
        if not (self._staged_rows or self._staged_sets):
            return
        rows, self._staged_rows = self._staged_rows, []
        sets, self._staged_sets = self._staged_sets, []
        ids = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.int32)
        words = np.concatenate([r[1] for r in rows]) if rows else np.zeros((0, self.words), np.int32)
        ents = np.concatenate(sets) if sets else np.zeros((0, 4), np.int32)
        # the last write of a row, and of an entry's target and index, wins (one kernel writes all at once)
        keep = _last_of_each(ids)
        if keep is not None:
            ids, words = ids[keep], words[keep]
        if len(sets) > 1:  # (one staged array never repeats a target and index: one call's slots, a dict's rows)
            keep = _last_of_each(ents[:, 0].astype(np.int64) << 32 | ents[:, 1].astype(np.int64))
            if keep is not None:
                ents = ents[keep]
        # queued behind the stream's work (``to_device``): the engine inserts while a forward runs
        buf = to_device(torch.from_numpy(np.concatenate((ids, words.reshape(-1), ents.reshape(-1)))), torch.int32, self.device)
        apply_updates(buf, ids.size, len(ents), self._masks, self._present, self._keys, self._values,
                      self._defaults, self._aliases, self._aliases if into is None else into[0])

    def _place(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray | None:
        """Insert into the host mirror; returns touched slots, or None if a key would land
        more than MAX_PROBE from home (the mirror is then left partially updated: rehash)."""
        mask = self._keys_np.size - 1
        table_keys, table_values = self._keys_np, self._values_np
        home = _hash_np(keys)
        touched = []
        pending = []  # indices of keys to insert: not in the table
        search = np.arange(keys.size)  # keys that may be in the table further along their probe
        for p in range(MAX_PROBE):  # update keys already present
            slot = (home[search] + p) & mask
            found = table_keys[slot]
            hit = found == keys[search]
            if hit.any():
                table_values[slot[hit]] = values[search[hit]]
                touched.append(slot[hit])
            empty = found == -1  # (no deletions: a key is never past an empty slot of its probe)
            pending.append(search[empty])
            search = search[~hit & ~empty]
            if search.size == 0:
                break
        if search.size:  # neither found nor placeable within MAX_PROBE of home
            return None
        idx = np.concatenate(pending) if len(pending) > 1 else pending[0]
        for p in range(MAX_PROBE):
            if idx.size == 0:
                break
            slot = (home[idx] + p) & mask
            free = table_keys[slot] == -1
            place, slot, later = idx[free], slot[free], idx[~free]
            if place.size > 1:  # keys meeting at one free slot: the first takes it, the others probe on
                slot, first = np.unique(slot, return_index=True)
                if first.size < place.size:
                    lost = np.ones(place.size, dtype=bool)
                    lost[first] = False
                    later = np.concatenate((later, place[lost]))
                place = place[first]
            table_keys[slot] = keys[place]
            table_values[slot] = values[place]
            touched.append(slot)
            self.num_transitions += place.size
            idx = later
        if idx.size:
            return None
        return np.concatenate(touched) if touched else np.zeros(0, dtype=np.int64)

    # ---- device lookups -------------------------------------------------------------------
    def advance(self, states: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next state per row, and a miss flag (bool) where the host must compute it.

        states (n,) int32 (negative = unconstrained row: passed through, never a miss),
        tokens (n,) int. A miss is an unknown (state, token) pair or a next state whose mask row
        is not stored yet; its next state reads -1.
        """
        states = states.to(device=self.device, dtype=torch.int32).contiguous()
        tokens = tokens.to(device=self.device, dtype=torch.int32).contiguous()
        if not use_triton(states):
            return advance_ref(self.keys, self.values, self.present, states, tokens, self.defaults, self.aliases)
        n = states.numel()
        out = torch.empty_like(states)
        miss = torch.empty(n, dtype=torch.int8, device=self.device)
        if n:
            block = 128 if n <= 4096 else 512
            _advance_kernel[(triton.cdiv(n, block),)](
                self.keys, self.values, self.present, self.defaults, self.aliases, states, tokens, out, miss,
                n, self.transition_capacity, self.state_capacity, MAX_PROBE_=MAX_PROBE, BLOCK=block, num_warps=4,
            )
        return out, miss.bool()

    def gather_masks(self, states: torch.Tensor) -> torch.Tensor:
        """(n, words) mask rows of `states`; negative states get an all-allowed row (-1 words)."""
        states = states.to(self.device).long()
        rows = self.masks[states.clamp(min=0)]
        return torch.where((states < 0)[:, None], torch.full_like(rows, -1), rows)


def _last_of_each(keys: np.ndarray) -> np.ndarray | None:
    """Indices (ascending) of the last occurrence of each distinct key; None when all differ."""
    if keys.size < 2:
        return None
    _, last = np.unique(keys[::-1], return_index=True)
    return None if last.size == keys.size else np.sort(keys.size - 1 - last)


def _host_array(x: object, dtype: type) -> np.ndarray:
    """Integer sequences, arrays or tensors (any device) as a host array of ``dtype``."""
    return np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x, dtype=dtype)


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 1).bit_length()
