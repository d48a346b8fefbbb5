// The vocabulary as a packed byte trie: one 8-byte node per trie node, in depth-first order.
//
// Depth-first order puts a node's whole subtree right after it, so a walk is one flat loop over
// the node array that either steps into a node (its byte is allowed) or jumps over its subtree
// (the subtree size is in the node). A node also stores its depth, so the state a node is entered
// from is read off a per-depth stack: no explicit pops. The layout follows llguidance's toktrie.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace constrain {

struct TrieNode {
    uint32_t token_byte;  // token id (24 bits; NO_TOKEN, or n_ids + group for duplicates) << 8 | byte
    uint32_t size_depth;  // subtree size including the node (24 bits) << 8 | depth (root: 0)

    uint8_t byte() const { return token_byte & 0xff; }
    uint32_t token() const { return token_byte >> 8; }
    uint32_t subtree_size() const { return size_depth >> 8; }
    uint32_t depth() const { return size_depth & 0xff; }
};

// Rows of a byte transition table: rows[s * 256 + b] is the state after byte b from state s
// (0: dead); done[s] says whether row s has been filled and nullable[s], for a filled row, whether
// state s may end there. Rows of states >= n_states are missing.
struct RowTable {
    const int32_t* rows;
    const bool* done;
    const bool* nullable;
    size_t n_states;

    bool has_row(int32_t s) const { return static_cast<size_t>(s) < n_states && done[s]; }
};

// A byte set's slice of the vocabulary (llguidance's slicer, for any state that loops on many
// bytes): the tokens made of those bytes only, as mask words, and the exit nodes, those whose own
// byte is outside the set and all of whose ancestors' bytes are inside it, in depth-first order.
// From a state that every byte of the set leads back to, a walk sets the slice's words and walks
// only below the exit nodes, each entered from that state.
struct Slice {
    std::vector<uint32_t> words;
    std::vector<int32_t> exits;
};

// Where a walk of a head alone may cross into a tail: every node (live or not) entered from a
// state that may end there, with that state, in depth-first order.
struct Ends {
    std::vector<int32_t> nodes;
    std::vector<int32_t> states;
};

// The tokens a walk allows and the state each leads to, in depth-first (byte) order. The buffers
// are left uninitialised up to the trie's token count (zeroing them would cost more than a sparse
// walk) and cut to size when the walk allowed few tokens.
struct WalkResult {
    std::unique_ptr<int32_t[]> tokens;
    std::unique_ptr<int32_t[]> states;
    size_t size = 0;

    explicit WalkResult(size_t capacity) : tokens(new int32_t[capacity]), states(new int32_t[capacity]) {}

    void shrink_to(size_t capacity) {
        if (size * 2 >= capacity) return;
        for (auto* buffer : {&tokens, &states}) {
            std::unique_ptr<int32_t[]> exact(new int32_t[size]);
            std::memcpy(exact.get(), buffer->get(), size * sizeof(int32_t));
            *buffer = std::move(exact);
        }
    }
};

class PackedTrie {
public:
    static constexpr uint32_t NO_TOKEN = 0xffffff;
    static constexpr uint32_t MAX_DEPTH = 0xff;
    static constexpr uint32_t MAX_NODES = 0xffffff;

    // The trie of the ids whose bytes are non-empty; token_bytes[i] empty means "no bytes".
    // Throws std::length_error when a token is longer than MAX_DEPTH bytes or the trie too large.
    explicit PackedTrie(const std::vector<std::string_view>& token_bytes);

    size_t node_count() const { return nodes_.size(); }
    size_t token_count() const { return n_tokens_; }
    uint32_t id_count() const { return n_ids_; }
    uint32_t max_depth() const { return max_depth_; }
    const std::vector<TrieNode>& nodes() const { return nodes_; }

    // Every token allowed from `start` through `table`. `fill(state)` is called for a state whose
    // row is missing, before the walk reads it, and returns the (possibly reallocated) table.
    // Thread-safe: the trie is immutable, a walk's state is local.
    template <class Fill>
    WalkResult walk(int32_t start, RowTable table, Fill&& fill) const;

    // The same tokens as bits: words[t / 32] bit t % 32 set for each (words: ceil(ids / 32), zeroed).
    // With `ends`, also where the walk may cross into a tail (see Ends). With `slice`, the caller
    // promises that every byte of the slice's set leads `start` back to itself and, with `ends`,
    // that `start` may not end there (no node entered from it is an end).
    template <class Fill>
    void mask(int32_t start, RowTable table, Fill&& fill, uint32_t* words, Ends* ends, const Slice* slice) const;

    // The slice of the byte set `bytes` (flags per byte).
    Slice slice(const bool* bytes) const;

    // Tokens allowed below each of `nodes` (each with its subtree), entered from the state
    // `parents[i]` at the node's parent, ORed into `words`. Nodes must not lie in each other's subtrees.
    template <class Fill>
    void mask_below(const int32_t* nodes, const int32_t* parents, size_t count, RowTable table, Fill&& fill,
                    uint32_t* words) const;

    // Positions in `nodes` (depth-first order) of those whose byte is in `bytes` (flags per byte)
    // and that lie in the subtree of no earlier such node.
    std::vector<int32_t> outermost(const int32_t* nodes, size_t count, const bool* bytes) const;

    // The bytes from the root to `node`, inclusive.
    std::string path(uint32_t node) const;

private:
    template <bool Enter, class Fill, class Visit, class EnterFn>
    void walk_range(size_t p, size_t end, int32_t* stack, RowTable& table, Fill& fill, Visit& visit,
                    EnterFn& enter) const;

    // A visit that sets the bits of a node's tokens (none, one, or a duplicate group) in `words`.
    auto bit_setter(uint32_t* words) const {
        return [this, words](uint32_t tok, int32_t) {
            if (tok < n_ids_) {
                words[tok >> 5] |= 1u << (tok & 31);
            } else if (tok != NO_TOKEN) {
                for (uint32_t i = group_start_[tok - n_ids_]; i < group_start_[tok - n_ids_ + 1]; ++i) {
                    const auto t = static_cast<uint32_t>(group_tokens_[i]);
                    words[t >> 5] |= 1u << (t & 31);
                }
            }
        };
    }

    std::vector<TrieNode> nodes_;
    std::vector<uint32_t> group_start_;  // duplicate group g: group_tokens_[group_start_[g] .. [g+1])
    std::vector<int32_t> group_tokens_;
    uint32_t n_ids_ = 0;
    size_t n_tokens_ = 0;
    uint32_t max_depth_ = 0;
};

// One flat loop over the nodes [p, end), entering each node from the state on the per-depth stack
// at its parent's depth (the caller sets the entry for the range's first node). `visit(token, next)`
// is called for every live node, `enter(node, parent)` for every node met (live or not) when
// `Enter` is true; a dead node's subtree is skipped.
template <bool Enter, class Fill, class Visit, class EnterFn>
void PackedTrie::walk_range(size_t p, size_t end, int32_t* stack, RowTable& table, Fill& fill, Visit& visit,
                            EnterFn& enter) const {
    const TrieNode* nodes = nodes_.data();
    while (p < end) {
        const TrieNode n = nodes[p];
        const uint32_t d = n.depth();
        const int32_t parent = stack[d - 1];
        if constexpr (Enter) enter(p, parent, table);
        const int32_t next = table.rows[static_cast<size_t>(parent) * 256 + n.byte()];
        if (next == 0) {
            p += n.subtree_size();
            continue;
        }
        visit(n.token(), next);
        if (n.subtree_size() > 1) {
            stack[d] = next;
            if (__builtin_expect(!table.has_row(next), 0)) table = fill(next);
        }
        ++p;
    }
}

template <class Fill>
WalkResult PackedTrie::walk(int32_t start, RowTable table, Fill&& fill) const {
    WalkResult out(n_tokens_ + 1);  // +1: the slot a node without a token writes to
    int32_t* tok_out = out.tokens.get();
    int32_t* st_out = out.states.get();
    size_t k = 0;
    const uint32_t n_groups = static_cast<uint32_t>(group_start_.size()) - 1;
    auto visit = [&](uint32_t tok, int32_t next) {
        // Written unconditionally, kept only for a real token: one branch less in the hot loop.
        tok_out[k] = static_cast<int32_t>(tok);
        st_out[k] = next;
        k += tok < n_ids_;
        if (__builtin_expect(tok - n_ids_ < n_groups, 0)) {
            for (uint32_t i = group_start_[tok - n_ids_]; i < group_start_[tok - n_ids_ + 1]; ++i) {
                tok_out[k] = group_tokens_[i];
                st_out[k++] = next;
            }
        }
    };
    auto none = [](size_t, int32_t, const RowTable&) {};
    int32_t stack[MAX_DEPTH + 1];
    stack[0] = start;
    if (!table.has_row(start)) table = fill(start);
    walk_range<false>(1, nodes_.size(), stack, table, fill, visit, none);
    out.size = k;
    out.shrink_to(n_tokens_);
    return out;
}

template <class Fill>
void PackedTrie::mask(int32_t start, RowTable table, Fill&& fill, uint32_t* words, Ends* ends, const Slice* slice) const {
    auto visit = bit_setter(words);
    int32_t stack[MAX_DEPTH + 1];
    if (!table.has_row(start)) table = fill(start);
    auto none = [](size_t, int32_t, const RowTable&) {};
    auto enter = [ends](size_t node, int32_t parent, const RowTable& t) {
        if (t.nullable[parent]) {  // the parent's row is filled: the walk read it to get here
            ends->nodes.push_back(static_cast<int32_t>(node));
            ends->states.push_back(parent);
        }
    };
    // The whole trie, or only below the slice's exits: either way ranges of nodes entered from start.
    auto walk = [&](size_t begin, size_t end) {
        stack[nodes_[begin].depth() - 1] = start;
        if (ends == nullptr)
            walk_range<false>(begin, end, stack, table, fill, visit, none);
        else
            walk_range<true>(begin, end, stack, table, fill, visit, enter);
    };
    if (slice == nullptr) {
        if (nodes_.size() > 1) walk(1, nodes_.size());
        return;
    }
    for (size_t i = 0; i < slice->words.size(); ++i) words[i] |= slice->words[i];
    for (const int32_t exit : slice->exits) walk(static_cast<size_t>(exit), exit + nodes_[exit].subtree_size());
}

template <class Fill>
void PackedTrie::mask_below(const int32_t* nodes, const int32_t* parents, size_t count, RowTable table, Fill&& fill,
                            uint32_t* words) const {
    auto visit = bit_setter(words);
    auto none = [](size_t, int32_t, const RowTable&) {};
    int32_t stack[MAX_DEPTH + 1];
    for (size_t i = 0; i < count; ++i) {
        const auto node = static_cast<size_t>(nodes[i]);
        const uint32_t d = nodes_[node].depth();
        stack[d - 1] = parents[i];
        if (!table.has_row(parents[i])) table = fill(parents[i]);
        walk_range<false>(node, node + nodes_[node].subtree_size(), stack, table, fill, visit, none);
    }
}

}  // namespace constrain
