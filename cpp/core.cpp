// constrain._core: the token automaton's hot path in C++ (issue 12). The Python automaton in
// constrain/automaton.py is its reference twin.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "derivatives.hpp"
#include "packed_trie.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using constrain::PackedTrie;
using constrain::RowTable;
using constrain::Slice;
using constrain::ExprCore;

namespace {

using Rows = nb::ndarray<const int32_t, nb::shape<-1, 256>, nb::c_contig, nb::device::cpu>;
using Words = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
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

// A row table seen from a walk: the C++ table (constrain._core.ExprCore), read and filled directly
// under its mutex with no Python involved, or a Python one (constrain.derivatives.ExprTable): its
// arrays as a RowTable, and the fill that calls table.ensure_rows with the GIL and views the (maybe
// reallocated) arrays again. What a walk viewed is kept until the walk is over.
class TableView {
public:
    explicit TableView(nb::handle table) : table_(table) {
        if (nb::try_cast<ExprCore*>(table, core_, false) && core_ != nullptr) {
            nb::gil_scoped_release release;  // never wait for the mutex holding the GIL: its holder may need it
            lock_ = std::unique_lock<std::recursive_mutex>(core_->mutex());
            snapshot_ = core_->buffers();
            current_ = snapshot_.view();
        } else {
            core_ = nullptr;
            view();
        }
    }

    RowTable rows() const { return current_; }

    RowTable operator()(int32_t state) { return fill(state); }

    // Whether a walk may leave a state without a row and `step` through it (the C++ table; a
    // Python one gets every row filled).
    bool steps() const { return core_ != nullptr; }

    // The live state after `byte` from `state`, 0 if none: the entry its row would hold.
    int32_t step(int32_t state, uint8_t byte) { return core_->step_bytes(state, &byte, 1); }

    // Whether `state` may end there: the flag its row would hold.
    bool nullable(int32_t state) { return core_->nullable(state); }

    RowTable fill(int32_t state) {
        if (core_ != nullptr) {
            core_->ensure_row(state);
            snapshot_ = core_->buffers();
            current_ = snapshot_.view();
            return current_;
        }
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
    ExprCore* core_ = nullptr;
    std::unique_lock<std::recursive_mutex> lock_;
    constrain::RowBuffers snapshot_;
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
        result.emplace(trie.walk(start, rows.rows(), rows));
    }
    const size_t size = result->size;
    return nb::make_tuple(to_numpy(std::move(result->tokens), size), to_numpy(std::move(result->states), size));
}

IntArray mask(const PackedTrie& trie, nb::handle table, int32_t start, bool slices) {
    check_state(start, "mask");
    TableView rows(table);
    auto words = zeroed_words(trie);
    {
        nb::gil_scoped_release release;
        trie.mask(start, rows.rows(), rows, words.get(), nullptr, slices);
    }
    return words_array(trie, std::move(words));
}

nb::tuple head_mask(const PackedTrie& trie, nb::handle table, int32_t start, bool slices) {
    check_state(start, "head_mask");
    TableView rows(table);
    auto words = zeroed_words(trie);
    constrain::Ends ends;
    {
        nb::gil_scoped_release release;
        trie.mask(start, rows.rows(), rows, words.get(), &ends, slices);
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
                        rows, words.get());
    }
    return words_array(trie, std::move(words));
}

using ByteFlags = nb::ndarray<const bool, nb::shape<256>, nb::c_contig, nb::device::cpu>;

using Region = nb::ndarray<const int8_t, nb::shape<-1, 256>, nb::c_contig, nb::device::cpu>;

std::shared_ptr<const Slice> make_slice(const PackedTrie& trie, const Region& next) {
    std::vector<int8_t> entries(next.data(), next.data() + next.size());
    nb::gil_scoped_release release;
    return trie.slice(entries);
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

// ------------------------------------------------------------------ the expression table

using constrain::ByteSet;
using constrain::CoreError;

// A call into the table: the GIL released, the table's mutex held, one unit of work (the
// deadline of an enclosing unit, or one of its own).
template <class F>
auto locked(ExprCore& core, F&& f) {
    nb::gil_scoped_release release;
    std::lock_guard<std::recursive_mutex> guard(core.mutex());
    core.begin_work();
    struct End {
        ExprCore& c;
        ~End() { c.end_work(); }
    } end{core};
    return f();
}

int32_t checked(const ExprCore& core, int64_t e, const char* what) {
    if (e < 0 || static_cast<size_t>(e) >= core.size())
        throw nb::index_error((std::string("ExprCore.") + what + ": no state " + std::to_string(e)).c_str());
    return static_cast<int32_t>(e);
}

// A byte set (or any little-endian words) as a Python int.
nb::object as_int(const uint64_t* words, size_t n) {
    return nb::steal(_PyLong_FromByteArray(reinterpret_cast<const unsigned char*>(words), n * 8, 1, 0));
}

nb::str interned(const char* name) { return nb::steal<nb::str>(PyUnicode_InternFromString(name)); }

// Reads IR objects (grammars/ir.py nodes) into a table's flat arrays, children before parents,
// without recursion; a node met before (shared subtrees, other rules) is not read again.
class IrReader {
public:
    // `rule_ids`: rule name -> index (names are any str, lone surrogates included: never converted).
    IrReader(nb::list rules, nb::dict rule_ids, nb::tuple classes) : rules_(std::move(rules)), rule_ids_(std::move(rule_ids)) {
        if (nb::len(rules_) != nb::len(rule_ids_)) throw nb::value_error("ExprCore: one rule body per name");
        if (nb::len(classes) != 8) throw nb::value_error("ExprCore: the 8 IR classes, in IrKind order");
        for (size_t i = 0; i < 8; ++i) types_[i] = reinterpret_cast<PyTypeObject*>(classes[i].ptr());
    }

    // Every rule body into `ir`.
    void read_rules(constrain::FlatIr& ir) {
        ir.offsets.assign(1, 0);
        ir.rule_nodes.assign(nb::len(rules_), -1);
        for (size_t r = 0; r < ir.rule_nodes.size(); ++r) ir.rule_nodes[r] = read(ir, rules_[r].ptr());
    }

private:
    // Post-order without recursion. Pointers are borrowed: every node is held by its parent (a rule
    // body by `rules_`), and the IR is immutable while it is read.
    int32_t read(constrain::FlatIr& ir, PyObject* root) {
        if (const int32_t* got = index_.find(key(root))) return *got;
        struct Open {
            PyObject* node;
            int32_t kind;
            size_t parts, next;  // its parts are parts_[parts ..), the next one to read at parts + next
        };
        std::vector<Open> open;
        auto enter = [&](PyObject* node) {
            const int32_t k = kind_of(node);
            open.push_back({node, k, parts_.size(), 0});
            parts_of(node, k);
        };
        enter(root);
        while (!open.empty()) {
            Open& top = open.back();
            const size_t n_parts = parts_.size() - top.parts;
            if (top.next < n_parts) {
                PyObject* part = parts_[top.parts + top.next++];
                if (!index_.find(key(part))) enter(part);  // (`top` may move)
                continue;
            }
            emit(ir, top);
            parts_.resize(top.parts);
            open.pop_back();
        }
        return *index_.find(key(root));
    }

    template <class Open>
    void emit(constrain::FlatIr& ir, const Open& o) {
        const int32_t k = o.kind;
        nb::handle node(o.node);
        int64_t p0 = 0, p1 = 0;
        if (k == constrain::IR_BYTES) {
            nb::object mask = node.attr(mask_);
            ByteSet m;
            if (!PyLong_Check(mask.ptr()) || !bytes_of(mask.ptr(), m)) throw nb::type_error("ExprCore: a Bytes mask is an int of 256 bits");
            ir.masks.push_back(m);
        } else if (k == constrain::IR_REPEAT || k == constrain::IR_UNORDERED) {
            p0 = nb::cast<int64_t>(node.attr(min_));
            nb::object hi = node.attr(max_);
            p1 = hi.is_none() ? -1 : nb::cast<int64_t>(hi);
            if (k == constrain::IR_UNORDERED) {
                nb::tuple required = nb::borrow<nb::tuple>(node.attr(required_));
                std::vector<uint64_t> words((nb::len(required) + 63) / 64, 0);
                for (size_t j = 0; j < nb::len(required); ++j)
                    if (nb::cast<bool>(required[j])) words[j / 64] |= uint64_t(1) << (j % 64);
                ir.required.push_back(std::move(words));
            }
        } else if (k == constrain::IR_REF) {
            nb::object name = node.attr(name_);
            PyObject* found = PyDict_GetItemWithError(rule_ids_.ptr(), name.ptr());  // borrowed
            if (found == nullptr && PyErr_Occurred()) throw nb::python_error();
            if (found != nullptr) {
                p0 = nb::cast<int64_t>(nb::handle(found));
            } else {
                p0 = -1;
                p1 = static_cast<int64_t>(ir.undefined_names.size());
                ir.undefined_names.push_back(nb::repr(name).c_str());
            }
        }
        index_.set(key(o.node), static_cast<int32_t>(ir.kind.size()));
        ir.kind.push_back(k);
        for (size_t i = o.parts; i < parts_.size(); ++i) ir.children.push_back(*index_.find(key(parts_[i])));
        ir.offsets.push_back(static_cast<int32_t>(ir.children.size()));
        ir.p0.push_back(p0);
        ir.p1.push_back(p1);
    }

    // A non-negative int below 2**256 as little-endian words; false if it is not one.
    static bool bytes_of(PyObject* value, ByteSet& out) {
#if PY_VERSION_HEX >= 0x030D0000
        const Py_ssize_t n = PyLong_AsNativeBytes(value, out.data(), 32,
                                                  Py_ASNATIVEBYTES_LITTLE_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER |
                                                      Py_ASNATIVEBYTES_REJECT_NEGATIVE);
        if (n < 0) PyErr_Clear();
        return n >= 0 && n <= 32;
#else
        const int r = _PyLong_AsByteArray(reinterpret_cast<PyLongObject*>(value),
                                          reinterpret_cast<unsigned char*>(out.data()), 32, 1, 0);
        if (r < 0) PyErr_Clear();
        return r == 0;
#endif
    }

    static int64_t key(PyObject* node) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(node)); }  // (user space: >= 0)

    int32_t kind_of(PyObject* node) const {
        for (int32_t k = 0; k < 8; ++k)
            if (Py_TYPE(node) == types_[k]) return k;
        for (int32_t k = 0; k < 8; ++k)
            if (PyObject_TypeCheck(node, types_[k])) return k;
        throw nb::type_error(("not an IR node: " + std::string(nb::repr(nb::handle(node)).c_str())).c_str());
    }

    // The parts of `node` (items; extra, first, sep, last; item) onto parts_, borrowed.
    void parts_of(PyObject* node, int32_t k) {
        auto part = [&](const nb::str& name) {
            nb::object value = nb::handle(node).attr(name);
            parts_.push_back(value.ptr());  // (held by `node` after `value` goes)
        };
        if (k == constrain::IR_SEQ || k == constrain::IR_ALT || k == constrain::IR_AND || k == constrain::IR_UNORDERED) {
            nb::object items = nb::handle(node).attr(items_);
            if (!PyTuple_Check(items.ptr())) throw nb::type_error("ExprCore: an IR node's items must be a tuple");
            const Py_ssize_t n = PyTuple_GET_SIZE(items.ptr());
            for (Py_ssize_t i = 0; i < n; ++i) parts_.push_back(PyTuple_GET_ITEM(items.ptr(), i));
            if (k == constrain::IR_UNORDERED)
                for (const nb::str& name : parts_names_) part(name);
        } else if (k == constrain::IR_NOT || k == constrain::IR_REPEAT) {
            part(item_);
        }
    }

    nb::list rules_;
    nb::dict rule_ids_;
    constrain::FlatMap index_;  // the identity of each node read -> its index
    std::vector<PyObject*> parts_;  // the parts of the nodes open in `read`
    PyTypeObject* types_[8];
    // Attribute names interned once: a name made per lookup would cost more than the lookup.
    nb::str items_ = interned("items"), item_ = interned("item"), mask_ = interned("mask"), min_ = interned("min"),
            max_ = interned("max"), required_ = interned("required"), name_ = interned("name");
    nb::str parts_names_[4] = {interned("extra"), interned("first"), interned("sep"), interned("last")};
};

// The whole IR is read here, once: the table keeps no Python object of it (alive, the IR objects
// would weigh on every collection of Python's garbage collector for as long as the grammar lives).
ExprCore* make_core(ExprCore* self, nb::list rules, nb::dict rule_ids, nb::tuple classes, double seconds,
                    double max_bytes, int64_t max_states, int max_nesting, int64_t max_repeat) {
    constrain::FlatIr ir;
    IrReader(rules, rule_ids, classes).read_rules(ir);
    try {
        return new (self) ExprCore(std::move(ir), {seconds, max_bytes, max_states, max_nesting, max_repeat});
    } catch (const std::invalid_argument& e) {
        throw nb::value_error(e.what());
    }
}

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<2>> shared_view(std::shared_ptr<T[]> data, size_t rows, size_t cols) {
    auto* keep = new std::shared_ptr<T[]>(std::move(data));
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<T[]>*>(p); });
    return {keep->get(), {rows, cols}, owner};
}

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> shared_view(std::shared_ptr<T[]> data, size_t size) {
    auto* keep = new std::shared_ptr<T[]>(std::move(data));
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<T[]>*>(p); });
    return {keep->get(), {size}, owner};
}

nb::object node(ExprCore& core, int64_t e) {
    const int32_t s = checked(core, e, "node");
    const auto [k, a] = locked(core, [&] {
        return std::make_pair(core.kind(s), std::vector<int64_t>(core.args(s), core.args(s) + core.arg_count(s)));
    });
    nb::list args;
    if (k == constrain::K_BYTES) {
        args.append(as_int(reinterpret_cast<const uint64_t*>(a.data()), 4));
    } else if (k == constrain::K_UNORDERED) {
        args.append(a[0]);
        args.append(as_int(reinterpret_cast<const uint64_t*>(a.data() + 2), a.size() - 2));
        args.append(a[1]);
    } else if (k == constrain::K_REPEAT) {
        args.append(a[0]);
        args.append(a[1]);
        if (a[2] < 0)
            args.append(nb::none());
        else
            args.append(a[2]);
    } else if (k == constrain::K_ALT || k == constrain::K_AND) {
        nb::list members;
        for (int64_t m : a) members.append(m);
        args.append(nb::tuple(members));
    } else {
        for (int64_t x : a) args.append(x);
    }
    return nb::make_tuple(static_cast<int>(k), nb::tuple(args));
}

// A table method of one state as a Python method: the state checked, then a locked call.
template <auto Method>
auto on_state(const char* name) {
    return [name](ExprCore& c, int64_t e) {
        const int32_t s = checked(c, e, name);
        return locked(c, [&] { return (c.*Method)(s); });
    };
}

void raise_core_error(const CoreError& e) {
    nb::object err;
    switch (e.code) {
        case CoreError::GRAMMAR:
            err = nb::module_::import_("constrain.grammars.errors").attr("GrammarError")(e.message);
            break;
        case CoreError::NESTING: err = nb::module_::import_("constrain.grammars.analysis").attr("nesting_error")(); break;
        case CoreError::SECONDS:
            err = nb::module_::import_("constrain.budget").attr("BudgetExceededError")("seconds", e.limit, e.message);
            break;
        case CoreError::MAX_BYTES:
            err = nb::module_::import_("constrain.budget")
                      .attr("BudgetExceededError")("max_bytes", static_cast<int64_t>(e.limit), e.message);
            break;
        case CoreError::MAX_STATES:
            err = nb::module_::import_("constrain.derivatives")
                      .attr("StateLimitError")("max_states", static_cast<int64_t>(e.limit), e.message);
            break;
    }
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
}

void bind_expr_core(nb::module_& m) {
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const CoreError& e) {
            raise_core_error(e);
        }
    });
    nb::class_<ExprCore>(
        m, "ExprCore",
        "The expression table of constrain.derivatives in C++: interned expressions, their derivatives and their "
        "byte transition rows (constrain.native_derivatives.NativeExprTable is its Python face). Thread-safe; "
        "the GIL is released while it works.")
        .def("__init__", &make_core, "rules"_a, "rule_ids"_a, "classes"_a, "seconds"_a, "max_bytes"_a, "max_states"_a,
             "max_nesting"_a, "max_repeat"_a,
             "The table of the IR rule bodies ``rules``, rule ``i`` named by ``rule_ids`` (name -> i); ``classes``: the IR node classes in "
             "cpp/derivatives.hpp's IrKind order; read whole here (nothing of them is kept). "
             "``measure_rules`` must run before the first ``ref``.")
        .def("__len__", &ExprCore::size)
        .def("_begin_work", [](ExprCore& c) {
            nb::gil_scoped_release release;
            std::lock_guard<std::recursive_mutex> g(c.mutex());
            c.begin_work();
        })
        .def("_end_work", [](ExprCore& c) {
            nb::gil_scoped_release release;
            std::lock_guard<std::recursive_mutex> g(c.mutex());
            c.end_work();
        })
        .def("measure_rules",
             [](ExprCore& c, nb::sequence names) {
                 try {
                     return locked(c, [&] { return c.measure_rules(); });
                 } catch (const constrain::ComplementCycle& e) {
                     nb::object err = nb::module_::import_("constrain.grammars.analysis")
                                          .attr("complement_cycle_error")(names[e.rule], names[e.used]);
                     PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
                     throw nb::python_error();
                 }
             },
             "names"_a,
             "Measure every rule's shortest string (grammars.analysis.measure_rules, intersections and complements "
             "searched); return the lower bounds of the first pass (inf: a rule empty by its structure alone). "
             "``names``: the rules' names, in order, for the error of a recursion through a complement.")
        .def_prop_ro("rule_lengths", [](ExprCore& c) { return locked(c, [&] { return c.rule_lengths(); }); },
                     "Each rule's shortest string (inf: unproductive), exact once measured.")
        .def("ref", [](ExprCore& c, int32_t rule) { return locked(c, [&] { return c.ref(rule); }); })
        .def("rule_body", [](ExprCore& c, int32_t rule) { return locked(c, [&] { return c.rule_body(rule); }); },
             "rule"_a, "The expression a reference to ``rule`` expands to.")
        .def("estimated_bytes", [](ExprCore& c) { return c.estimated_bytes(); })
        .def("nullable", on_state<&ExprCore::nullable>("nullable"))
        .def("derive", [](ExprCore& c, int64_t e, int b) {
            const int32_t s = checked(c, e, "derive");
            if (b < 0 || b > 255) throw nb::value_error("ExprCore.derive: a byte is 0..255");
            return locked(c, [&] { return c.derive(s, b); });
        })
        .def("derive_bytes", [](ExprCore& c, int64_t e, const nb::bytes& data) {
            const int32_t s = checked(c, e, "derive_bytes");
            const std::string bytes(data.c_str(), data.size());
            return locked(c, [&] { return c.derive_bytes(s, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()); });
        })
        .def("step_bytes", [](ExprCore& c, int64_t e, const nb::bytes& data) {
            const int32_t s = checked(c, e, "step_bytes");
            const std::string bytes(data.c_str(), data.size());
            return locked(c, [&] { return c.step_bytes(s, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()); });
        })
        .def("forced_bytes", [](ExprCore& c, int64_t e, size_t max_bytes) {
            const int32_t s = checked(c, e, "forced_bytes");
            const std::string out = locked(c, [&] { return c.forced_bytes(s, max_bytes); });
            return nb::bytes(out.data(), out.size());
        })
        .def("byte_classes", [](ExprCore& c, int64_t e) {
            const int32_t s = checked(c, e, "byte_classes");
            const auto parts = locked(c, [&] { return c.byte_classes(s); });
            nb::list out;
            for (const ByteSet& p : parts) out.append(as_int(p.data(), 4));
            return nb::tuple(out);
        })
        .def("first_bytes", [](ExprCore& c, int64_t e) {
            const int32_t s = checked(c, e, "first_bytes");
            const ByteSet got = locked(c, [&] { return c.first_bytes(s); });
            return as_int(got.data(), 4);
        })
        .def("min_completion", on_state<&ExprCore::min_completion>("min_completion"))
        .def("_min_bound", on_state<&ExprCore::min_bound>("_min_bound"))
        .def("is_live", on_state<&ExprCore::is_live>("is_live"))
        .def("clamp", [](ExprCore& c, int64_t e, int64_t limit) {
            const int32_t s = checked(c, e, "clamp");
            if (limit < 1) throw nb::value_error("ExprCore.clamp: the limit is at least 1");
            return locked(c, [&] { return c.clamp(s, limit); });
        }, "e"_a, "limit"_a)
        .def("seq", [](ExprCore& c, int64_t a, int64_t b) {
            const int32_t x = checked(c, a, "seq"), y = checked(c, b, "seq");
            return locked(c, [&] { return c.seq(x, y); });
        })
        .def("alt", [](ExprCore& c, const std::vector<int64_t>& items) {
            std::vector<int32_t> members;
            for (int64_t e : items) members.push_back(checked(c, e, "alt"));
            return locked(c, [&] { return c.alt(members); });
        }, "items"_a, "The union of ``items`` (no items: the empty language).")
        .def("alternatives", [](ExprCore& c, int64_t e) -> nb::object {
            const int32_t s = checked(c, e, "alternatives");
            std::vector<int32_t> out;
            if (!locked(c, [&] { return c.alternatives(s, out); })) return nb::none();
            nb::list members;
            for (int32_t m : out) members.append(m);
            return nb::tuple(members);
        })
        .def("split", [](ExprCore& c, int64_t e) -> nb::object {
            const int32_t s = checked(c, e, "split");
            const auto parts = locked(c, [&] {
                return c.kind(s) == constrain::K_SEQ ? std::make_pair(c.args(s)[0], c.args(s)[1])
                                                     : std::make_pair(int64_t(-1), int64_t(-1));
            });
            if (parts.first < 0) return nb::none();
            return nb::make_tuple(parts.first, parts.second);
        })
        .def("spine", [](ExprCore& c, int64_t e) {
            const int32_t s = checked(c, e, "spine");
            return locked(c, [&] { return c.spine(s); });
        })
        .def("is_framed", [](ExprCore& c, int64_t e) {
            const int32_t s = checked(c, e, "is_framed");
            return locked(c, [&] {
                return c.kind(s) == constrain::K_SEQ && c.kind(static_cast<int32_t>(c.args(s)[0])) == constrain::K_FRAME;
            });
        })
        .def("is_byte_set", [](ExprCore& c, int64_t e) {
            const int32_t s = checked(c, e, "is_byte_set");
            return locked(c, [&] { return c.kind(s) == constrain::K_BYTES; });
        })
        .def("node", &node, "e"_a, "``(kind, args)`` of expression ``e``, as the Python table's ``node``.")
        .def("ensure_rows", [](ExprCore& c, nb::handle states) {
            std::vector<int32_t> todo;
            for (nb::handle s : nb::iter(states)) todo.push_back(checked(c, nb::cast<int64_t>(s), "ensure_rows"));
            locked(c, [&] {
                for (int32_t s : todo) c.ensure_row(s);
            });
        })
        .def("row", [](ExprCore& c, int64_t e) {
            const int32_t s = checked(c, e, "row");
            const auto buffers = locked(c, [&] {
                c.ensure_row(s);
                return c.buffers();
            });
            auto copy = std::make_unique<int32_t[]>(256);
            std::memcpy(copy.get(), buffers.rows.get() + static_cast<size_t>(s) * 256, 256 * sizeof(int32_t));
            return to_numpy(std::move(copy), 256);
        })
        .def_prop_ro("rows", [](ExprCore& c) {
            const auto b = locked(c, [&] { return c.buffers(); });
            return shared_view(b.rows, b.capacity, 256);
        }, nb::rv_policy::reference, "The transition rows (int32[capacity, 256], read-only use): a view that stays valid as the table grows.")
        .def_prop_ro("row_done", [](ExprCore& c) {
            const auto b = locked(c, [&] { return c.buffers(); });
            return shared_view(b.done, b.capacity);
        }, nb::rv_policy::reference)
        .def_prop_ro("row_nullable", [](ExprCore& c) {
            const auto b = locked(c, [&] { return c.buffers(); });
            return shared_view(b.nullable, b.capacity);
        }, nb::rv_policy::reference);
}

}  // namespace

NB_MODULE(_core, m) {
    bind_expr_core(m);
    m.def("write_row", [](uintptr_t address, size_t width, const Words& words) {
        const size_t n = std::min(width, words.shape(0));
        auto* row = reinterpret_cast<int32_t*>(address);
        std::memcpy(row, words.data(), n * sizeof(int32_t));
        std::memset(row + n, 0, (width - n) * sizeof(int32_t));
    }, "address"_a, "width"_a, "words"_a.noconvert(),
          "Copy ``words`` into the ``width`` int32 words at ``address`` (a CPU tensor's row: the caller checked it), "
          "zeros after them.");
    m.doc() = "The token automaton's hot path in C++ (the Python automaton is its reference twin).";
    nb::class_<Slice>(m, "Slice",
                      "A region's slice of a vocabulary (``PackedTrie.slice``): the tokens whose bytes keep to the "
                      "region from its state 0, and, below the root's children, the tokens whose further bytes keep "
                      "to it and the nodes where the bytes leave it.")
        .def_prop_ro("exit_count", [](const Slice& s) { return s.exits.size(); }, "Nodes where a token leaves the set.")
        .def_prop_ro("token_count", [](const Slice& s) { return s.token_ids.size(); },
                     "Tokens of two bytes or more whose bytes after the first keep to the region.");
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
        .def("mask", &mask, "table"_a, "start"_a, "slices"_a = true,
             "The mask words of the tokens allowed from ``start``. With ``slices``, a state that ``start`` leads to "
             "(or ``start`` itself) looping on many bytes lends its slice: the same words, fewer nodes walked.")
        .def("head_mask", &head_mask, "table"_a, "start"_a, "slices"_a = true,
             "``mask`` and where a token may leave ``start``'s language: every node (live or not) entered from a "
             "state that may end there, and that state, as int32 arrays in depth-first order.")
        .def("slice", &make_slice, "next"_a.noconvert(),
             "The slice of a region (int8[states, 256]: the state after each byte, -1 where the bytes leave "
             "it; state 0 is the one a walk skips from), made once and kept with the trie.")
        .def_prop_ro("nbytes", &PackedTrie::nbytes, "Bytes held: the nodes and the slices kept.")
        .def("mask_below", &mask_below, "table"_a, "nodes"_a.noconvert(), "parents"_a.noconvert(),
             "The mask words of the tokens allowed at or below each of ``nodes`` (int32, none in another's "
             "subtree), entered from the state ``parents[i]`` at the node's parent.")
        .def("outermost", &outermost, "nodes"_a.noconvert(), "bytes"_a.noconvert(),
             "Positions in ``nodes`` (int32, depth-first order) of those whose byte is set in ``bytes`` (bool[256]) "
             "and that lie below no earlier such node.")
        .def("path", &path, "node"_a, "The bytes from the root to ``node``, inclusive.");
}
