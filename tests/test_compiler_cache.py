"""The compiler context: cache hits, eviction under a byte budget, clear(), contexts apart."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import constrain
from constrain.cache import SETTLE_EVICTIONS, SETTLE_REWEIGHS, ByteBudgetCache, nbytes_of
from constrain.grammars import ir
from constrain.tokenizers import gpt2

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}}


def walk_masks(compiled: constrain.CompiledGrammar, text: bytes) -> list[np.ndarray]:
    """The masks along ``text`` fed byte by byte (every prefix's state)."""
    m = compiled.matcher()
    masks = [compiled.state_mask(m.state)]
    for b in text:
        assert m.accept_bytes(bytes([b]))
        masks.append(compiled.state_mask(m.state))
    return masks


def test_same_constraint_is_a_cache_hit(byte_vocab) -> None:
    compiler = constrain.GrammarCompiler()
    first = compiler.compile_json_schema(SCHEMA, byte_vocab)
    entries = compiler.cache_entries
    assert compiler.compile_json_schema(SCHEMA, byte_vocab) is first
    assert compiler.compile_regex("a+", byte_vocab) is compiler.compile_regex("a+", byte_vocab)
    assert compiler.cache_entries == entries + 1  # the regex only


def test_options_and_budget_are_part_of_the_key(byte_vocab) -> None:
    compiler = constrain.GrammarCompiler()
    plain = compiler.compile_json_schema(SCHEMA, byte_vocab)
    assert compiler.compile_json_schema(SCHEMA, byte_vocab, strict_properties=True) is not plain
    budget = constrain.CompileBudget(seconds=5.0)
    other = compiler.compile_json_schema(SCHEMA, byte_vocab, budget=budget)
    assert other is not plain and other.budget == budget
    assert plain.budget == compiler.budget == constrain.CompileBudget()


def test_budget_reaches_the_automaton(byte_vocab) -> None:
    with pytest.raises(constrain.BudgetExceededError, match="max_states"):
        constrain.GrammarCompiler().compile_regex(
            "(a|b)*c{0,40}d", byte_vocab, budget=constrain.CompileBudget(max_states=8))
    strict = constrain.GrammarCompiler(budget=constrain.CompileBudget(max_states=8))
    with pytest.raises(constrain.BudgetExceededError, match="max_states"):
        strict.compile_regex("(a|b)*c{0,40}d", byte_vocab)


def test_least_recently_used_grammar_goes_first_under_a_small_budget(byte_vocab) -> None:
    probe = constrain.GrammarCompiler()
    probe.compile_regex("d+", byte_vocab)
    one = probe.cache_bytes  # the trie, the signature table and one grammar
    probe.compile_regex("e+", byte_vocab)
    grammar = probe.cache_bytes - one
    compiler = constrain.GrammarCompiler(max_cache_bytes=int(one + grammar * 1.5))  # room for about two grammars
    a = compiler.compile_regex("a+", byte_vocab)
    b = compiler.compile_regex("b+", byte_vocab)
    assert compiler.compile_regex("a+", byte_vocab) is a  # a is now the most recent
    compiler.compile_regex("c+", byte_vocab)
    assert compiler.cache_bytes <= compiler.max_cache_bytes
    assert compiler.compile_regex("a+", byte_vocab) is a
    assert compiler.compile_regex("b+", byte_vocab) is not b  # evicted, compiled again


def test_a_grammar_larger_than_the_budget_is_returned_but_not_kept(byte_vocab) -> None:
    compiler = constrain.GrammarCompiler(max_cache_bytes=1000)
    first = compiler.compile_regex("a+", byte_vocab)
    assert first.matcher().accept_bytes(b"aa")
    assert compiler.compile_regex("a+", byte_vocab) is not first
    assert compiler.cache_bytes <= 1000


def test_clear_empties_the_context_and_grammars_keep_working(byte_vocab) -> None:
    compiler = constrain.GrammarCompiler()
    old = compiler.compile_json_schema(SCHEMA, byte_vocab)
    assert compiler.cache_bytes > 0
    compiler.clear()
    assert compiler.cache_bytes == 0 and compiler.cache_entries == 0
    assert compiler.compile_json_schema(SCHEMA, byte_vocab) is not old
    m = old.matcher()
    assert m.accept_bytes(b'{"name":"x","n":3}') and m.accept_token(256) and m.is_terminated()


def test_growth_of_a_cached_grammar_counts_against_the_budget(byte_vocab) -> None:
    compiler = constrain.GrammarCompiler()
    compiled = compiler.compile_json_schema(SCHEMA, byte_vocab)
    before = compiler.cache_bytes
    walk_masks(compiled, b'{"name":"' + b"x" * 3000 + b'"}')  # new states, rows and masks
    assert compiler.cache_bytes > before


def test_two_contexts_share_nothing() -> None:
    """Walks made in one context are not seen by the other; clearing one leaves the other whole."""
    vocab = gpt2()
    one, two = constrain.GrammarCompiler(), constrain.GrammarCompiler()
    a = one.compile_json_schema(SCHEMA, vocab)
    walk_masks(a, b'{"name":"ab')
    entries = one.cache_entries
    b = two.compile_json_schema(SCHEMA, vocab)
    assert b is not a and b._automaton.trie is not a._automaton.trie
    assert b._automaton.table.signatures is not a._automaton.table.signatures
    walk_masks(b, b'{"name":"ab')
    assert one.cache_entries == entries
    two.clear()
    assert one.cache_entries == entries and one.compile_json_schema(SCHEMA, vocab) is a


def string_rule(chars: bytes, escaped: bytes) -> ir.Grammar:
    """``{`` string ``}`` with the string in a rule of its own: its body is a rule-free head whose
    walk grammars of one context share."""
    char = ir.alt(ir.byte_set(chars), ir.seq(ir.literal("\\"), ir.byte_set(escaped)))
    body = ir.seq(ir.literal('"'), ir.repeat(char), ir.literal('"'))
    return ir.Grammar({"start": ir.seq(ir.literal("{"), ir.ref("s"), ir.literal("}")), "s": body})


def test_walks_made_after_clear_never_serve_a_grammar_from_before() -> None:
    """After ``clear()`` structure ids start again: a grammar from before must not pick up the
    walk of another structure (same shape, other bytes) that got its ids. Its masks equal those
    of a fresh twin."""
    vocab = gpt2()
    compiler = constrain.GrammarCompiler()
    old = compiler.compile_grammar(string_rule(b"abcdefgh ", b"n"), vocab)
    compiler.clear()
    walk_masks(compiler.compile_grammar(string_rule(b"0123456789", b"t"), vocab), b'{"12')
    twin = constrain.GrammarCompiler().compile_grammar(string_rule(b"abcdefgh ", b"n"), vocab)
    for got, want in zip(walk_masks(old, b'{"ab c'), walk_masks(twin, b'{"ab c'), strict=True):
        assert np.array_equal(got, want)


def bounded_string(char_rule: str) -> ir.Grammar:
    """``string_rule`` with at most 19 characters, the character a rule named ``char_rule``."""
    char = ir.alt(ir.byte_set(b"abcdefghijklmnopqrstuvwxyz "), ir.seq(ir.literal("\\"), ir.byte_set(b"n")))
    body = ir.seq(ir.literal('"'), ir.repeat(ir.ref(char_rule), 0, 19), ir.literal('"'))
    return ir.Grammar({"start": ir.seq(ir.literal("{"), ir.ref("s"), ir.literal("}")), "s": body, char_rule: char})


def test_a_head_using_a_rule_is_walked_once_for_grammars_naming_the_rule_apart() -> None:
    """A rule's name is no part of the language: the head ``char{0,17} '"'`` walks the
    vocabulary once per context, and the grammar that did not walk it gets a fresh twin's masks."""
    vocab = gpt2()
    compiler = constrain.GrammarCompiler()
    a = compiler.compile_grammar(bounded_string("char"), vocab)
    b = compiler.compile_grammar(bounded_string("letter"), vocab)
    compiled = compiler.cache_entries
    walk_masks(a, b'{"ab')
    walked = compiler.cache_entries
    assert walked > compiled  # the head walks went to the context
    got = walk_masks(b, b'{"ab')
    assert compiler.cache_entries == walked  # and served the other grammar
    twin = constrain.GrammarCompiler().compile_grammar(bounded_string("letter"), vocab)
    for mask, want in zip(got, walk_masks(twin, b'{"ab'), strict=True):
        assert np.array_equal(mask, want)


def test_module_functions_use_the_replaceable_default(byte_vocab) -> None:
    previous = constrain.get_default_compiler()
    held = previous.cache_entries
    mine = constrain.GrammarCompiler()
    constrain.set_default_compiler(mine)
    try:
        compiled = constrain.compile_regex("[0-9]+", byte_vocab)
        assert mine.compile_regex("[0-9]+", byte_vocab) is compiled
        assert previous.cache_entries == held
    finally:
        constrain.set_default_compiler(previous)
    with pytest.raises(TypeError, match="set_default_compiler"):
        constrain.set_default_compiler(None)  # type: ignore[arg-type]


def test_byte_budget_cache_counts_and_weighs() -> None:
    cache = ByteBudgetCache(max_bytes=10_000, max_entries=3)
    for i in range(5):
        cache.put(i, np.zeros(100, np.int32))
    assert len(cache) == 3 and 0 not in cache and 4 in cache
    cache.put("big", np.zeros(4000, np.int32))  # 16 kB alone: over the bytes, not kept, evicts nothing
    assert "big" not in cache and len(cache) == 3 and cache.nbytes == 3 * 400
    cache.put("half", np.zeros(1500, np.int32))  # 6 kB: the oldest go until it fits
    assert "half" in cache and 2 not in cache and cache.nbytes <= 10_000
    with pytest.raises(ValueError, match="max_bytes"):
        ByteBudgetCache(max_bytes=-1)


def test_an_insertion_evicts_only_room_for_itself_and_settle_pays_the_rest() -> None:
    """Growth found over the budget is not paid by the next insertions (they run inside masks):
    each evicts only enough for itself. ``settle()`` pays it, ``SETTLE_EVICTIONS`` at a time."""
    cache = ByteBudgetCache(max_bytes=200_000)
    for i in range(100):
        cache.put(i, np.zeros(250, np.int32))  # 1 kB each: all fit
    cache.max_bytes = 10_000  # as if settling found 90 kB of growth
    for j in range(3):
        cache.put(("small", j), np.zeros(1, np.int32))
    assert len(cache) == 100 and 2 not in cache and 3 in cache  # one old entry per insertion
    cache.put("three kB", np.zeros(750, np.int32))
    assert len(cache) == 98 and 5 not in cache and 6 in cache  # three old entries made its room
    cache.settle()
    assert len(cache) == 98 - SETTLE_EVICTIONS and cache.nbytes > cache.max_bytes
    cache.settle()
    assert cache.nbytes <= cache.max_bytes and 99 in cache and "three kB" in cache


def test_growth_is_paid_at_the_next_compile(byte_vocab) -> None:
    """Masks that grow a grammar past the budget evict nothing (they run where latency hurts);
    the next compile pays the growth, beyond the room it makes for its own grammar."""
    probe = constrain.GrammarCompiler()
    probe.compile_regex("[0-9]{0,300}", byte_vocab)
    probe.compile_regex("[a-z]{0,2000}", byte_vocab)
    compiler = constrain.GrammarCompiler(max_cache_bytes=probe.cache_bytes + 100_000)  # the two fit
    old = compiler.compile_regex("[0-9]{0,300}", byte_vocab)
    grown = compiler.compile_regex("[a-z]{0,2000}", byte_vocab)
    entries = compiler.cache_entries
    walk_masks(grown, b"q" * 1500)  # new states, rows and masks: more than a new grammar weighs
    assert compiler.cache_bytes > compiler.max_cache_bytes and compiler.cache_entries == entries
    compiler.compile_regex("x", byte_vocab)  # its room alone is the old grammar's
    assert compiler.cache_bytes <= compiler.max_cache_bytes
    assert compiler.compile_regex("[0-9]{0,300}", byte_vocab) is not old
    assert compiler.compile_regex("[a-z]{0,2000}", byte_vocab) is not grown


def test_settle_weighs_the_values_in_use_and_a_few_others_in_turn() -> None:
    """Weighing hundreds of grammars at every compile doubled the p50 compile: each settle weighs
    the growing values fetched or inserted since the last one (in use, so growing) and
    ``SETTLE_REWEIGHS`` others, the least recently weighed first, so each is weighed again within
    len(growing) / SETTLE_REWEIGHS settles."""
    weighed: list[int] = []

    class Grows:
        def __init__(self, i: int) -> None:
            self.i, self.size = i, 100

        def estimated_bytes(self) -> int:
            weighed.append(self.i)
            return self.size

    values = [Grows(i) for i in range(3 * SETTLE_REWEIGHS)]
    cache = ByteBudgetCache(max_bytes=10**9)
    for v in values:
        cache.put(v.i, v)
    weighed.clear()
    cache.settle()  # every one was inserted since: all weighed
    assert weighed == [v.i for v in values]
    weighed.clear()
    for v in values:
        v.size = 1000
    cache.settle()
    assert weighed == list(range(SETTLE_REWEIGHS))
    weighed.clear()
    assert cache.get(len(values) - 1) is values[-1]
    cache.settle()  # the one fetched, then the next in turn
    assert weighed == [len(values) - 1, *range(SETTLE_REWEIGHS, 2 * SETTLE_REWEIGHS)]
    cache.settle()
    assert sorted(set(weighed) | set(range(SETTLE_REWEIGHS))) == list(range(len(values)))
    assert cache._nbytes == 1000 * len(values)


def test_cached_walks_are_weighed_by_their_arrays() -> None:
    """A head walk (a plain tuple) weighs at least its arrays and paths."""
    walk = (np.zeros(1000, np.int32), np.zeros(500, np.int32), np.zeros(500, np.int64), (b"ab", b"c"))
    assert nbytes_of(walk) >= 4000 + 2000 + 4000 + 3


def test_an_idle_grammars_masks_and_head_walks_are_not_tracked_by_the_collector() -> None:
    """Each of Python's full collections visits every entry of every container it tracks: with
    hundreds of grammars cached (their masks in OrderedDicts, a dataclass per head walk) that was
    tens of ms, inside whichever mask it landed in. Masks and head walks are arrays, bytes and
    plain tuples in plain dicts, which a full collection stops tracking."""
    compiled = constrain.GrammarCompiler().compile_json_schema(
        {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["alpha", "beta"]}}}}, gpt2())
    walk_masks(compiled, b'{"tags":["alpha","beta","alpha"]}')
    automaton = compiled._automaton
    caches = {"masks": automaton._masks, "head walks": automaton._heads._entries,
              "their sizes": automaton._heads._sizes, "head states": automaton._head_states._entries,
              "narrow heads": automaton._narrow_seen}
    assert len(automaton._masks) > 10 and len(automaton._heads) > 0
    for _ in range(2):  # a tuple holding another is let go only once the inner one is
        gc.collect()
    assert [name for name, cache in caches.items() if gc.is_tracked(cache)] == []
