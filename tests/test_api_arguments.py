"""Bad arguments to the public API get a TypeError or ValueError naming the argument (issue 11,
defect 13), never a silent write, another state's answer or an error from deep inside."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import constrain

EOS = 256


@pytest.fixture(scope="module")
def grammar(byte_vocab: constrain.Vocabulary) -> constrain.CompiledGrammar:
    return constrain.compile_regex("ab*", byte_vocab)


@pytest.fixture()
def matcher(grammar: constrain.CompiledGrammar) -> constrain.Matcher:
    return grammar.matcher()


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.float16, torch.int64])
def test_bitmask_of_another_dtype(matcher, dtype) -> None:
    bitmask = torch.zeros((1, 9), dtype=dtype)
    with pytest.raises(TypeError, match=r"bitmask must have dtype torch.int32.*" + str(dtype).split(".")[-1]):
        matcher.fill_next_token_bitmask(bitmask, 0)
    assert not bitmask.any()  # nothing written


def test_bitmask_of_three_dimensions(matcher) -> None:
    with pytest.raises(ValueError, match=r"bitmask must be 2-D .*\(1, 1, 9\)"):
        matcher.fill_next_token_bitmask(torch.zeros((1, 1, 9), dtype=torch.int32), 0)


def test_bitmask_row_narrower_than_the_vocabulary(matcher) -> None:
    """257 tokens need 9 words; 8 would lose the EOS word."""
    with pytest.raises(ValueError, match="8 words but the vocabulary needs 9"):
        matcher.fill_next_token_bitmask(torch.zeros((1, 8), dtype=torch.int32), 0)


def test_wider_bitmask_rows_are_padded_with_zeros(matcher) -> None:
    bitmask = torch.full((1, 12), -1, dtype=torch.int32)
    matcher.fill_next_token_bitmask(bitmask, 0)
    assert not bitmask[0, 9:].any() and bitmask[0, :9].any()


def test_numpy_int32_bitmask_is_filled_like_a_tensor(matcher) -> None:
    array = np.full((2, 9), -1, dtype=np.int32)
    tensor = constrain.allocate_token_bitmask(2, 257)
    matcher.fill_next_token_bitmask(array, 1)
    matcher.fill_next_token_bitmask(tensor, 1)
    assert np.array_equal(array, tensor.numpy())
    assert (array[0] == -1).all()  # the other row untouched


@pytest.mark.parametrize("layout", ["columns of a wider tensor", "transposed", "rows of a wider tensor"])
def test_tensor_views_are_filled_like_a_contiguous_tensor(matcher, layout) -> None:
    """A CPU tensor's row is written through its address: a view's offset and row stride must be
    honoured, and a view whose words are not adjacent must not be written as if they were."""
    base = torch.full((3, 20), -1, dtype=torch.int32)
    if layout == "columns of a wider tensor":
        view = base[:, 4:14]
    elif layout == "transposed":
        base = torch.full((10, 3), -1, dtype=torch.int32)
        view = base.t()
    else:
        view = base[1:, :]
    before = base.clone()
    expected = np.full((view.shape[0], view.shape[1]), -1, dtype=np.int32)
    matcher.fill_next_token_bitmask(expected, 1)
    matcher.fill_next_token_bitmask(view, 1)
    assert np.array_equal(view.numpy(), expected)
    outside = torch.ones_like(base, dtype=torch.bool)
    outside_view = outside[:, 4:14] if layout == "columns of a wider tensor" else (
        outside.t() if layout == "transposed" else outside[1:, :])
    outside_view[1] = False
    assert torch.equal(base[outside], before[outside])  # nothing written outside the row


def test_numpy_bitmask_of_another_dtype(matcher) -> None:
    with pytest.raises(TypeError, match="bitmask must have dtype int32.*float64"):
        matcher.fill_next_token_bitmask(np.zeros((1, 9)), 0)


def test_bitmask_of_another_type(matcher) -> None:
    with pytest.raises(TypeError, match="bitmask must be an int32 torch.Tensor or numpy array, got list"):
        matcher.fill_next_token_bitmask([[0] * 9], 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("row", [2, -1])
def test_bitmask_row_index_out_of_range(matcher, row) -> None:
    with pytest.raises(ValueError, match=rf"fill_next_token_bitmask\(index\)={row} is outside \[0, 2\)"):
        matcher.fill_next_token_bitmask(constrain.allocate_token_bitmask(2, 257), row)


def test_bitmask_row_index_of_another_type(matcher) -> None:
    with pytest.raises(TypeError, match=r"fill_next_token_bitmask\(index\) must be an int"):
        matcher.fill_next_token_bitmask(constrain.allocate_token_bitmask(2, 257), 0.0)  # type: ignore[arg-type]


def test_negative_tokens_left(matcher) -> None:
    with pytest.raises(ValueError, match=r"tokens_left\)=-1 must be >= 0"):
        matcher.fill_next_token_bitmask(constrain.allocate_token_bitmask(1, 257), 0, tokens_left=-1)


def test_terminated_state_has_no_mask(grammar) -> None:
    m = grammar.matcher()
    assert m.accept_bytes(b"a") and m.accept_token(EOS) and m.state == -2
    with pytest.raises(ValueError, match=r"state_mask\(state\)=-2 is the state after a stop token"):
        grammar.state_mask(m.state)


@pytest.mark.parametrize("verb", ["state_mask", "state_transitions", "is_accepting"])
@pytest.mark.parametrize("state", [-1, 10**6])
def test_state_ids_out_of_range(grammar, verb, state) -> None:
    with pytest.raises(ValueError, match=rf"CompiledGrammar.{verb}\(state\)={state} is outside \[0, "):
        getattr(grammar, verb)(state)


def test_state_id_of_another_type(grammar) -> None:
    with pytest.raises(TypeError, match=r"next_state\(state\) must be an int, got str"):
        grammar.next_state("1", 97)  # type: ignore[arg-type]


def test_next_state_token_out_of_range(grammar) -> None:
    with pytest.raises(ValueError, match=r"next_state\(token\)=257 is outside \[0, 257\)"):
        grammar.next_state(grammar.initial_state, 257)


def test_numpy_integers_are_ids_too(grammar, matcher) -> None:
    assert matcher.accept_token(np.int64(97))
    assert grammar.next_state(np.int32(grammar.initial_state), np.uint8(97)) > 0  # type: ignore[arg-type]


def test_compile_regex_of_none(byte_vocab) -> None:
    with pytest.raises(TypeError, match=r"compile_regex\(pattern\) must be a str, got NoneType"):
        constrain.compile_regex(None, byte_vocab)  # type: ignore[arg-type]


def test_compile_lark_of_none(byte_vocab) -> None:
    with pytest.raises(TypeError, match=r"compile_lark\(text\) must be the grammar's text \(str\), got NoneType"):
        constrain.compile_lark(None, byte_vocab)  # type: ignore[arg-type]


def test_compile_json_schema_of_a_list(byte_vocab) -> None:
    with pytest.raises(TypeError, match=r"compile_json_schema\(schema\) must be a dict, a bool or JSON text"):
        constrain.compile_json_schema([{"type": "string"}], byte_vocab)  # type: ignore[arg-type]


def test_compile_with_no_vocabulary() -> None:
    with pytest.raises(TypeError, match=r"compile_regex\(vocab\) must be a constrain.Vocabulary"):
        constrain.compile_regex("a", ["a"])  # type: ignore[arg-type]


def test_compile_with_a_budget_of_another_type(byte_vocab) -> None:
    with pytest.raises(TypeError, match=r"compile_regex\(budget\) must be a constrain.CompileBudget"):
        constrain.compile_regex("a", byte_vocab, budget=10)  # type: ignore[arg-type]


def test_accept_token_of_none(matcher) -> None:
    with pytest.raises(TypeError, match=r"accept_token\(token_id\) must be an int, got NoneType"):
        matcher.accept_token(None)  # type: ignore[arg-type]
    assert matcher.state == matcher.fork().state and not matcher.is_terminated()


@pytest.mark.parametrize("token", [-1, 257])
def test_accept_token_outside_the_vocabulary(matcher, token) -> None:
    with pytest.raises(ValueError, match=rf"accept_token\(token_id\)={token} is outside \[0, 257\)"):
        matcher.accept_token(token)


def test_accept_bytes_of_a_list(matcher) -> None:
    with pytest.raises(TypeError, match=r"accept_bytes\(data\) must be bytes, got list"):
        matcher.accept_bytes([300])  # type: ignore[arg-type]


def test_accept_bytes_of_a_str(matcher) -> None:
    with pytest.raises(TypeError, match=r"accept_bytes\(data\) must be bytes, got str"):
        matcher.accept_bytes("ab")  # type: ignore[arg-type]


def test_rollback_of_another_type(matcher) -> None:
    with pytest.raises(TypeError, match=r"rollback\(num_tokens\) must be an int"):
        matcher.rollback("1")  # type: ignore[arg-type]


@pytest.mark.parametrize("option, value", [("max_whitespace", -1), ("max_whitespace", "4"),
                                           ("max_recursion_depth", -2), ("whitespace", "pretty"),
                                           ("format_mode", "strict"), ("property_order", "sorted")])
def test_json_schema_option_out_of_its_range(byte_vocab, option, value) -> None:
    with pytest.raises(ValueError, match=rf"json_schema_to_grammar\({option}\) must be"):
        constrain.compile_json_schema({"type": "string"}, byte_vocab, **{option: value})


def test_compiler_cache_bytes_of_another_type() -> None:
    with pytest.raises(ValueError, match=r"GrammarCompiler\(max_cache_bytes\) must be a non-negative int"):
        constrain.GrammarCompiler(max_cache_bytes=-1)
