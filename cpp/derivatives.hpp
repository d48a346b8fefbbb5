// Brzozowski derivatives over the grammar IR in C++: the twin of constrain/derivatives.py.
//
// The same hash-consed expression table, smart constructors, derivatives, nullability, byte
// classes, shortest completions, liveness searches and dense transition rows as the Python
// ExprTable, with the same contract (constrain.derivatives' docstrings say why each exists).
// Expression ids differ from the Python table's (interning order differs); languages, masks and
// lengths do not. The IR arrives flattened (constrain/native_derivatives.py) and rule bodies are
// converted lazily, as in the twin. Thread-safe: every public method takes the table's mutex;
// none of them touches Python objects while holding it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "flat_map.hpp"
#include "inline_vec.hpp"
#include "packed_trie.hpp"

namespace constrain {

using ByteSet = std::array<uint64_t, 4>;

enum Kind : uint8_t { K_NOTHING, K_EMPTY, K_BYTES, K_SEQ, K_ALT, K_AND, K_NOT, K_REPEAT, K_REF, K_FRAME, K_UNORDERED };
// Kinds of flattened IR nodes (constrain/native_derivatives.py writes them).
enum IrKind : int32_t { IR_BYTES, IR_SEQ, IR_ALT, IR_AND, IR_NOT, IR_REPEAT, IR_REF, IR_UNORDERED };

constexpr int32_t NOTHING = 0;
constexpr int32_t EMPTY = 1;
constexpr double INF = std::numeric_limits<double>::infinity();

// What the Python side turns into its own exceptions (GrammarError, BudgetExceededError, ...).
// Recursion through a complement (grammars.analysis.complement_cycle_error): rule `rule` uses rule
// `used` of its own cycle inside a Not. The binding names them.
struct ComplementCycle : std::exception {
    int32_t rule, used;
    ComplementCycle(int32_t r, int32_t u) : rule(r), used(u) {}
    const char* what() const noexcept override { return "recursion through a complement"; }
};

struct CoreError : std::exception {
    enum Code { GRAMMAR, NESTING, SECONDS, MAX_BYTES, MAX_STATES } code;
    double limit;
    std::string message;
    CoreError(Code c, double l, std::string m) : code(c), limit(l), message(std::move(m)) {}
    const char* what() const noexcept override { return message.c_str(); }
};

// The IR as flat arrays: node i has kind[i], children[offsets[i] .. offsets[i+1]) and the
// parameters p0/p1 (Repeat: min, max or -1; Ref: rule or -1 when undefined, then p1 indexes
// undefined_names; Unordered: min, max or -1). The k-th Bytes node's set is masks[k], the k-th
// Unordered node's required items are required[k]; an Unordered node's children are its items,
// then extra, first, sep, last. rule_nodes[r] is rule r's body.
struct FlatIr {
    std::vector<int32_t> kind, offsets, children;
    std::vector<int64_t> p0, p1;
    std::vector<ByteSet> masks;
    std::vector<std::vector<uint64_t>> required;
    std::vector<int32_t> rule_nodes;
    std::vector<std::string> undefined_names;  // as Python's repr() of the name
};

// The nodes open in a recursion that cuts cycles (nullable, byte_classes): per expression, the
// depth it opened at (-1: not open), and how many are open.
struct OpenNodes {
    std::vector<int32_t> depth;
    int64_t count = 0;
};

struct Budget {
    double seconds;
    double max_bytes;
    int64_t max_states;
    int max_nesting;
    int64_t max_repeat;  // grammars.analysis.MAX_REPEAT: the most iterations a repetition may require
};

// A filled-rows snapshot for walks: shared buffers stay alive while a walk reads them.
struct RowBuffers {
    std::shared_ptr<int32_t[]> rows;
    std::shared_ptr<bool[]> done, nullable;
    size_t capacity = 0;
    RowTable view() const { return {rows.get(), done.get(), nullable.get(), capacity}; }
};

class ExprCore {
public:
    ExprCore(FlatIr ir, Budget budget);

    std::recursive_mutex& mutex() { return mutex_; }

    // Units of work (a first compile, a new state's mask): the outermost sets the deadline.
    void begin_work();
    void end_work();

    // The shortest string of each rule (INF: unproductive), as grammars.analysis.measure_rules
    // finds it with `exact` searching the derivatives of intersections and complements: a first
    // pass takes each at a lower bound (the longest member; 0), a second measures again, exactly,
    // the rules whose length took one, each strongly connected component after the rules it
    // uses (their exact lengths are the table's by then). The table's lengths are the exact ones
    // afterwards; returns the first pass's, whose INF marks a rule empty by its structure alone.
    std::vector<double> measure_rules();
    std::vector<double> rule_lengths() const { return rule_min_; }
    int32_t convert(int32_t node);        // intern flat IR node `node`
    int32_t ref(int32_t rule);            // the start state of a rule (NOTHING if unproductive)

    size_t size() const { return exprs_.size(); }
    size_t estimated_bytes() const;

    // Semantics (constrain/derivatives.py has the docstrings).
    bool nullable(int32_t e);
    int32_t derive(int32_t e, int b);
    int32_t derive_bytes(int32_t e, const uint8_t* data, size_t n);
    std::vector<ByteSet> byte_classes(int32_t e);
    ByteSet first_bytes(int32_t e);
    double min_completion(int32_t e);
    double min_bound(int32_t e);
    bool is_live(int32_t e);
    int32_t clamp(int32_t e, int64_t limit);
    int32_t seq(int32_t a, int32_t b) { return mk_seq(a, b); }
    int32_t alt(const std::vector<int32_t>& items) { return mk_alt(items); }
    bool alternatives(int32_t e, std::vector<int32_t>& out);
    int32_t step_bytes(int32_t e, const uint8_t* data, size_t n);
    std::string forced_bytes(int32_t e, size_t max_bytes);

    // Structure, for the Python side (signatures, masks of unions and splits).
    Kind kind(int32_t e) const { return static_cast<Kind>(exprs_[e].kind); }
    const int64_t* args(int32_t e) const { return pool_.data() + exprs_[e].off; }
    uint32_t arg_count(int32_t e) const { return exprs_[e].len; }
    std::vector<int32_t> spine(int32_t e) const;
    int32_t rule_body(int32_t rule);  // what a reference to `rule` expands to

    // Rows.
    void ensure_row(int32_t s);
    RowBuffers buffers() const { return buffers_; }
    bool has_row(int32_t s) const { return static_cast<size_t>(s) < buffers_.capacity && buffers_.done[s]; }

private:
    struct Expr {
        uint8_t kind;
        bool boolean;  // contains And/Not: language may be empty though not NOTHING
        bool counted;  // contains a repetition with counted bounds
        int8_t null;   // -1 unknown
        uint32_t off, len;
    };
    struct Unordered {
        std::vector<int32_t> items;
        std::vector<uint64_t> required;
        int32_t extra, first, sep, last;
        int64_t lo, hi;  // hi -1: unbounded
        std::vector<double> item_mins;
        double part_mins[4];  // extra, first, sep, last
        size_t words;         // of a `seen` bitset
    };

    // Interning.
    int32_t intern(uint8_t kind, const int64_t* a, uint32_t n, int8_t null, bool boolean);
    void rehash();
    uint64_t hash_of(uint8_t kind, const int64_t* a, uint32_t n) const;
    void check_budget() const;
    void check_ir();  // checks the flat IR and sizes the per-node arrays

    int32_t mk_bytes(const ByteSet& m);
    int32_t mk_seq(int32_t a, int32_t b);
    int32_t mk_alt(const int32_t* items, size_t n);
    int32_t mk_alt(const std::vector<int32_t>& items) { return mk_alt(items.data(), items.size()); }
    int32_t mk_and(const int32_t* items, size_t n);
    int32_t mk_and(const std::vector<int32_t>& items) { return mk_and(items.data(), items.size()); }
    int32_t mk_not(int32_t a);
    int32_t mk_repeat(int32_t a, int64_t lo, int64_t hi);
    int32_t mk_frame(int32_t e);
    int32_t mk_ref(int32_t rule);
    int32_t mk_unordered(int32_t d, const uint64_t* seen, int64_t count);
    double unordered_min(int32_t d, const uint64_t* seen, int64_t count) const;
    int32_t expand_unordered(int32_t e);
    ByteSet unordered_first(int32_t e);
    // A measure of IR nodes' shortest strings (grammars.analysis.MinLength): the rules' lengths it
    // reads references from; per node the length found (valid for good where the node holds no
    // reference, else for this round: lengths inside a cycle are still falling) and whether it
    // took a lower bound (an intersection or complement, unless they are searched: `exact`).
    struct RuleMeasure {
        bool exact;
        std::vector<double>& lengths;
        std::vector<double> value;
        std::vector<uint32_t> round;  // 0: not measured
        std::vector<uint8_t> took;
        std::vector<int32_t> visited;  // check_complements: the rule whose body last visited the node
        uint32_t now = 1;
        bool took_any = false;
        RuleMeasure(bool exact_, std::vector<double>& lengths_, size_t nodes)
            : exact(exact_), lengths(lengths_) { resize(nodes); }
        void resize(size_t nodes) { value.resize(nodes), round.resize(nodes, 0), took.resize(nodes, 0), visited.resize(nodes, -1); }
    };
    double rule_ir_min(int32_t node, RuleMeasure& m);
    bool measure_component(const std::vector<int32_t>& comp, bool self_loop, RuleMeasure& m);
    void check_complements(const std::vector<int32_t>& comp, std::vector<int32_t>& visited);  // throws ComplementCycle
    void forget_completions();  // the shortest completions found, once the rules' lengths change
    int32_t body(int32_t rule);
    std::vector<int32_t> members(int32_t e) const;  // Alt/And members, or e itself
    template <class Out>
    void spine_into(int32_t e, Out& out) const {  // spine(e), into any list (an InlineVec: no allocation)
        for (; kind(e) == K_SEQ; e = static_cast<int32_t>(args(e)[1])) out.push_back(static_cast<int32_t>(args(e)[0]));
        out.push_back(e);
    }
    // visit(m) for each part of e's spine in order, until it returns false. The arguments are
    // re-read at each step: a visit may intern expressions and move them.
    template <class Visit>
    void each_in_spine(int32_t e, Visit&& visit) {
        for (;; e = static_cast<int32_t>(args(e)[1])) {
            const bool seq = kind(e) == K_SEQ;
            if (!visit(seq ? static_cast<int32_t>(args(e)[0]) : e) || !seq) return;
        }
    }

    // e's byte classes: in the pool where they are cached (valid until it grows), else in `uncached`.
    const ByteSet* classes_of(int32_t e, std::vector<ByteSet>& uncached, size_t& n);
    int32_t d(int32_t e, int b);
    int32_t derive_uncached(int32_t e, int b);
    double search_min(int32_t e);
    double boolean_bound(int32_t e);
    template <bool Exact>
    double structural_min(int32_t e);
    bool search_live(int32_t e);
    bool witness_live(int32_t e);  // life proven by a member's shortest string
    bool shortest_string(int32_t e, std::vector<uint8_t>& out);
    // Exact clamping inside an intersection (constrain/derivatives.py, ExprTable.clamp).
    int32_t clamp_intersection(int32_t e, int64_t limit);
    // e with each repetition's counts by rule(m, lo, hi) (false: give up, -1 returned), each
    // intersection clamped at clamp_at (-1: its members rebuilt alike); ExprTable._recount.
    template <class Rule>
    int32_t recount(int32_t e, const Rule& rule, FlatMap& memo, int64_t clamp_at);
    int64_t closure_bound(int32_t u);  // the longest shortest completion over u's closure; -1 if too large
    void fill_row(int32_t s);
    void grow(size_t need);

    FlatIr ir_;
    Budget budget_;
    size_t n_masks_ = 0, n_unordered_ = 0;
    std::recursive_mutex mutex_;
    int work_depth_ = 0;
    std::chrono::steady_clock::time_point deadline_{};
    bool has_deadline_ = false;
    int level_ = 0;

    std::vector<Expr> exprs_;
    std::vector<int64_t> pool_;
    std::vector<uint64_t> hashes_;
    // Open addressing over expression ids: a slot holds the high half of the id's hash above the id,
    // so a probe reads the expression only where the hashes agree.
    std::vector<uint64_t> slots_;
    static constexpr uint64_t EMPTY_SLOT = ~0ull;
    static uint64_t slot_of(uint64_t hash, int32_t id) { return (hash & ~0xffffffffull) | static_cast<uint32_t>(id); }
    std::vector<Unordered> unordered_;
    std::vector<int32_t> converted_;  // per flat node, -1 not yet
    std::vector<int32_t> rule_body_;  // per rule, -1 not yet
    std::vector<double> rule_min_;
    std::vector<uint8_t> has_ref_;  // per flat node: whether it holds a reference to a rule
    RuleMeasure lengths_{true, rule_min_, 0};  // exact, over the rules' lengths (an Unordered node's parts)
    std::vector<int32_t> aux_;  // per flat node: a Bytes node's index in masks, an Unordered's in required

    FlatMap deriv_;  // e * 256 + byte -> derivative
    std::unordered_set<int64_t> deriving_;
    // Per-expression caches, grown with exprs_.
    std::vector<ByteSet> first_;
    std::vector<uint8_t> first_known_;  // 1 known, 2 being computed (a left recursion cycle), 0 neither
    // Per expression, its byte classes in class_pool_ (offset, -1 none; count): one array for
    // all, where a vector per expression cost a free each when a grown grammar was evicted.
    std::vector<int32_t> classes_;
    std::vector<uint16_t> class_count_;
    std::vector<ByteSet> class_pool_;
    std::vector<double> min_, bound_;  // NaN unknown
    std::vector<int8_t> live_;         // -1 unknown
    std::vector<int32_t> unordered_body_;
    // Flat maps, freed at once (see flat_map.hpp): each closure explored leaves up to
    // MAX_CLOSURE_STATES bounds, and each clamp an entry per expression it rebuilt.
    std::unordered_map<int64_t, FlatMap> clamped_;  // limit -> e -> clamped e
    FlatMap closure_bound_;
    OpenNodes null_open_, class_open_;
    int64_t null_cut_, class_cut_;

    RowBuffers buffers_;
    // Rows filled: what the memory accounting counts (a row never filled stays an untouched zero
    // page of the buffers: their capacity would count ~15x a compiled schema's real memory).
    size_t rows_filled_ = 2;  // NOTHING's and EMPTY's
};

}  // namespace constrain
