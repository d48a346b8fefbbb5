"""StateTable: kernel lookups == torch twin == a Python dict, across growth and updates."""

from __future__ import annotations

import torch
from support.kernels import DEVICE, needs_kernels, rand_words

from constrain.kernels import StateTable, advance_ref
from constrain.kernels.state_table import apply_updates, apply_updates_ref


def _check(table: StateTable, truth: dict[tuple[int, int], int], present: set[int], g: torch.Generator) -> None:
    known = list(truth)
    qs = torch.tensor([k[0] for k in known] + torch.randint(-1, 40, (60,), generator=g).tolist(), dtype=torch.int32)
    qt = torch.tensor([k[1] for k in known] + torch.randint(0, 500, (60,), generator=g).tolist(), dtype=torch.int32)
    out, miss = table.advance(qs.to(DEVICE), qt.to(DEVICE))
    o2, m2 = advance_ref(table.keys, table.values, table.present, qs.to(DEVICE), qt.to(DEVICE))
    assert torch.equal(out, o2) and torch.equal(miss, m2)
    for s, t, o, m in zip(qs.tolist(), qt.tolist(), out.tolist(), miss.tolist()):
        if s < 0:  # unconstrained rows pass through
            assert (o, m) == (s, False)
            continue
        want = truth.get((s, t), -1)
        if want not in present:
            want = -1
        assert (o, m) == (want, want == -1), (s, t)


@needs_kernels
def test_advance_growth_updates_and_misses() -> None:
    g = torch.Generator().manual_seed(0)
    table = StateTable(4, device=DEVICE, state_capacity=2, transition_capacity=16)
    truth: dict[tuple[int, int], int] = {}
    present: set[int] = set()
    gen0 = table.generation
    for round_ in range(4):
        n = 60
        s = torch.randint(0, 40, (n,), generator=g)
        t = torch.randint(0, 500, (n,), generator=g)
        nxt = torch.randint(0, 50, (n,), generator=g)
        table.add_transitions(s, t, nxt)
        for a, b, c in zip(s.tolist(), t.tolist(), nxt.tolist()):
            truth[(a, b)] = c
        ids = torch.arange(round_ * 12, round_ * 12 + 12)
        table.add_states(ids, torch.full((12, 4), round_, dtype=torch.int32))
        present.update(ids.tolist())
        _check(table, truth, present, g)
    assert table.generation > gen0  # it grew (states and slots), and lookups stayed right
    assert table.num_transitions == len(truth)
    # overwrite existing keys: later value wins
    k = list(truth)[:5]
    table.add_transitions(torch.tensor([a for a, _ in k]), torch.tensor([b for _, b in k]), torch.tensor([1, 2, 3, 4, 5]))
    truth.update({kk: v for kk, v in zip(k, [1, 2, 3, 4, 5])})
    _check(table, truth, present, g)


def test_gather_masks_and_reserve() -> None:
    table = StateTable(2, device=DEVICE)
    table.add_state(3, torch.tensor([5, -7], dtype=torch.int32))
    rows = table.gather_masks(torch.tensor([3, -1, 0]))
    assert rows.tolist() == [[5, -7], [-1, -1], [0, 0]]
    gen = table.generation
    table.reserve(states=1000, transitions=5000)
    assert table.state_capacity >= 1000 and table.transition_capacity >= 10000
    assert table.generation > gen
    assert table.gather_masks(torch.tensor([3])).tolist() == [[5, -7]]


def test_default_next_state() -> None:
    """A state's default catches every token without a key; keys still win; others still miss."""
    table = StateTable(4, device=DEVICE, state_capacity=4, transition_capacity=16)
    table.add_states(torch.arange(8), torch.ones(8, 4, dtype=torch.int32))
    table.add_transitions(torch.tensor([2, 2, 3]), torch.tensor([10, 11, 10]), torch.tensor([5, 6, 7]))
    table.set_default(2, 4)
    table.set_default(6, 30)  # grows the states; row 30 not stored: lookups through it miss
    qs = torch.tensor([2, 2, 2, 3, 3, 6, -1], dtype=torch.int32, device=DEVICE)
    qt = torch.tensor([10, 11, 99, 10, 99, 1, 5], dtype=torch.int32, device=DEVICE)
    out, miss = table.advance(qs, qt)
    o2, m2 = advance_ref(table.keys, table.values, table.present, qs, qt, table.defaults)
    assert torch.equal(out, o2) and torch.equal(miss, m2)
    assert out.tolist() == [5, 6, 4, 7, -1, -1, -1]
    assert miss.tolist() == [False, False, False, False, True, True, False]


def test_alias_leaves_by_its_targets_transitions() -> None:
    """A row with an alias (a close mask of a state) advances exactly as its target would, keys
    and default included, while its own mask row stays its own; others are unaffected."""
    table = StateTable(4, device=DEVICE, state_capacity=4, transition_capacity=16)
    table.add_states(torch.arange(8), torch.ones(8, 4, dtype=torch.int32))
    table.add_transitions(torch.tensor([2, 2, 3]), torch.tensor([10, 11, 10]), torch.tensor([5, 6, 7]))
    table.set_default(2, 4)
    table.add_state(9, torch.full((4,), 3, dtype=torch.int32))  # grows the states (aliases too)
    table.set_alias(9, 2)
    table.set_alias(8, 3)  # advance never reads the row's own mask (none stored here)
    qs = torch.tensor([9, 9, 9, 2, 8, 8, 3, -1], dtype=torch.int32, device=DEVICE)
    qt = torch.tensor([10, 11, 99, 99, 10, 99, 10, 5], dtype=torch.int32, device=DEVICE)
    out, miss = table.advance(qs, qt)
    o2, m2 = advance_ref(table.keys, table.values, table.present, qs, qt, table.defaults, table.aliases)
    assert torch.equal(out, o2) and torch.equal(miss, m2)
    assert out.tolist() == [5, 6, 4, 4, 7, -1, 7, -1]
    assert miss.tolist() == [False, False, False, False, False, True, False, False]
    assert table.gather_masks(torch.tensor([9])).tolist() == [[3, 3, 3, 3]]


@needs_kernels
def test_apply_kernel_equals_its_twin() -> None:
    """Staged rows and entries written by the kernel == by the torch twin, every target (the
    flush's ``into`` tensor included)."""
    g = torch.Generator().manual_seed(1)
    words, states, slots = 37, 64, 256
    ids = torch.randperm(states, generator=g)[:9].to(torch.int32)
    rows = rand_words((9, words), g)
    n = 40
    target = torch.randint(0, 5, (n,), generator=g)  # keys, values, defaults, aliases, the caller's tensor
    index = torch.randperm(states, generator=g)[:n]  # distinct (so per target); slots < states here
    low, high = rand_words((n,), g), torch.randint(0, 2**31 - 1, (n,), generator=g, dtype=torch.int32)
    buf = torch.cat((ids, rows.reshape(-1), torch.stack((target.to(torch.int32), index.to(torch.int32), low, high), 1).reshape(-1)))

    def fresh() -> list[torch.Tensor]:
        return [torch.zeros(states, words, dtype=torch.int32, device=DEVICE), torch.zeros(states, dtype=torch.int8, device=DEVICE),
                torch.full((slots,), -1, dtype=torch.int64, device=DEVICE), torch.full((slots,), -1, dtype=torch.int32, device=DEVICE),
                torch.full((states,), -1, dtype=torch.int32, device=DEVICE), torch.full((states,), -1, dtype=torch.int32, device=DEVICE),
                torch.full((states,), -1, dtype=torch.int32, device=DEVICE)]

    got, want = fresh(), fresh()
    apply_updates(buf.to(DEVICE), 9, n, *got)
    apply_updates_ref(buf.to(DEVICE), 9, n, *want)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    keys = want[2]
    sel = target == 0
    assert keys[index[sel]].tolist() == [(h << 32) | (lo & 0xFFFFFFFF) for h, lo in zip(high[sel].tolist(), low[sel].tolist())]


def test_staged_inserts_equal_immediate_ones() -> None:
    """Inserts flushed once at the end (growth, a rehash and rewrites in between: the last write
    wins) leave the device tensors exactly as flushing after every insert does."""
    g = torch.Generator().manual_seed(2)
    tables = [StateTable(3, device=DEVICE, state_capacity=2, transition_capacity=16) for _ in range(2)]
    for step in range(30):
        ops = [("rows", torch.randint(0, 40, (3,), generator=g), rand_words((3, 3), g)),
               ("keys", torch.randint(0, 40, (7,), generator=g), torch.randint(0, 500, (7,), generator=g),
                torch.randint(0, 40, (7,), generator=g)),
               ("default", step % 13, step % 7), ("alias", 40 + step % 5, step % 11)]
        for k, table in enumerate(tables):
            for op in ops:
                if op[0] == "rows":
                    table.add_states(op[1], op[2])
                elif op[0] == "keys":
                    table.add_transitions(op[1], op[2], op[3])
                elif op[0] == "default":
                    table.set_default(op[1], op[2])
                else:
                    table.set_alias(op[1], op[2])
                if k == 0:
                    table.flush()
    a, b = tables
    assert a.generation == b.generation and a.generation > 0
    for name in ("masks", "present", "keys", "values", "defaults", "aliases"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
