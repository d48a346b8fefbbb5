"""Built-in Lark grammars on real tokenizers, with lark's own Earley parser as the oracle.

Sound: random constrained walks end in strings lark parses. Complete: valid strings (hand-written
and sampled from lark's rules) are accepted token by token in the tokenizer's own encoding.
"""

from __future__ import annotations

import json
import random
from functools import cache

import lark
import numpy as np
import pytest
from support.lark_sampling import LarkSampler

import constrain
from constrain import tokenizers
from constrain.grammars.builtin import builtin_grammar, load, names, tool_call_grammar
from constrain.grammars.errors import GrammarError
from constrain.grammars.lark_frontend import BUILTIN_DIR

GRAMMARS = ("json", "sql_select", "expr", "tool_call")
TOKENIZERS = {
    "llama3": (tokenizers.llama3, lambda s: tokenizers.llama3_tokenizer().encode(s, bos=False, eos=False)),
    "gpt2": (tokenizers.gpt2, lambda s: tokenizers.gpt2_tokenizer().encode(s)),
    "tekken": (tokenizers.tekken, lambda s: tokenizers.tekken_tokenizer().encode(s, bos=False, eos=False)),
}
WALK_TOKENIZERS = ("llama3", "gpt2")
WALKS = 5
SOFT_CAP, HARD_CAP = 16, 48
CLOSERS = set(b")]}\"';")


@cache
def oracle(name: str) -> lark.Lark:
    return lark.Lark(load(name), parser="earley", lexer="dynamic", import_paths=[str(BUILTIN_DIR)])


def lark_accepts(name: str, text: str) -> bool:
    try:
        oracle(name).parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


@cache
def compiled(name: str, tok: str) -> constrain.CompiledGrammar:
    return constrain.compile_grammar(builtin_grammar(name), TOKENIZERS[tok][0]())


def test_names_and_text():
    assert set(GRAMMARS) <= set(names())
    assert "object" in load("json")
    with pytest.raises(GrammarError, match="no built-in grammar"):
        load("nope")


# ------------------------------------------------------------------------------------ sound

def allowed_ids(matcher, tokens_left: int) -> list[int]:
    bits = constrain.allocate_token_bitmask(1, matcher._automaton.vocab.vocab_size)
    matcher.fill_next_token_bitmask(bits, 0, tokens_left=tokens_left)
    flags = np.unpackbits(bits.numpy().view(np.uint8), bitorder="little")
    return [int(t) for t in np.nonzero(flags)[0]]


def walk(matcher, vocab, rng: random.Random) -> bytes | None:
    """A random constrained walk, closed within HARD_CAP tokens by the budget-aware mask.

    Short (one-byte) tokens, punctuation above all, are favoured so that walks visit structure;
    past SOFT_CAP the walk stops as soon as it may and otherwise prefers closing punctuation.
    """
    eos = vocab.eos_token_ids[0]
    out = b""
    for step in range(HARD_CAP):
        allowed = allowed_ids(matcher, HARD_CAP - step)
        assert allowed, f"dead end after {out!r}"
        can_stop = any(t in vocab.eos_token_ids for t in allowed)
        real = [t for t in allowed if t not in vocab.eos_token_ids]
        if can_stop and (not real or step >= SOFT_CAP or rng.random() < 0.25):
            assert matcher.accept_token(eos) and matcher.is_terminated()
            return out
        short = [t for t in real if len(vocab.token_bytes[t]) == 1]
        if step >= SOFT_CAP and short:
            closing = [t for t in short if vocab.token_bytes[t][0] in CLOSERS]
            pool = closing or [t for t in short if vocab.token_bytes[t].isalnum()] or short
        else:
            r = rng.random()
            if short and r < 0.35:
                pool = [t for t in short if not vocab.token_bytes[t].isalnum()] or short
            elif short and r < 0.6:
                pool = short
            else:
                pool = real
        tok = rng.choice(pool)
        assert matcher.accept_token(tok)
        out += vocab.token_bytes[tok]
    return None


@pytest.mark.parametrize("tok", WALK_TOKENIZERS)
@pytest.mark.parametrize("name", GRAMMARS)
def test_random_walks_parse_with_lark(name, tok):
    vocab = TOKENIZERS[tok][0]()
    grammar = compiled(name, tok)
    rng = random.Random(f"{name}/{tok}")
    finished = []
    for _ in range(WALKS):
        data = walk(grammar.matcher(), vocab, rng)
        if data is not None:
            finished.append(data)
    assert len(finished) == WALKS, f"only {len(finished)} of {WALKS} walks finished"
    failures = [d for d in finished if not lark_accepts(name, d.decode("utf-8"))]
    assert not failures, failures[:3]


# --------------------------------------------------------------------------------- complete

HAND_WRITTEN = {
    "json": [
        '0', '-0.5e+10', '"a\\u00e9\\n\\"x\\""', 'true', 'null', '[]', '{}', '[ ]', '{ }',
        '{"a": [1, 2.5, {"b": null}], "c": "d\u00e9\u4e2d\U0001f600"}',
        json.dumps({"k": [1, {"x": [True, False, None]}], "s": "t"}, indent=2),
        json.dumps([[1, 2], {"a": "b"}], indent=4),
        '\n  [1,2]\n', '{"a":{"b":{"c":[[[]]]}}}',
    ],
    "sql_select": [
        "SELECT * FROM t",
        "select a, b AS c FROM t1 AS x LEFT OUTER JOIN t2 ON x.id = t2.id WHERE a > 1 AND NOT b IS NULL "
        "GROUP BY a HAVING count(*) > 2 ORDER BY a DESC, b LIMIT 10 OFFSET 5;",
        "SELECT DISTINCT name FROM users WHERE age BETWEEN 18 AND 65 OR name LIKE 'A%'",
        "SELECT u.name, COUNT(DISTINCT o.id) AS n\nFROM users u\n  JOIN orders o ON o.user_id = u.id\n"
        "WHERE o.total >= 100.5 AND o.status NOT IN ('cancelled', 'it''s')\nGROUP BY u.name\n"
        "ORDER BY n DESC\nLIMIT 3",
        "SELECT x FROM (SELECT 1 AS x FROM dual) AS sub WHERE -x < (2 + 3) * 4",
        "SELECT t.* FROM t, u WHERE t.a <> u.b",
    ],
    "expr": [
        "1", "x", "1 + 2 * 3", "(1 + 2) * 3", "-x ** -2 ** 3", "f(x, y)(z)", "a // b % c / d",
        '!a && b || c == "s\\"t"', "1.5e-3 <= g()", "  max(1,\n  2) != null  ", "true&&false",
    ],
    "tool_call": [
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
        '{"name":"f","arguments":{}}',
        '{\n  "name": "search",\n  "arguments": {\n    "q": "x",\n    "n": [1, 2]\n  }\n}',
    ],
}
SAMPLES = 10
MAX_SAMPLE_CHARS = 200


@cache
def corpus(name: str) -> tuple[str, ...]:
    sampler = LarkSampler(oracle(name))
    rng = random.Random(name)
    out = list(HAND_WRITTEN[name])
    tries = 0
    while len(out) < len(HAND_WRITTEN[name]) + SAMPLES and tries < 20 * SAMPLES:
        tries += 1
        text = sampler.sample(rng, max_depth=rng.randint(2, 7))
        if len(text) <= MAX_SAMPLE_CHARS:
            out.append(text)
    return tuple(out)


@pytest.mark.parametrize("name", GRAMMARS)
def test_corpus_is_valid_for_lark(name):
    bad = [text for text in corpus(name) if not lark_accepts(name, text)]
    assert not bad


@pytest.mark.parametrize("tok", TOKENIZERS)
@pytest.mark.parametrize("name", GRAMMARS)
def test_corpus_accepted_token_by_token(name, tok):
    vocab, encode = TOKENIZERS[tok][0](), TOKENIZERS[tok][1]
    grammar = compiled(name, tok)
    for text in corpus(name):
        matcher = grammar.matcher()
        ids = encode(text)
        for i, t in enumerate(ids):
            assert matcher.accept_token(t), (text, i, vocab.token_bytes[t])
        assert matcher.accept_token(vocab.eos_token_ids[0]), text


def test_rejects_what_lark_rejects():
    vocab = tokenizers.gpt2()
    encode = TOKENIZERS["gpt2"][1]
    for name, text in [("json", "[1,]"), ("json", "[1 2]"), ("json", "{\"a\" 1}"), ("json", "01"),
                       ("json", "[" + " " * 21 + "1]"), ("sql_select", "SELECT aFROM t"),
                       ("sql_select", "SELECT a FROM"), ("expr", "1 +"), ("expr", "a == b == c"),
                       ("tool_call", '{"name": "f"}')]:
        assert not lark_accepts(name, text)
        matcher = compiled(name, "gpt2").matcher()
        ok = all(matcher.accept_token(t) for t in encode(text)) and matcher.accept_token(vocab.eos_token_ids[0])
        assert not ok, (name, text)


# --------------------------------------------------------------------------- deep recursion

@pytest.mark.parametrize("text", [
    pytest.param("[" * 1000 + "]" * 1000, id="1000-deep"),
    pytest.param("[" + ", ".join(str(i) for i in range(10_000)) + "]", id="10000-items"),
])
def test_json_deep_and_long(text):
    vocab, encode = TOKENIZERS["llama3"][0](), TOKENIZERS["llama3"][1]
    matcher = compiled("json", "llama3").matcher()
    ids = encode(text)
    for i, t in enumerate(ids):
        assert matcher.accept_token(t), i
    assert not matcher.accept_token(encode("]")[0])
    assert matcher.accept_token(vocab.eos_token_ids[0])


# ------------------------------------------------------------------------------- tool calls

TOOLS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                    "required": ["city"], "additionalProperties": False},
    "add": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"], "additionalProperties": False},
}


def test_tool_call_grammar_binds_names_to_schemas():
    pytest.importorskip("constrain.grammars.json_schema")
    try:
        grammar = tool_call_grammar(TOOLS)
    except ImportError:
        pytest.skip("JSON Schema front end not there yet")
    compiled_tools = constrain.compile_grammar(grammar, tokenizers.gpt2())
    vocab, encode = tokenizers.gpt2(), TOKENIZERS["gpt2"][1]

    def accepts(text: str) -> bool:
        m = compiled_tools.matcher()
        return all(m.accept_token(t) for t in encode(text)) and m.accept_token(vocab.eos_token_ids[0])

    good = [{"name": "get_weather", "arguments": {"city": "Paris"}},
            {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}},
            {"name": "add", "arguments": {"a": 1, "b": 2.5}}]
    bad = [{"name": "get_weather", "arguments": {"a": 1, "b": 2}},
           {"name": "add", "arguments": {"city": "Paris"}},
           {"name": "other", "arguments": {}},
           {"name": "add", "arguments": {"a": 1}}]
    for call in good:
        arguments = json.dumps(call["arguments"], separators=(",", ":"))
        text = f'{{"name": {json.dumps(call["name"])}, "arguments": {arguments}}}'
        assert lark_accepts("tool_call", text)
        assert accepts(text), text
    for call in bad:
        assert not accepts(json.dumps(call, separators=(",", ":"))), call
    flexible = constrain.compile_grammar(tool_call_grammar(TOOLS, whitespace="flexible"), vocab).matcher()
    assert all(flexible.accept_token(t) for t in encode(json.dumps(good[0])))
    with pytest.raises(GrammarError):
        tool_call_grammar({})
