// constrain._core: the token automaton's hot path in C++ (issue 12). The Python automaton in
// constrain/automaton.py is its reference twin.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "packed_trie.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using constrain::PackedTrie;
using constrain::RowTable;

namespace {

using Rows = nb::ndarray<const int32_t, nb::shape<-1, 256>, nb::c_contig, nb::device::cpu>;
using Done = nb::ndarray<const bool, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using IntArray = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;

constexpr const char* FILL_CONTRACT =
    "PackedTrie.walk: fill(state) must return (rows, done): rows int32[n, 256] and done bool[n], "
    "both C-contiguous, with the row of that state filled";

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

RowTable view(const Rows& rows, const Done& done) {
    return {rows.data(), done.data(), std::min(rows.shape(0), done.shape(0))};
}

IntArray to_numpy(std::unique_ptr<int32_t[]> buffer, size_t size) {
    int32_t* data = buffer.release();
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
    return IntArray(data, {size}, owner);
}

nb::tuple walk(const PackedTrie& trie, int32_t start, const Rows& rows, const Done& done, const nb::callable& fill) {
    if (start < 0) throw nb::value_error(("PackedTrie.walk: start state " + std::to_string(start) + " < 0").c_str());
    std::vector<Rows> kept_rows;  // tables handed back by fill, dropped after the GIL is taken back
    std::vector<Done> kept_done;
    std::optional<constrain::WalkResult> result;
    {
        nb::gil_scoped_release release;
        result.emplace(trie.walk(start, view(rows, done), [&](int32_t state) {
            nb::gil_scoped_acquire acquire;
            nb::object got = fill(state);
            nb::tuple pair;
            Rows new_rows;
            Done new_done;
            if (!nb::try_cast(got, pair, false) || nb::len(pair) != 2 || !nb::try_cast(pair[0], new_rows, false) ||
                !nb::try_cast(pair[1], new_done, false))
                throw nb::type_error(FILL_CONTRACT);
            RowTable table = view(new_rows, new_done);
            if (!table.has_row(state))
                throw nb::value_error((std::string(FILL_CONTRACT) + " (no row for state " + std::to_string(state) +
                                       ")").c_str());
            kept_rows.push_back(std::move(new_rows));
            kept_done.push_back(std::move(new_done));
            return table;
        }));
    }
    const size_t size = result->size;
    return nb::make_tuple(to_numpy(std::move(result->tokens), size), to_numpy(std::move(result->states), size));
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
    nb::class_<PackedTrie>(m, "PackedTrie",
                           "Byte trie of a vocabulary, one 8-byte node per trie node in depth-first order. Immutable "
                           "and safe to share between threads.")
        .def(nb::new_(&make_trie), "token_bytes"_a,
             "The trie of the ids of ``token_bytes`` (a sequence of bytes or None) that have bytes.")
        .def_prop_ro("node_count", &PackedTrie::node_count, "Nodes, the root included.")
        .def_prop_ro("token_count", &PackedTrie::token_count, "Token ids with bytes.")
        .def_prop_ro("max_depth", &PackedTrie::max_depth, "Bytes of the longest token.")
        .def("nodes", &nodes,
             "A copy of the nodes as uint32[n, 2]: (token << 8 | byte, subtree size << 8 | depth).")
        .def("walk", &walk, "start"_a, "rows"_a.noconvert(), "done"_a.noconvert(), "fill"_a,
             "Every token allowed from ``start`` by the byte transition table ``rows`` (0: dead) and the "
             "state each leads to, as two int32 arrays in byte order. ``fill(state)`` is called, with the "
             "GIL, for a state whose row is missing (``done[state]`` false or beyond the table) and returns "
             "the table again as ``(rows, done)``. The GIL is released while the walk runs.");
}
