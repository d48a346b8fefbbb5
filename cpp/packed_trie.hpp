// The vocabulary as a packed byte trie: one 8-byte node per trie node, in depth-first order.
//
// Depth-first order puts a node's whole subtree right after it, so a walk is one flat loop over
// the node array that either steps into a node (its byte is allowed) or jumps over its subtree
// (the subtree size is in the node). A node also stores its depth, so the state a node is entered
// from is read off a per-depth stack: no explicit pops. The layout follows llguidance's toktrie.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
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

// A region's slice of the vocabulary (llguidance's slicer, generalised): what lets a walk skip the
// subtree of a node it entered in a state T from which most bytes keep to a few states (a string
// body: T loops on the characters, a UTF-8 lead byte goes to a state that expects continuation
// bytes and returns to T). The region is a small automaton over those states, 0 being T:
// next[q * 256 + b] is the state after byte b, or -1 where the walk leaves it. Below a node
// entered in (the real state of) a region state, every token whose further bytes keep to the
// region is allowed at once (every region state is live), and only the subtrees of the nodes where
// the bytes leave it are walked, each entered from the real state of its parent. Grammars share a
// slice: string bodies make the same region everywhere.
//
// The relative part serves a node of depth >= 1 entered in the real state of a region state (a
// key's first bytes, an opening quote, a UTF-8 lead byte): the region is run from the state the
// first byte leads state 0 to (0 where the byte leaves the region); depth-first order keeps the
// entries below a node contiguous. The root part serves the state T itself: the region run from
// the root.
struct Slice {
    std::vector<int8_t> next;          // states * 256
    std::vector<uint32_t> words;       // root part: the tokens that keep to the region
    std::vector<int32_t> root_exits;   // root part: the nodes where the bytes leave it ...
    std::vector<int8_t> root_exit_from;  // ... and the region state of their parents
    std::vector<int32_t> token_nodes;  // relative part: nodes of depth >= 2 of the tokens that keep to it ...
    std::vector<int32_t> token_ids;    // ... and their ids (a duplicate group: one entry per id) ...
    std::vector<uint32_t> token_words;  // ... and as mask words
    std::vector<int32_t> exits;        // relative part: nodes of depth >= 2 where the bytes leave it ...
    std::vector<int8_t> exit_from;     // ... and the region state of their parents

    // The region state the relative part takes after the first byte `b`: the one `b` leads state
    // 0 to, or 0 where `b` leaves the region (an opening quote: the walk checks the real state).
    int8_t first_state(uint8_t b) const { return next[b] < 0 ? 0 : next[b]; }

    size_t nbytes() const {
        return sizeof(Slice) + next.size() + (words.size() + token_words.size()) * 4 + root_exits.size() * 5 +
               (token_nodes.size() + token_ids.size()) * 4 + exits.size() * 5;
    }
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
    // row is missing, before the walk reads it, and returns the (possibly reallocated) table;
    // where `fill.steps()`, a state may be left without one and `fill.step(state, byte)` gives
    // the entry its row would hold (0: dead), `fill.nullable(state)` its nullable flag.
    // Thread-safe: the trie is immutable, a walk's state is local.
    template <class Fill>
    WalkResult walk(int32_t start, RowTable table, Fill&& fill) const;

    // The same tokens as bits: words[t / 32] bit t % 32 set for each (words: ceil(ids / 32), zeroed).
    // With `ends`, also where the walk may cross into a tail (see Ends). With `slices`, a state the
    // start leads to (or the start itself) that loops on at least MIN_SLICE_BYTES bytes lends the
    // slice of its region to the walk (see Slice): the same tokens, fewer nodes walked.
    template <class Fill>
    void mask(int32_t start, RowTable table, Fill&& fill, uint32_t* words, Ends* ends, bool slices) const;

    // The slice of the region `next` (see Slice), made once and kept (the last MAX_SLICES).
    std::shared_ptr<const Slice> slice(const std::vector<int8_t>& next) const;

    // Bytes held: the nodes, the duplicate groups and the slices kept.
    size_t nbytes() const;

    // A state loops on at least this many bytes to lend a slice (fewer: its walk is short anyway).
    static constexpr int MIN_SLICE_BYTES = 16;
    static constexpr int MAX_REGION_STATES = 16;
    static constexpr size_t MAX_SLICES = 16;
    // A walk steps through a new state entered at a node with at most this many children rather
    // than fill its row (see walk_range).
    static constexpr int THIN_CHILDREN = 4;

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
    // Asked at every live node with children, after its visit: whether the caller took care of the
    // subtree (`Slice`); a plain walk never does.
    struct NoSkip {
        bool operator()(size_t, TrieNode, int32_t) const { return false; }
    };

    template <bool Enter, class Fill, class Visit, class EnterFn, class Skip = NoSkip>
    void walk_range(size_t p, size_t end, int32_t* stack, RowTable& table, Fill& fill, Visit& visit,
                    EnterFn& enter, Skip&& skip = Skip{}) const;

    // The state whose slice a walk takes (-1: none), the slice, and the real state of each of its
    // region's states.
    struct Through {
        int32_t state = -1;
        std::shared_ptr<const Slice> slice;
        int32_t real[MAX_REGION_STATES];
    };

    // The slice a walk from `start` takes. With `ends`, only region states that may not end there
    // (a skipped node entered from one would be an end).
    template <class Fill>
    Through through_state(int32_t start, RowTable& table, Fill& fill, bool ends) const;

    Slice make_slice(const std::vector<int8_t>& next) const;

    // Whether node p has at most THIN_CHILDREN children.
    bool thin(size_t p) const {
        const size_t end = p + nodes_[p].subtree_size();
        int children = 0;
        for (size_t q = p + 1; q < end; q += nodes_[q].subtree_size())
            if (++children > THIN_CHILDREN) return false;
        return true;
    }

    // `walk(begin, end)` over the subtrees of the root's children whose byte leads `start` to a
    // live state, in node order (what a walk of the whole range visits, less the dead children).
    template <class WalkFn>
    void walk_live_roots(int32_t start, const RowTable& table, WalkFn&& walk) const {
        uint8_t live[256];  // (read off the start's row before any walk: a walk may reallocate the table)
        int n = 0;
        const int32_t* row = table.rows + static_cast<size_t>(start) * 256;
        for (int b = 0; b < 256; ++b)
            if (root_child_[b] != 0 && row[b] != 0) live[n++] = static_cast<uint8_t>(b);
        for (int i = 0; i < n; ++i) walk(root_child_[live[i]], root_end_[live[i]]);
    }

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
    // The root's child of each byte (0: none). A walk enters only the children its start keeps
    // alive: the 256 children lie far apart in the node array, a cache miss each at a cold start
    // (most of a narrow state's mask, a key's quote).
    uint32_t root_child_[256] = {};
    uint32_t root_end_[256] = {};  // ... and the end of its subtree
    uint32_t n_ids_ = 0;
    size_t n_tokens_ = 0;
    uint32_t max_depth_ = 0;
    // Slices made so far, the most recently used last (a region's transitions are its key).
    struct Slices {
        std::mutex mutex;
        std::vector<std::shared_ptr<const Slice>> kept;
    };
    std::unique_ptr<Slices> slices_ = std::make_unique<Slices>();  // (held apart: the trie stays movable)
};

// One flat loop over the nodes [p, end), entering each node from the state on the per-depth stack
// at its parent's depth (the caller sets the entry for the range's first node). `visit(token, next)`
// is called for every live node, `enter(node, parent)` for every node met (live or not) when
// `Enter` is true; a dead node's subtree is skipped, and so is one that `skip` takes care of.
template <bool Enter, class Fill, class Visit, class EnterFn, class Skip>
void PackedTrie::walk_range(size_t p, size_t end, int32_t* stack, RowTable& table, Fill& fill, Visit& visit,
                            EnterFn& enter, Skip&& skip) const {
    const TrieNode* nodes = nodes_.data();
    while (p < end) {
        const TrieNode n = nodes[p];
        const uint32_t d = n.depth();
        const int32_t parent = stack[d - 1];
        if constexpr (Enter) enter(p, parent, table);
        const int32_t next = __builtin_expect(table.has_row(parent), 1)
                                 ? table.rows[static_cast<size_t>(parent) * 256 + n.byte()]
                                 : fill.step(parent, n.byte());  // a thin node's state: no row
        if (next == 0) {
            p += n.subtree_size();
            continue;
        }
        visit(n.token(), next);
        if (n.subtree_size() > 1) {
            if (skip(p, n, next)) {
                p += n.subtree_size();
                continue;
            }
            stack[d] = next;
            // A state entered at a node of few children (deep in a long token) is stepped byte by
            // byte: its row would derive every byte class for the one or two that follow.
            if (__builtin_expect(!table.has_row(next), 0) && (!fill.steps() || !thin(p))) table = fill(next);
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
    walk_live_roots(start, table, [&](size_t begin, size_t end) {
        walk_range<false>(begin, end, stack, table, fill, visit, none);
    });
    out.size = k;
    out.shrink_to(n_tokens_);
    return out;
}

template <class Fill>
PackedTrie::Through PackedTrie::through_state(int32_t start, RowTable& table, Fill& fill, bool ends) const {
    Through out;
    // Candidates: the states the start's bytes lead to, the most often first (a string body after
    // a key's first bytes: most bytes lead to it), the start itself ahead of any.
    std::pair<int32_t, int> seen[256];
    int distinct = 0;
    const int32_t* row = table.rows + static_cast<size_t>(start) * 256;
    for (int b = 0; b < 256; ++b) {
        const int32_t next = row[b];
        if (next == 0) continue;
        int i = 0;
        while (i < distinct && seen[i].first != next) ++i;
        if (i == distinct) seen[distinct++] = {next, 0};
        seen[i].second += next == start ? 256 : 1;
    }
    std::sort(seen, seen + distinct, [](const auto& a, const auto& b) { return a.second > b.second; });
    auto row_of = [&](int32_t state) {
        if (!table.has_row(state)) table = fill(state);
        return table.rows + static_cast<size_t>(state) * 256;
    };
    for (int c = 0; c < std::min(distinct, 4); ++c) {
        const int32_t top = seen[c].first;
        const int32_t* top_row = row_of(top);
        if (ends && table.nullable[top]) continue;
        if (std::count(top_row, top_row + 256, top) < MIN_SLICE_BYTES) continue;
        // The region: `top`, and the states that bytes >= 0x80 lead to within three bytes of it
        // (inside a UTF-8 character) all of whose bytes lead back among them.
        int32_t* real = out.real;
        int k = 1;
        real[0] = top;
        auto index_of = [&](int32_t state) { return static_cast<int>(std::find(real, real + k, state) - real); };
        for (int level = 0, from = 0; level < 3 && from < k; ++level) {
            const int to = k;
            for (int q = from; q < to; ++q) {
                const int32_t* r = row_of(real[q]);
                for (int b = 0x80; b < 256; ++b)
                    if (r[b] != 0 && k < MAX_REGION_STATES && index_of(r[b]) == k) real[k++] = r[b];
            }
            from = to;
        }
        bool keep[MAX_REGION_STATES];
        for (int q = 0; q < k; ++q) keep[q] = q == 0 || !(ends && table.nullable[real[q]]);
        for (bool changed = true; changed;) {
            changed = false;
            for (int q = 1; q < k; ++q) {
                if (!keep[q]) continue;
                const int32_t* r = row_of(real[q]);
                for (int b = 0; b < 256 && keep[q]; ++b) {
                    if (r[b] == 0) continue;
                    const int i = index_of(r[b]);
                    if (i == k || !keep[i]) keep[q] = false, changed = true;
                }
            }
        }
        int kept = 0, renumber[MAX_REGION_STATES];
        for (int q = 0; q < k; ++q) renumber[q] = keep[q] ? kept++ : -1;
        std::vector<int8_t> next(static_cast<size_t>(kept) * 256, -1);
        for (int q = 0; q < k; ++q) {
            if (!keep[q]) continue;
            const int32_t* r = table.rows + static_cast<size_t>(real[q]) * 256;  // (every row is filled by now)
            for (int b = 0; b < 256; ++b) {
                const int i = r[b] == 0 ? k : index_of(r[b]);
                if (i < k) next[renumber[q] * 256 + b] = static_cast<int8_t>(renumber[i]);
            }
        }
        for (int q = 0; q < k; ++q)
            if (keep[q]) real[renumber[q]] = real[q];  // (renumber[q] <= q: in place)
        out.state = top;
        out.slice = slice(next);
        return out;
    }
    return out;
}

template <class Fill>
void PackedTrie::mask(int32_t start, RowTable table, Fill&& fill, uint32_t* words, Ends* ends, bool slices) const {
    auto visit = bit_setter(words);
    int32_t stack[MAX_DEPTH + 1];
    if (!table.has_row(start)) table = fill(start);
    auto none = [](size_t, int32_t, const RowTable&) {};
    auto enter = [ends, &fill](size_t node, int32_t parent, const RowTable& t) {
        if (t.has_row(parent) ? t.nullable[parent] : fill.nullable(parent)) {  // (a thin node's state has no row)
            ends->nodes.push_back(static_cast<int32_t>(node));
            ends->states.push_back(parent);
        }
    };
    if (nodes_.size() <= 1) return;
    stack[0] = start;
    const Through through = slices ? through_state(start, table, fill, ends != nullptr) : Through{};
    auto walk = [&](size_t begin, size_t end, auto&& skip) {
        if (ends == nullptr)
            walk_range<false>(begin, end, stack, table, fill, visit, none, skip);
        else
            walk_range<true>(begin, end, stack, table, fill, visit, enter, skip);
    };
    // The root's children: the live ones, or every one where the start may end (a head walk
    // records each node entered from it, dead or not, as a place to cross into the tail).
    auto walk_roots = [&](auto&& skip) {
        if (ends != nullptr && table.nullable[start])
            walk(1, nodes_.size(), skip);
        else
            walk_live_roots(start, table, [&](size_t begin, size_t end) { walk(begin, end, skip); });
    };
    if (through.slice == nullptr) {
        walk_roots(NoSkip{});
        return;
    }
    const Slice& slice = *through.slice;
    const auto& tn = slice.token_nodes;
    auto tokens_below = [&](size_t node, size_t end) {  // the positions in token_nodes of the tokens below node
        const auto lo = std::lower_bound(tn.begin(), tn.end(), static_cast<int32_t>(node + 1)) - tn.begin();
        const auto hi = std::lower_bound(tn.begin() + lo, tn.end(), static_cast<int32_t>(end));
        return std::pair<size_t, size_t>(lo, hi - tn.begin());
    };
    auto mark_tokens_below = [&](size_t node, size_t end, bool set) {  // set (or clear) the bits of the slice's tokens below node
        const auto [lo, hi] = tokens_below(node, end);
        for (size_t i = lo; i < hi; ++i) {
            const auto t = static_cast<uint32_t>(slice.token_ids[i]);
            words[t >> 5] = set ? words[t >> 5] | 1u << (t & 31) : words[t >> 5] & ~(1u << (t & 31));
        }
    };
    // Below a node entered in the real state of a region state: its tokens that keep to the region
    // (unless the slice's words hold them), and the exits walked from their parents' real states.
    auto below = [&](size_t node, bool tokens) {
        const auto end = static_cast<int32_t>(node + nodes_[node].subtree_size());
        if (tokens) mark_tokens_below(node, static_cast<size_t>(end), true);
        const auto& ex = slice.exits;
        for (size_t i = std::lower_bound(ex.begin(), ex.end(), static_cast<int32_t>(node + 1)) - ex.begin();
             i < ex.size() && ex[i] < end; ++i) {
            const auto x = static_cast<size_t>(ex[i]);
            stack[nodes_[x].depth() - 1] = through.real[slice.exit_from[i]];
            walk(x, x + nodes_[x].subtree_size(), NoSkip{});  // (below an exit the region is left)
        }
    };
    // The walk below the root's children, tracking the relative region state along the path.
    bool complement = false;  // whether the slice's token words already hold the tokens below skipped children
    int8_t region[MAX_DEPTH + 1];
    auto skip = [&](size_t p, TrieNode n, int32_t next) {
        const uint32_t d = n.depth();
        const int8_t q = d == 1 ? slice.first_state(n.byte()) : region[d - 1] < 0 ? -1 : slice.next[region[d - 1] * 256 + n.byte()];
        if (q >= 0 && next == through.real[q]) {
            below(p, !(complement && d == 1));
            return true;
        }
        region[d] = q;
        return false;
    };
    if (through.state == start) {  // the region's own state: the root part, then where its bytes leave it
        for (size_t i = 0; i < slice.words.size(); ++i) words[i] |= slice.words[i];
        for (size_t i = 0; i < slice.root_exits.size(); ++i) {
            const auto x = static_cast<size_t>(slice.root_exits[i]);
            const uint32_t d = nodes_[x].depth();
            stack[d - 1] = through.real[slice.root_exit_from[i]];
            if (d == 1)
                walk(x, x + nodes_[x].subtree_size(), skip);  // (an opening quote may lead to another body)
            else
                walk(x, x + nodes_[x].subtree_size(), NoSkip{});
        }
        return;
    }
    // Another state: the root's children entered in a region state are skipped. When their tokens
    // are most of the slice's, they come as the slice's token words with the other children's
    // tokens cleared (those children are walked) rather than one by one.
    // (By byte, through root_child_ and root_end_: the children's own nodes lie far apart.)
    auto skipped = [&](int b) {
        return table.rows[static_cast<size_t>(start) * 256 + b] == through.real[slice.first_state(static_cast<uint8_t>(b))];
    };
    size_t inside = 0;
    for (int b = 0; b < 256; ++b) {
        if (root_child_[b] == 0 || !skipped(b)) continue;
        const auto [lo, hi] = tokens_below(root_child_[b], root_end_[b]);
        inside += hi - lo;
    }
    complement = inside * 2 > tn.size();
    if (complement) {
        for (size_t i = 0; i < slice.token_words.size(); ++i) words[i] |= slice.token_words[i];
        for (int b = 0; b < 256; ++b)
            if (root_child_[b] != 0 && !skipped(b)) mark_tokens_below(root_child_[b], root_end_[b], false);
    }
    walk_roots(skip);
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
