// constrain._core: the token automaton's hot path in C++ (issue 12). The Python automaton in
// constrain/automaton.py is its reference twin.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "packed_trie.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using constrain::PackedTrie;
using constrain::RowTable;
using constrain::Slice;

namespace {

using Rows = nb::ndarray<const int32_t, nb::shape<-1, 256>, nb::c_contig, nb::device::cpu>;
using Flags = nb::ndarray<const bool, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Ids = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using IntArray = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;

constexpr const char* TABLE_CONTRACT =
    "the row table must have rows (int32[n, 256]), row_done and row_nullable (bool[n]), all C-contiguous, "
    "and ensure_rows(states) that fills the rows of states";

PackedTrie make_trie(const nb::sequence& token_bytes) {
    std::vector<std::string_view> views;
    views.reserve(nb::len(token_bytes));
    size_t i = 0;
    for (nb::handle item : token_bytes) {
        if (item.is_none()) {
            views.emplace_back();
        } else if (nb::isinstance<nb::bytes>(item)) {
            nb::bytes data = nb::borrow<nb::bytes>(item);  // the sequence keeps it alive
            views.emplace_back(data.c_str(), data.size());
        } else {
            throw nb::type_error(("PackedTrie: token_bytes[" + std::to_string(i) + "] is a " +
                                  nb::type_name(item.type()).c_str() + ", not bytes or None").c_str());
        }
        ++i;
    }
    return PackedTrie(views);
}

// A Python row table (constrain.derivatives.ExprTable) seen from a walk: its arrays as a RowTable,
// and the fill that calls table.ensure_rows with the GIL and views the (maybe reallocated) arrays
// again. The arrays viewed are kept until the walk is over.
class TableView {
public:
    explicit TableView(nb::handle table) : table_(table) { view(); }

    RowTable rows() const { return current_; }

    RowTable fill(int32_t state) {
        nb::gil_scoped_acquire acquire;
        table_.attr("ensure_rows")(nb::make_tuple(state));
        view();
        if (!current_.has_row(state))
            throw nb::value_error(("PackedTrie: ensure_rows left no row for state " + std::to_string(state)).c_str());
        return current_;
    }

private:
    void view() {
        Rows rows;
        Flags done, nullable;
        if (!nb::try_cast(table_.attr("rows"), rows, false) || !nb::try_cast(table_.attr("row_done"), done, false) ||
            !nb::try_cast(table_.attr("row_nullable"), nullable, false))
            throw nb::type_error((std::string("PackedTrie: ") + TABLE_CONTRACT).c_str());
        current_ = {rows.data(), done.data(), nullable.data(),
                    std::min({rows.shape(0), done.shape(0), nullable.shape(0)})};
        kept_rows_.push_back(std::move(rows));
        kept_flags_.push_back(std::move(done));
        kept_flags_.push_back(std::move(nullable));
    }

    nb::handle table_;
    RowTable current_{};
    std::vector<Rows> kept_rows_;
    std::vector<Flags> kept_flags_;
};

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::unique_ptr<T[]> buffer, size_t size) {
    T* data = buffer.release();
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
    return {data, {size}, owner};
}

IntArray to_numpy(std::vector<int32_t>&& values) {
    auto buffer = std::make_unique<int32_t[]>(values.size());
    std::copy(values.begin(), values.end(), buffer.get());
    return to_numpy(std::move(buffer), values.size());
}

void check_state(int32_t state, const char* what) {
    if (state < 0) throw nb::value_error((std::string("PackedTrie.") + what + ": state " + std::to_string(state) + " < 0").c_str());
}

size_t word_count(const PackedTrie& trie) { return (trie.id_count() + 31) / 32; }

std::unique_ptr<uint32_t[]> zeroed_words(const PackedTrie& trie) {
    return std::make_unique<uint32_t[]>(word_count(trie));  // value-initialised: zero
}

IntArray words_array(const PackedTrie& trie, std::unique_ptr<uint32_t[]> words) {
    std::unique_ptr<int32_t[]> as_int(reinterpret_cast<int32_t*>(words.release()));
    return to_numpy(std::move(as_int), word_count(trie));
}

nb::tuple transitions(const PackedTrie& trie, nb::handle table, int32_t start) {
    check_state(start, "transitions");
    TableView rows(table);
    std::optional<constrain::WalkResult> result;
    {
        nb::gil_scoped_release release;
        result.emplace(trie.walk(start, rows.rows(), [&](int32_t s) { return rows.fill(s); }));
    }
    const size_t size = result->size;
    return nb::make_tuple(to_numpy(std::move(result->tokens), size), to_numpy(std::move(result->states), size));
}

IntArray mask(const PackedTrie& trie, nb::handle table, int32_t start, const Slice* slice) {
    check_state(start, "mask");
    TableView rows(table);
    auto words = zeroed_words(trie);
    {
        nb::gil_scoped_release release;
        trie.mask(start, rows.rows(), [&](int32_t s) { return rows.fill(s); }, words.get(), nullptr, slice);
    }
    return words_array(trie, std::move(words));
}

nb::tuple head_mask(const PackedTrie& trie, nb::handle table, int32_t start, const Slice* slice) {
    check_state(start, "head_mask");
    TableView rows(table);
    auto words = zeroed_words(trie);
    constrain::Ends ends;
    {
        nb::gil_scoped_release release;
        trie.mask(start, rows.rows(), [&](int32_t s) { return rows.fill(s); }, words.get(), &ends, slice);
    }
    return nb::make_tuple(words_array(trie, std::move(words)), to_numpy(std::move(ends.nodes)),
                          to_numpy(std::move(ends.states)));
}

void check_nodes(const PackedTrie& trie, const Ids& nodes, const char* what) {
    for (size_t i = 0; i < nodes.shape(0); ++i)
        if (nodes.data()[i] <= 0 || static_cast<size_t>(nodes.data()[i]) >= trie.node_count())
            throw nb::index_error((std::string("PackedTrie.") + what + ": node " + std::to_string(nodes.data()[i]) +
                                   " is not a node below the root").c_str());
}

IntArray mask_below(const PackedTrie& trie, nb::handle table, const Ids& nodes, const Ids& parents) {
    if (nodes.shape(0) != parents.shape(0))
        throw nb::value_error("PackedTrie.mask_below: nodes and parents differ in length");
    check_nodes(trie, nodes, "mask_below");
    for (size_t i = 0; i < parents.shape(0); ++i) check_state(parents.data()[i], "mask_below");
    TableView rows(table);
    auto words = zeroed_words(trie);
    {
        nb::gil_scoped_release release;
        trie.mask_below(nodes.data(), parents.data(), nodes.shape(0), rows.rows(),
                        [&](int32_t s) { return rows.fill(s); }, words.get());
    }
    return words_array(trie, std::move(words));
}

using ByteFlags = nb::ndarray<const bool, nb::shape<256>, nb::c_contig, nb::device::cpu>;

Slice make_slice(const PackedTrie& trie, const ByteFlags& bytes) {
    nb::gil_scoped_release release;
    return trie.slice(bytes.data());
}

IntArray outermost(const PackedTrie& trie, const Ids& nodes, const ByteFlags& bytes) {
    check_nodes(trie, nodes, "outermost");
    return to_numpy(trie.outermost(nodes.data(), nodes.shape(0), bytes.data()));
}

nb::bytes path(const PackedTrie& trie, int64_t node) {
    if (node < 0 || static_cast<size_t>(node) >= trie.node_count())
        throw nb::index_error(("PackedTrie.path: no node " + std::to_string(node)).c_str());
    const std::string out = trie.path(static_cast<uint32_t>(node));
    return nb::bytes(out.data(), out.size());
}

nb::ndarray<nb::numpy, uint32_t, nb::ndim<2>> nodes(const PackedTrie& trie) {
    auto copy = std::make_unique<uint32_t[]>(trie.node_count() * 2);
    for (size_t i = 0; i < trie.node_count(); ++i) {
        copy[2 * i] = trie.nodes()[i].token_byte;
        copy[2 * i + 1] = trie.nodes()[i].size_depth;
    }
    uint32_t* data = copy.release();
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<uint32_t*>(p); });
    return {data, {trie.node_count(), 2}, owner};
}

}  // namespace

NB_MODULE(_core, m) {
    m.doc() = "The token automaton's hot path in C++ (the Python automaton is its reference twin).";
    nb::class_<Slice>(m, "Slice",
                      "A byte set's slice of a vocabulary: the tokens made of those bytes only, and the trie nodes "
                      "where a token first leaves the set (``PackedTrie.slice``).")
        .def_prop_ro("exit_count", [](const Slice& s) { return s.exits.size(); }, "Nodes where a token leaves the set.");
    nb::class_<PackedTrie>(
        m, "PackedTrie",
        "Byte trie of a vocabulary, one 8-byte node per trie node in depth-first order. Immutable and safe to share "
        "between threads.\n\nWalks read a row table (``constrain.derivatives.ExprTable``: ``rows`` int32[n, 256], 0 "
        "dead; ``row_done`` and ``row_nullable`` bool[n]) and call its ``ensure_rows((state,))``, with the GIL, for "
        "a state whose row is missing; the GIL is released while they run. Masks are int32 words, bit t % 32 of "
        "word t // 32 for token t, stop tokens not included.")
        .def(nb::new_(&make_trie), "token_bytes"_a,
             "The trie of the ids of ``token_bytes`` (a sequence of bytes or None) that have bytes.")
        .def_prop_ro("node_count", &PackedTrie::node_count, "Nodes, the root included.")
        .def_prop_ro("token_count", &PackedTrie::token_count, "Token ids with bytes.")
        .def_prop_ro("max_depth", &PackedTrie::max_depth, "Bytes of the longest token.")
        .def("nodes", &nodes,
             "A copy of the nodes as uint32[n, 2]: (token << 8 | byte, subtree size << 8 | depth).")
        .def("transitions", &transitions, "table"_a, "start"_a,
             "Every token allowed from ``start`` and the state each leads to, as two int32 arrays in byte order.")
        .def("mask", &mask, "table"_a, "start"_a, "slice"_a = nb::none(),
             "The mask words of the tokens allowed from ``start``. With ``slice`` (the caller promises that "
             "every byte of its set leads ``start`` back to itself), its tokens are allowed at once and only the "
             "nodes below its exits are walked.")
        .def("head_mask", &head_mask, "table"_a, "start"_a, "slice"_a = nb::none(),
             "``mask`` and where a token may leave ``start``'s language: every node (live or not) entered from a "
             "state that may end there, and that state, as int32 arrays in depth-first order. A ``slice`` is "
             "only for a ``start`` that may not end there.")
        .def("slice", &make_slice, "bytes"_a.noconvert(),
             "The slice of the byte set ``bytes`` (bool[256]), for ``mask`` from states that loop on it.")
        .def("mask_below", &mask_below, "table"_a, "nodes"_a.noconvert(), "parents"_a.noconvert(),
             "The mask words of the tokens allowed at or below each of ``nodes`` (int32, none in another's "
             "subtree), entered from the state ``parents[i]`` at the node's parent.")
        .def("outermost", &outermost, "nodes"_a.noconvert(), "bytes"_a.noconvert(),
             "Positions in ``nodes`` (int32, depth-first order) of those whose byte is set in ``bytes`` (bool[256]) "
             "and that lie below no earlier such node.")
        .def("path", &path, "node"_a, "The bytes from the root to ``node``, inclusive.");
}
