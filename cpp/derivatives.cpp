#include "derivatives.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <utility>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

namespace constrain {

namespace {

constexpr ByteSet ALL_BYTES = {~0ull, ~0ull, ~0ull, ~0ull};
constexpr int64_t NO_CUT = int64_t(1) << 62;
constexpr size_t LIVENESS_BUDGET = 4096;  // as constrain.derivatives
constexpr size_t MAX_WITNESS_BYTES = 64;  // as constrain.derivatives
constexpr size_t BUDGET_CHECK_EVERY = 256;
constexpr size_t MAX_CLOSURE_STATES = 8192;  // as constrain.derivatives
constexpr int MAX_CLAMP_ROUNDS = 4;  // as constrain.derivatives
constexpr size_t EXPR_BYTES = 400;  // the twin's accounting, so both hit the memory budget alike
constexpr size_t MAPPED_BYTES = size_t(1) << 20;  // zeroed arrays from this size are mapped pages (see zeroed)
constexpr size_t ROW_BYTES = 256 * 4 + 2;
constexpr size_t ENTRY_BYTES = 64;  // an entry of the clamp and closure caches
const double UNKNOWN = std::nan("");

bool test(const ByteSet& m, int b) { return m[b >> 6] >> (b & 63) & 1; }
bool any(const ByteSet& m) { return (m[0] | m[1] | m[2] | m[3]) != 0; }
ByteSet operator|(ByteSet a, const ByteSet& b) {
    for (int i = 0; i < 4; ++i) a[i] |= b[i];
    return a;
}
ByteSet operator&(ByteSet a, const ByteSet& b) {
    for (int i = 0; i < 4; ++i) a[i] &= b[i];
    return a;
}
int lowest(const ByteSet& m) {
    for (int i = 0; i < 4; ++i)
        if (m[i]) return i * 64 + __builtin_ctzll(m[i]);
    return -1;
}
bool bit(const uint64_t* words, size_t n, size_t j) { return j / 64 < n && (words[j / 64] >> (j % 64) & 1); }

// ir.unordered_min_length: the required items still missing, then the cheapest others until
// `lo` members are reached, with their separators.
double unordered_length(const std::vector<double>& item_mins, const std::vector<uint64_t>& required, double extra,
                        double first, double sep, double last, int64_t lo, int64_t hi, const uint64_t* seen,
                        size_t seen_words, int64_t count) {
    double need = 0;
    int64_t n_req = 0;
    std::vector<double> optional;
    for (size_t j = 0; j < item_mins.size(); ++j) {
        if (bit(seen, seen_words, j)) continue;
        if (bit(required.data(), required.size(), j)) {
            need += item_mins[j];
            ++n_req;
        } else if (item_mins[j] < INF) {
            optional.push_back(item_mins[j]);
        }
    }
    const int64_t more = std::max<int64_t>(lo - count - n_req, 0);
    const int64_t total = n_req + more;
    if (hi >= 0 && count + total > hi) return INF;
    if (more) {
        optional.insert(optional.end(), static_cast<size_t>(more), extra);
        std::partial_sort(optional.begin(), optional.begin() + more, optional.end());
        for (int64_t i = 0; i < more; ++i) need += optional[i];
    }
    if (total == 0) return count == 0 ? 0 : last;
    return need + (count == 0 ? first + static_cast<double>(total - 1) * sep : static_cast<double>(total) * sep) + last;
}

// A zeroed array. A large one is mapped from the system, so its pages stay untouched (and free)
// until a row is written: calloc promises that only for fresh memory, and once malloc's mmap
// threshold has risen (it does after the first large frees) it hands out reused heap memory and
// clears all of it: 15-40 ms for the rows of a grammar of 20,000-100,000 expressions.
template <class T>
std::shared_ptr<T[]> zeroed(size_t n) {
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(T);
#if defined(__unix__) || defined(__APPLE__)
    if (bytes >= MAPPED_BYTES) {
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        return std::shared_ptr<T[]>(static_cast<T*>(p), [bytes](T* q) { munmap(q, bytes); });
    }
#endif
    T* p = static_cast<T*>(std::calloc(bytes / sizeof(T), sizeof(T)));
    if (p == nullptr) throw std::bad_alloc();
    return std::shared_ptr<T[]>(p, [](T* q) { std::free(q); });
}

std::string format_g(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

}  // namespace

// One more level of recursion for the methods that descend (the twin's _descend).
struct Level {
    explicit Level(int& level, int max_nesting) : level_(level) {
        if (++level_ > max_nesting) {
            --level_;
            throw CoreError(CoreError::NESTING, max_nesting, "nesting");
        }
    }
    ~Level() { --level_; }
    int& level_;
};

// A node open in a recursion that cuts cycles through rules (nullable, byte_classes): the depth it
// opened at; what was computed under a cut at an enclosing node assumed that node's answer, so
// `close` says whether this node's answer may be cached (the twin's _null_cut / _class_cut).
struct CutScope {
    CutScope(OpenNodes& open, int64_t& cut, int32_t e) : open_(open), cut_(cut), e_(e), depth_(open.count), outer_(cut) {
        open_.depth[e] = static_cast<int32_t>(depth_);
        ++open_.count;
        cut_ = NO_CUT;
    }
    ~CutScope() {
        if (!closed_) close();
    }
    bool close() {
        closed_ = true;
        open_.depth[e_] = -1;
        --open_.count;
        const int64_t cut = cut_;
        cut_ = std::min(outer_, cut < depth_ ? cut : NO_CUT);
        return cut >= depth_;
    }
    OpenNodes& open_;
    int64_t& cut_;
    int32_t e_;
    int64_t depth_, outer_;
    bool closed_ = false;
};

ExprCore::ExprCore(FlatIr ir, Budget budget)
    : ir_(std::move(ir)), budget_(budget), null_cut_(NO_CUT), class_cut_(NO_CUT) {
    check_ir();
    rule_body_.assign(ir_.rule_nodes.size(), -1);
    rule_min_.assign(ir_.rule_nodes.size(), INF);
    slots_.assign(1024, EMPTY_SLOT);
    intern(K_NOTHING, nullptr, 0, 0, false);
    intern(K_EMPTY, nullptr, 0, 1, false);
    grow(1024);
    buffers_.nullable[EMPTY] = true;
    buffers_.done[NOTHING] = buffers_.done[EMPTY] = true;
}

void ExprCore::check_ir() {
    const size_t n = ir_.kind.size();
    if (ir_.offsets.size() != n + 1 || ir_.p0.size() != n || ir_.p1.size() != n)
        throw std::invalid_argument("ExprCore: kind, offsets (one more), p0 and p1 must describe the same nodes");
    if (ir_.offsets.back() != static_cast<int32_t>(ir_.children.size()))
        throw std::invalid_argument("ExprCore: offsets must end at the number of children");
    aux_.assign(n, -1);
    has_ref_.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
        if (ir_.offsets[i] > ir_.offsets[i + 1]) throw std::invalid_argument("ExprCore: offsets must not decrease");
        for (int32_t c = ir_.offsets[i]; c < ir_.offsets[i + 1]; ++c)
            if (ir_.children[c] < 0 || static_cast<size_t>(ir_.children[c]) >= i)
                throw std::invalid_argument("ExprCore: a child must come before its parent");
        const int32_t arity = ir_.offsets[i + 1] - ir_.offsets[i];
        has_ref_[i] = ir_.kind[i] == IR_REF;
        for (int32_t c = ir_.offsets[i]; c < ir_.offsets[i + 1] && !has_ref_[i]; ++c) has_ref_[i] = has_ref_[ir_.children[c]];
        switch (ir_.kind[i]) {
            case IR_BYTES: aux_[i] = static_cast<int32_t>(n_masks_++); break;
            case IR_UNORDERED:
                if (arity < 4) throw std::invalid_argument("ExprCore: an Unordered node needs extra, first, sep, last");
                aux_[i] = static_cast<int32_t>(n_unordered_++);
                break;
            case IR_NOT:
            case IR_REPEAT:
                if (arity != 1) throw std::invalid_argument("ExprCore: Not and Repeat nodes have one child");
                break;
            case IR_REF:
                if (ir_.p0[i] >= static_cast<int64_t>(ir_.rule_nodes.size()) ||
                    (ir_.p0[i] < 0 && (ir_.p1[i] < 0 || ir_.p1[i] >= static_cast<int64_t>(ir_.undefined_names.size()))))
                    throw std::invalid_argument("ExprCore: a Ref names no rule");
                break;
            case IR_SEQ:
            case IR_ALT:
            case IR_AND: break;
            default: throw std::invalid_argument("ExprCore: unknown IR kind " + std::to_string(ir_.kind[i]));
        }
    }
    if (n_masks_ != ir_.masks.size() || n_unordered_ != ir_.required.size())
        throw std::invalid_argument("ExprCore: one mask per Bytes node and one required set per Unordered node");
    for (int32_t r : ir_.rule_nodes)
        if (r < 0 || r >= static_cast<int32_t>(n)) throw std::invalid_argument("ExprCore: a rule's node is out of range");
    converted_.assign(n, -1);
    lengths_.resize(n);
}

void ExprCore::begin_work() {
    if (work_depth_++ == 0) {
        deadline_ = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(budget_.seconds));
        has_deadline_ = true;
    }
}

void ExprCore::end_work() {
    if (work_depth_ > 0 && --work_depth_ == 0) has_deadline_ = false;
}

size_t ExprCore::estimated_bytes() const {
    size_t entries = closure_bound_.size();
    for (const auto& [limit, memo] : clamped_) entries += memo.size();
    return exprs_.size() * EXPR_BYTES + rows_filled_ * ROW_BYTES + entries * ENTRY_BYTES;
}

void ExprCore::check_budget() const {
    if (has_deadline_ && std::chrono::steady_clock::now() > deadline_)
        throw CoreError(CoreError::SECONDS, budget_.seconds,
                        "compiling took more than " + format_g(budget_.seconds) + " s");
    const size_t used = estimated_bytes();
    if (static_cast<double>(used) > budget_.max_bytes)
        throw CoreError(CoreError::MAX_BYTES, budget_.max_bytes,
                        "the automaton needs about " + std::to_string(used >> 20) + " MiB");
}

void ExprCore::forget_completions() {
    std::fill(min_.begin(), min_.end(), UNKNOWN);
    std::fill(bound_.begin(), bound_.end(), UNKNOWN);
}

// ---------------------------------------------------------------------------------- interning

uint64_t ExprCore::hash_of(uint8_t kind, const int64_t* a, uint32_t n) const {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ kind;
    for (uint32_t i = 0; i < n; ++i) {
        h ^= static_cast<uint64_t>(a[i]) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 29);
}

void ExprCore::rehash() {
    std::vector<uint64_t> slots(slots_.size() * 2, EMPTY_SLOT);
    const size_t mask = slots.size() - 1;
    for (size_t id = 0; id < exprs_.size(); ++id) {
        size_t i = hashes_[id] & mask;
        while (slots[i] != EMPTY_SLOT) i = (i + 1) & mask;
        slots[i] = slot_of(hashes_[id], static_cast<int32_t>(id));
    }
    slots_.swap(slots);
}

int32_t ExprCore::intern(uint8_t kind, const int64_t* a, uint32_t n, int8_t null, bool boolean) {
    if (n && a >= pool_.data() && a < pool_.data() + pool_.size()) {  // the pool may move below
        const std::vector<int64_t> copy(a, a + n);
        return intern(kind, copy.data(), n, null, boolean);
    }
    const uint64_t h = hash_of(kind, a, n);
    const size_t mask = slots_.size() - 1;
    size_t i = h & mask;
    const uint64_t tag = slot_of(h, 0);
    for (; slots_[i] != EMPTY_SLOT; i = (i + 1) & mask) {
        if ((slots_[i] & ~0xffffffffull) != tag) continue;  // another hash: no need to read the expression
        const int32_t id = static_cast<int32_t>(slots_[i] & 0xffffffff);
        const Expr& x = exprs_[id];
        if (hashes_[id] == h && x.kind == kind && x.len == n && std::equal(a, a + n, pool_.data() + x.off)) return id;
    }
    const size_t id = exprs_.size();
    if (static_cast<int64_t>(id) >= budget_.max_states)
        throw CoreError(CoreError::MAX_STATES, static_cast<double>(budget_.max_states),
                        "the constraint needs more than " + std::to_string(budget_.max_states) + " automaton states");
    if (id && id % BUDGET_CHECK_EVERY == 0) check_budget();
    exprs_.push_back({kind, boolean, false, null, static_cast<uint32_t>(pool_.size()), n});
    pool_.insert(pool_.end(), a, a + n);
    hashes_.push_back(h);
    first_.push_back({});
    first_known_.push_back(0);
    classes_.push_back(-1);
    class_count_.push_back(0);
    min_.push_back(UNKNOWN);
    bound_.push_back(UNKNOWN);
    live_.push_back(-1);
    unordered_body_.push_back(-1);
    null_open_.depth.push_back(-1);
    class_open_.depth.push_back(-1);
    if ((id + 1) * 2 > slots_.size())
        rehash();
    else
        slots_[i] = slot_of(h, static_cast<int32_t>(id));
    return static_cast<int32_t>(id);
}

std::vector<int32_t> ExprCore::members(int32_t e) const {
    const Kind k = kind(e);
    if (k != K_ALT && k != K_AND) return {e};
    const int64_t* a = args(e);
    return std::vector<int32_t>(a, a + arg_count(e));
}

std::vector<int32_t> ExprCore::spine(int32_t e) const {
    std::vector<int32_t> parts;
    spine_into(e, parts);
    return parts;
}

int32_t ExprCore::mk_bytes(const ByteSet& m) {
    if (!any(m)) return NOTHING;
    int64_t a[4];
    std::memcpy(a, m.data(), sizeof a);
    return intern(K_BYTES, a, 4, 0, false);
}

int32_t ExprCore::mk_seq(int32_t a, int32_t b) {
    if (a == NOTHING || b == NOTHING) return NOTHING;
    if (a == EMPTY) return b;
    if (b == EMPTY) return a;
    if (kind(a) == K_SEQ) {  // keep sequences right-nested: (x y) z -> x (y z)
        InlineVec<int32_t, 16> parts;
        spine_into(a, parts);
        b = mk_seq(parts.back(), b);
        for (size_t i = parts.size() - 1; i-- > 0;) b = mk_seq(parts[i], b);
        return b;
    }
    const int8_t na = exprs_[a].null, nb = exprs_[b].null;
    const int8_t null = na < 0 || nb < 0 ? -1 : (na && nb);
    const int64_t ab[2] = {a, b};
    const int32_t out = intern(K_SEQ, ab, 2, null, exprs_[a].boolean || exprs_[b].boolean);
    exprs_[out].counted = exprs_[out].counted || exprs_[a].counted || exprs_[b].counted;
    return out;
}

int32_t ExprCore::mk_alt(const int32_t* items, size_t n) {
    if (n == 1 && kind(items[0]) != K_ALT) return items[0];
    InlineVec<int32_t, 16> flat;
    ByteSet mask{};
    for (size_t i = 0; i < n; ++i) {
        const bool nested = kind(items[i]) == K_ALT;
        for (uint32_t j = 0, count = nested ? arg_count(items[i]) : 1; j < count; ++j) {
            const int32_t p = nested ? static_cast<int32_t>(args(items[i])[j]) : items[i];
            if (p == NOTHING) continue;
            if (kind(p) == K_BYTES) {
                ByteSet m;
                std::memcpy(m.data(), args(p), sizeof m);
                mask = mask | m;
            } else {
                flat.push_back(p);
            }
        }
    }
    flat.sort_unique();
    // Left-factor sequences sharing a head: x a | x b -> x (a | b).
    struct Headed {
        int64_t head;
        int32_t seq;
        bool operator<(const Headed& o) const { return head < o.head || (head == o.head && seq < o.seq); }
    };
    InlineVec<Headed, 16> by_head;
    for (int32_t p : flat)
        if (kind(p) == K_SEQ) by_head.push_back({args(p)[0], p});
    std::sort(by_head.begin(), by_head.end());
    InlineVec<int32_t, 16> factored, gone;
    for (size_t i = 0; i < by_head.size();) {
        size_t j = i;
        while (j < by_head.size() && by_head[j].head == by_head[i].head) ++j;
        if (j - i > 1) {
            InlineVec<int32_t, 16> tails;
            for (size_t g = i; g < j; ++g) {
                tails.push_back(static_cast<int32_t>(args(by_head[g].seq)[1]));
                gone.push_back(by_head[g].seq);
            }
            factored.push_back(mk_seq(static_cast<int32_t>(by_head[i].head), mk_alt(tails.data(), tails.size())));
        }
        i = j;
    }
    if (!gone.empty()) {
        gone.sort_unique();
        size_t kept = 0;
        for (int32_t p : flat)
            if (!std::binary_search(gone.begin(), gone.end(), p)) flat[kept++] = p;
        flat.truncate(kept);
        flat.append(factored.begin(), factored.end());
    }
    if (any(mask)) flat.push_back(mk_bytes(mask));
    flat.sort_unique();
    if (flat.empty()) return NOTHING;
    if (flat.size() == 1) return flat[0];
    int8_t null = 0;
    bool boolean = false, counted = false;
    InlineVec<int64_t, 16> a;
    for (int32_t m : flat) {
        const Expr& x = exprs_[m];
        if (x.null == 1) null = 1;
        else if (x.null < 0 && null != 1) null = -1;
        boolean = boolean || x.boolean;
        counted = counted || x.counted;
        a.push_back(m);
    }
    const int32_t out = intern(K_ALT, a.data(), static_cast<uint32_t>(a.size()), null, boolean);
    exprs_[out].counted = exprs_[out].counted || counted;
    return out;
}

int32_t ExprCore::mk_and(const int32_t* items, size_t n) {
    InlineVec<int32_t, 16> flat;
    for (size_t i = 0; i < n; ++i) {
        const bool nested = kind(items[i]) == K_AND;
        for (uint32_t j = 0, count = nested ? arg_count(items[i]) : 1; j < count; ++j) {
            const int32_t p = nested ? static_cast<int32_t>(args(items[i])[j]) : items[i];
            if (p == NOTHING) return NOTHING;
            if (kind(p) == K_NOT && args(p)[0] == NOTHING) continue;  // x & everything == x
            flat.push_back(p);
        }
    }
    flat.sort_unique();
    if (flat.empty()) return mk_not(NOTHING);
    bool all_bytes = true;
    for (int32_t p : flat) all_bytes = all_bytes && kind(p) == K_BYTES;
    if (all_bytes) {
        ByteSet mask = ALL_BYTES;
        for (int32_t p : flat) {
            ByteSet m;
            std::memcpy(m.data(), args(p), sizeof m);
            mask = mask & m;
        }
        return mk_bytes(mask);
    }
    if (std::binary_search(flat.begin(), flat.end(), EMPTY)) {
        bool all = true;
        for (int32_t p : flat) all = nullable(p) && all;  // every member asked, as the twin does
        return all ? EMPTY : NOTHING;
    }
    if (flat.size() == 1) return flat[0];
    int8_t null = 1;
    bool counted = false;
    InlineVec<int64_t, 16> a;
    for (int32_t m : flat) {
        const Expr& x = exprs_[m];
        if (x.null == 0) null = 0;
        else if (x.null < 0 && null != 0) null = -1;
        counted = counted || x.counted;
        a.push_back(m);
    }
    const int32_t out = intern(K_AND, a.data(), static_cast<uint32_t>(a.size()), null, true);
    exprs_[out].counted = exprs_[out].counted || counted;
    return out;
}

int32_t ExprCore::mk_not(int32_t a) {
    if (kind(a) == K_NOT) return static_cast<int32_t>(args(a)[0]);
    const int8_t na = exprs_[a].null;
    const int64_t x[1] = {a};
    const int32_t out = intern(K_NOT, x, 1, na < 0 ? -1 : !na, true);
    exprs_[out].counted = exprs_[out].counted || exprs_[a].counted;
    return out;
}

int32_t ExprCore::mk_repeat(int32_t a, int64_t lo, int64_t hi) {
    if (hi == 0 || a == EMPTY) return EMPTY;
    if (a == NOTHING) return lo == 0 ? EMPTY : NOTHING;
    if (lo == 1 && hi == 1) return a;
    if (lo && nullable(a)) lo = 0;  // a nullable: a{n,m} == a{0,m}
    const int64_t x[3] = {a, lo, hi};
    const int32_t out = intern(K_REPEAT, x, 3, lo == 0 ? 1 : exprs_[a].null, exprs_[a].boolean);
    exprs_[out].counted = exprs_[out].counted || exprs_[a].counted || lo > 0 || hi >= 0;
    return out;
}

int32_t ExprCore::mk_frame(int32_t e) {
    const Kind k = kind(e);
    if (k == K_NOTHING || k == K_EMPTY || k == K_FRAME || k == K_BYTES) return e;
    if (k == K_SEQ && kind(static_cast<int32_t>(args(e)[0])) == K_FRAME) {  // frames at the head: flatten
        std::vector<int32_t> frames;
        while (kind(e) == K_SEQ && kind(static_cast<int32_t>(args(e)[0])) == K_FRAME) {
            frames.push_back(static_cast<int32_t>(args(e)[0]));
            e = static_cast<int32_t>(args(e)[1]);
        }
        int32_t out = mk_frame(e);
        for (size_t i = frames.size(); i-- > 0;) out = mk_seq(frames[i], out);
        return out;
    }
    const int64_t x[1] = {e};
    const int32_t out = intern(K_FRAME, x, 1, exprs_[e].null, exprs_[e].boolean);
    exprs_[out].counted = exprs_[out].counted || exprs_[e].counted;
    return out;
}

int32_t ExprCore::mk_ref(int32_t rule) {
    const int64_t x[1] = {rule};
    return intern(K_REF, x, 1, -1, false);
}

int32_t ExprCore::mk_unordered(int32_t d, const uint64_t* seen, int64_t count) {
    const Unordered& u = unordered_[d];
    bool zero = count == 0;
    for (size_t i = 0; i < u.words && zero; ++i) zero = seen[i] == 0;
    if ((zero || u.lo || u.hi >= 0) && unordered_min(d, seen, count) == INF) return NOTHING;
    std::vector<int64_t> x{d, count};
    for (size_t i = 0; i < u.words; ++i) x.push_back(static_cast<int64_t>(seen[i]));
    return intern(K_UNORDERED, x.data(), static_cast<uint32_t>(x.size()), -1, false);
}

double ExprCore::unordered_min(int32_t d, const uint64_t* seen, int64_t count) const {
    const Unordered& u = unordered_[d];
    return unordered_length(u.item_mins, u.required, u.part_mins[0], u.part_mins[1], u.part_mins[2], u.part_mins[3],
                            u.lo, u.hi, seen, u.words, count);
}

int32_t ExprCore::expand_unordered(int32_t e) {
    if (unordered_body_[e] >= 0) return unordered_body_[e];
    const int32_t d = static_cast<int32_t>(args(e)[0]);
    const int64_t count = args(e)[1];
    const Unordered u = unordered_[d];  // a copy: conversions below may add Unordered nodes
    std::vector<uint64_t> seen(args(e) + 2, args(e) + 2 + u.words);
    std::vector<int32_t> options;
    bool complete = count >= u.lo;
    for (size_t i = 0; i < u.words && complete; ++i) complete = (u.required[i] & ~seen[i]) == 0;
    if (complete) options.push_back(count == 0 ? EMPTY : u.last);
    if (u.hi < 0 || count < u.hi) {
        const int32_t lead = count == 0 ? u.first : u.sep;
        const int64_t nxt = std::min(count + 1, std::max({int64_t(1), u.lo, u.hi < 0 ? int64_t(0) : u.hi}));
        for (size_t j = 0; j < u.items.size(); ++j) {
            if (bit(seen.data(), seen.size(), j) || u.items[j] == NOTHING) continue;
            const int32_t member = mk_frame(mk_seq(lead, u.items[j]));
            std::vector<uint64_t> more = seen;
            more[j / 64] |= uint64_t(1) << (j % 64);
            options.push_back(mk_seq(member, mk_unordered(d, more.data(), nxt)));
        }
        if (u.extra != NOTHING) {
            const int32_t member = mk_frame(mk_seq(lead, u.extra));
            options.push_back(mk_seq(member, mk_unordered(d, seen.data(), nxt)));
        }
    }
    const int32_t body = mk_alt(options);
    unordered_body_[e] = body;
    return body;
}

// ------------------------------------------------------------------------------ IR conversion

int32_t ExprCore::convert(int32_t node) {
    if (node < 0 || static_cast<size_t>(node) >= converted_.size())
        throw std::out_of_range("ExprCore.convert: no IR node " + std::to_string(node));
    if (converted_[node] >= 0) return converted_[node];
    Level level(level_, budget_.max_nesting);
    // Children by index: loading a rule on the way (a search through a reference) may move the arrays.
    auto c = [this, base = ir_.offsets[node]](int32_t i) { return ir_.children[base + i]; };
    const int32_t arity = ir_.offsets[node + 1] - ir_.offsets[node];
    int32_t out = NOTHING;
    switch (ir_.kind[node]) {
        case IR_BYTES: out = mk_bytes(ir_.masks[aux_[node]]); break;
        case IR_SEQ:
            out = EMPTY;
            for (int32_t i = arity; i-- > 0;) out = mk_seq(convert(c(i)), out);
            break;
        case IR_ALT:
        case IR_AND: {
            std::vector<int32_t> items;
            for (int32_t i = 0; i < arity; ++i) items.push_back(convert(c(i)));
            out = ir_.kind[node] == IR_ALT ? mk_alt(items) : mk_and(items);
            break;
        }
        case IR_NOT: out = mk_not(convert(c(0))); break;
        case IR_REPEAT: out = mk_repeat(convert(c(0)), ir_.p0[node], ir_.p1[node]); break;
        case IR_REF:
            if (ir_.p0[node] < 0)
                throw CoreError(CoreError::GRAMMAR, 0, "reference to undefined rule " + ir_.undefined_names[ir_.p1[node]]);
            out = rule_min_[ir_.p0[node]] < INF ? mk_ref(static_cast<int32_t>(ir_.p0[node])) : NOTHING;
            break;
        case IR_UNORDERED: {
            const int32_t n_items = arity - 4;
            Unordered u;
            u.extra = convert(c(n_items));
            u.first = convert(c(n_items + 1));
            u.sep = convert(c(n_items + 2));
            u.last = convert(c(n_items + 3));
            ++lengths_.now;  // (the rules' lengths may have changed since its last use)
            for (int i = 0; i < 4; ++i) u.part_mins[i] = rule_ir_min(c(n_items + i), lengths_);
            for (int32_t i = 0; i < n_items; ++i) u.items.push_back(convert(c(i)));
            for (int32_t i = 0; i < n_items; ++i) u.item_mins.push_back(rule_ir_min(c(i), lengths_));
            u.required = ir_.required[aux_[node]];
            u.words = (static_cast<size_t>(n_items) + 63) / 64;
            u.required.resize(std::max(u.required.size(), u.words), 0);
            u.lo = ir_.p0[node];
            u.hi = ir_.p1[node];
            unordered_.push_back(std::move(u));
            const std::vector<uint64_t> none(unordered_.back().words, 0);
            out = mk_unordered(static_cast<int32_t>(unordered_.size() - 1), none.data(), 0);
            break;
        }
    }
    converted_[node] = out;
    return out;
}

int32_t ExprCore::ref(int32_t rule) {
    if (rule < 0 || static_cast<size_t>(rule) >= rule_min_.size())
        throw std::out_of_range("ExprCore.ref: no rule " + std::to_string(rule));
    return rule_min_[rule] < INF ? mk_ref(rule) : NOTHING;
}

// grammars.analysis.MinLength on flat nodes: what it measures (not the item of a repetition that
// may be absent, nor under a complement) and the errors it raises are the twin's.
double ExprCore::rule_ir_min(int32_t node, RuleMeasure& m) {
    if (m.round[node] && (m.round[node] == m.now || !has_ref_[node])) {
        m.took_any |= m.took[node];
        return m.value[node];
    }
    Level level(level_, budget_.max_nesting);
    const bool outer_took = std::exchange(m.took_any, false);
    auto c = [this, base = ir_.offsets[node]](int32_t i) { return ir_.children[base + i]; };
    const int32_t arity = ir_.offsets[node + 1] - ir_.offsets[node];
    double out = INF;
    switch (ir_.kind[node]) {
        case IR_BYTES: out = any(ir_.masks[aux_[node]]) ? 1 : INF; break;
        case IR_SEQ:
            out = 0;
            for (int32_t i = 0; i < arity; ++i) out += rule_ir_min(c(i), m);
            break;
        case IR_ALT:
            for (int32_t i = 0; i < arity; ++i) out = std::min(out, rule_ir_min(c(i), m));
            break;
        case IR_AND:
        case IR_NOT:
            if (m.exact) {
                out = min_completion(convert(node));
            } else {
                m.took_any = true;
                out = 0;
                if (ir_.kind[node] == IR_AND)
                    for (int32_t i = 0; i < arity; ++i) out = std::max(out, rule_ir_min(c(i), m));
            }
            break;
        case IR_REPEAT:
            if (ir_.p0[node] > budget_.max_repeat)
                throw CoreError(CoreError::GRAMMAR, 0,
                                "repetition of at least " + std::to_string(ir_.p0[node]) + " iterations: more than " +
                                    std::to_string(budget_.max_repeat) +
                                    " (constrain.grammars.analysis.MAX_REPEAT) would be decoded one state per "
                                    "iteration; lower its minimum");
            out = ir_.p0[node] == 0 ? 0 : static_cast<double>(ir_.p0[node]) * rule_ir_min(c(0), m);
            break;
        case IR_REF: out = ir_.p0[node] < 0 ? INF : m.lengths[ir_.p0[node]]; break;
        case IR_UNORDERED: {
            const int32_t n_items = arity - 4;
            std::vector<double> mins;
            for (int32_t i = 0; i < n_items; ++i) mins.push_back(rule_ir_min(c(i), m));
            double parts[4];
            for (int i = 0; i < 4; ++i) parts[i] = rule_ir_min(c(n_items + i), m);
            out = unordered_length(mins, ir_.required[aux_[node]], parts[0], parts[1], parts[2], parts[3],
                                   ir_.p0[node], ir_.p1[node], nullptr, 0, 0);
            break;
        }
    }
    m.value[node] = out;
    m.round[node] = m.now;
    m.took[node] = m.took_any;
    m.took_any |= outer_took;
    return out;
}

// One strongly connected component's lengths into m.lengths (from INF, the rules after those they
// use); whether a lower bound was taken.
bool ExprCore::measure_component(const std::vector<int32_t>& comp, bool self_loop, RuleMeasure& m) {
    m.took_any = false;
    ++m.now;
    if (comp.size() == 1 && !self_loop) {
        m.lengths[comp[0]] = rule_ir_min(ir_.rule_nodes[comp[0]], m);
        return m.took_any;
    }
    check_complements(comp, m.visited);
    for (bool changed = true; changed; ++m.now) {
        changed = false;
        for (int32_t r : comp) {
            const double n = rule_ir_min(ir_.rule_nodes[r], m);
            if (n < m.lengths[r]) {
                m.lengths[r] = n;
                changed = true;
            }
        }
    }
    return m.took_any;
}

// The twin's _check_complements: the first rule of the cycle (by index) that uses one of its rules
// inside a Not, and the first rule it so uses.
void ExprCore::check_complements(const std::vector<int32_t>& comp, std::vector<int32_t>& visited) {
    std::vector<int32_t> rules(comp);
    std::sort(rules.begin(), rules.end());
    auto in_cycle = [&](int64_t r) { return r >= 0 && std::binary_search(rules.begin(), rules.end(), static_cast<int32_t>(r)); };
    std::vector<int32_t> stack, under;
    for (int32_t r : rules) {
        int32_t used = -1;
        stack.assign(1, ir_.rule_nodes[r]);
        while (!stack.empty()) {
            const int32_t n = stack.back();
            stack.pop_back();
            if (!has_ref_[n] || ir_.kind[n] == IR_REF || visited[n] == r) continue;
            visited[n] = r;
            if (ir_.kind[n] != IR_NOT) {
                for (int32_t c = ir_.offsets[n]; c < ir_.offsets[n + 1]; ++c) stack.push_back(ir_.children[c]);
                continue;
            }
            under.assign(1, ir_.children[ir_.offsets[n]]);  // grammars.analysis.refs of the Not's item
            while (!under.empty()) {
                const int32_t u = under.back();
                under.pop_back();
                if (!has_ref_[u]) continue;
                if (ir_.kind[u] == IR_REF) {
                    if (in_cycle(ir_.p0[u]) && (used < 0 || ir_.p0[u] < used)) used = static_cast<int32_t>(ir_.p0[u]);
                } else {
                    for (int32_t c = ir_.offsets[u]; c < ir_.offsets[u + 1]; ++c) under.push_back(ir_.children[c]);
                }
            }
        }
        if (used >= 0) throw ComplementCycle(r, used);
    }
}

std::vector<double> ExprCore::measure_rules() {
    const size_t n_nodes = ir_.kind.size();
    const int32_t n_rules = static_cast<int32_t>(ir_.rule_nodes.size());
    const auto& has_ref = has_ref_;
    // uses[r]: the rules r's body refers to (grammars.analysis.refs: absent ones left out).
    std::vector<std::vector<int32_t>> uses(n_rules);
    {
        std::vector<int32_t> seen(n_nodes, -1), stack;
        for (int32_t r = 0; r < n_rules; ++r) {
            stack.assign(1, ir_.rule_nodes[r]);
            while (!stack.empty()) {
                const int32_t n = stack.back();
                stack.pop_back();
                if (!has_ref[n] || seen[n] == r) continue;
                seen[n] = r;
                if (ir_.kind[n] == IR_REF) {
                    if (ir_.p0[n] >= 0) uses[r].push_back(static_cast<int32_t>(ir_.p0[n]));
                } else {
                    for (int32_t c = ir_.offsets[n]; c < ir_.offsets[n + 1]; ++c) stack.push_back(ir_.children[c]);
                }
            }
            std::sort(uses[r].begin(), uses[r].end());
            uses[r].erase(std::unique(uses[r].begin(), uses[r].end()), uses[r].end());
        }
    }
    // Tarjan's components, iteratively: each is complete after every component it uses.
    std::vector<std::vector<int32_t>> comps;
    {
        std::vector<int32_t> index(n_rules, -1), low(n_rules, 0), stack;
        std::vector<uint8_t> on_stack(n_rules, 0);
        std::vector<std::pair<int32_t, size_t>> calls;  // rule, next use to visit
        int32_t counter = 0;
        for (int32_t root = 0; root < n_rules; ++root) {
            if (index[root] >= 0) continue;
            calls.emplace_back(root, 0);
            while (!calls.empty()) {
                auto& [v, i] = calls.back();
                if (i == 0 && index[v] < 0) {
                    index[v] = low[v] = counter++;
                    stack.push_back(v);
                    on_stack[v] = 1;
                }
                if (i < uses[v].size()) {
                    const int32_t w = uses[v][i++];
                    if (index[w] < 0) {
                        calls.emplace_back(w, 0);
                    } else if (on_stack[w]) {
                        low[v] = std::min(low[v], index[w]);
                    }
                    continue;
                }
                const int32_t done = v;
                calls.pop_back();
                if (!calls.empty()) low[calls.back().first] = std::min(low[calls.back().first], low[done]);
                if (low[done] == index[done]) {
                    std::vector<int32_t> comp;
                    int32_t w;
                    do {
                        w = stack.back();
                        stack.pop_back();
                        on_stack[w] = 0;
                        comp.push_back(w);
                    } while (w != done);
                    std::reverse(comp.begin(), comp.end());
                    comps.push_back(std::move(comp));
                }
            }
        }
    }
    auto self_loop = [&](const std::vector<int32_t>& comp) {
        return comp.size() == 1 && std::binary_search(uses[comp[0]].begin(), uses[comp[0]].end(), comp[0]);
    };
    // First pass: lower bounds; a component is bounded where it took one or uses a bounded rule.
    std::vector<double> lower(n_rules, INF);
    std::vector<uint8_t> bounded(n_rules, 0);
    {
        RuleMeasure m(false, lower, n_nodes);
        for (const auto& comp : comps) {
            bool b = measure_component(comp, self_loop(comp), m);
            for (int32_t r : comp)
                for (int32_t u : uses[r]) b = b || bounded[u];
            if (b)
                for (int32_t r : comp) bounded[r] = 1;
        }
    }
    rule_min_ = lower;
    forget_completions();
    // Second pass: the bounded components exactly, each settled in the table before its users.
    std::vector<double> exact(n_rules, INF);
    RuleMeasure m(true, exact, n_nodes);
    for (const auto& comp : comps) {
        if (!bounded[comp[0]]) {
            for (int32_t r : comp) exact[r] = lower[r];
            continue;
        }
        measure_component(comp, self_loop(comp), m);
        bool changed = false;
        for (int32_t r : comp) {
            changed = changed || rule_min_[r] != exact[r];
            rule_min_[r] = exact[r];
        }
        if (changed) forget_completions();
    }
    return lower;
}

int32_t ExprCore::rule_body(int32_t rule) {
    if (rule < 0 || static_cast<size_t>(rule) >= rule_body_.size())
        throw std::out_of_range("ExprCore.rule_body: no rule " + std::to_string(rule));
    return body(rule);
}

int32_t ExprCore::body(int32_t rule) {
    if (rule_body_[rule] < 0) rule_body_[rule] = convert(ir_.rule_nodes[rule]);
    return rule_body_[rule];
}

// ---------------------------------------------------------------------------------- semantics

bool ExprCore::nullable(int32_t e) {
    if (exprs_[e].null >= 0) return exprs_[e].null;
    if (null_open_.depth[e] >= 0) {  // a cycle through rules: this path adds no empty match
        null_cut_ = std::min<int64_t>(null_cut_, null_open_.depth[e]);
        return false;
    }
    CutScope scope(null_open_, null_cut_, e);
    bool n = false;
    {
        Level level(level_, budget_.max_nesting);
        const int64_t* a = args(e);
        switch (kind(e)) {
            case K_REF: n = nullable(body(static_cast<int32_t>(a[0]))); break;
            case K_UNORDERED: {
                const Unordered& u = unordered_[a[0]];
                const int64_t count = a[1];
                bool complete = count >= u.lo;
                for (size_t i = 0; i < u.words && complete; ++i) complete = (u.required[i] & ~static_cast<uint64_t>(a[2 + i])) == 0;
                const int32_t last = u.last;
                n = complete && (count == 0 || nullable(last));
                break;
            }
            case K_FRAME: n = nullable(static_cast<int32_t>(a[0])); break;
            case K_SEQ:
                n = true;
                each_in_spine(e, [&](int32_t m) { return n = nullable(m); });
                break;
            case K_ALT:
                for (uint32_t i = 0, count = arg_count(e); i < count; ++i) n = nullable(static_cast<int32_t>(args(e)[i])) || n;
                break;
            case K_AND:
                n = true;
                for (uint32_t i = 0, count = arg_count(e); i < count; ++i) n = nullable(static_cast<int32_t>(args(e)[i])) && n;
                break;
            case K_NOT: n = !nullable(static_cast<int32_t>(a[0])); break;
            case K_REPEAT: {
                const int32_t item = static_cast<int32_t>(a[0]);
                n = a[1] == 0 || nullable(item);
                break;
            }
            default: n = kind(e) == K_EMPTY;
        }
    }
    if (scope.close()) exprs_[e].null = n;
    return n;
}

int32_t ExprCore::derive(int32_t e, int b) {
    const int32_t* found = deriv_.find(static_cast<int64_t>(e) * 256 + b);
    return found ? *found : d(e, b);
}

int32_t ExprCore::d(int32_t e, int b) {
    const int64_t key = static_cast<int64_t>(e) * 256 + b;
    if (const int32_t* found = deriv_.find(key)) return *found;
    Level level(level_, budget_.max_nesting);
    int32_t out;
    if (kind(e) == K_REF || kind(e) == K_UNORDERED) {  // every cycle of derivatives passes through one
        if (!deriving_.insert(key).second)
            throw CoreError(CoreError::GRAMMAR, 0,
                            "left-recursive grammar: a rule can reach itself without consuming input");
        try {
            out = derive_uncached(e, b);
        } catch (...) {
            deriving_.erase(key);
            throw;
        }
        deriving_.erase(key);
    } else {
        out = derive_uncached(e, b);
    }
    deriv_.set(key, out);
    return out;
}

int32_t ExprCore::derive_uncached(int32_t e, int b) {
    switch (kind(e)) {
        case K_BYTES: {
            ByteSet m;
            std::memcpy(m.data(), args(e), sizeof m);
            return test(m, b) ? EMPTY : NOTHING;
        }
        case K_SEQ: {  // along the spine while the heads may be empty
            InlineVec<int32_t, 16> parts;
            while (kind(e) == K_SEQ) {
                const int32_t head = static_cast<int32_t>(args(e)[0]);
                e = static_cast<int32_t>(args(e)[1]);
                parts.push_back(mk_seq(d(head, b), e));
                if (!nullable(head)) return mk_alt(parts.data(), parts.size());
                if (const int32_t* done = deriv_.find(static_cast<int64_t>(e) * 256 + b)) {
                    parts.push_back(*done);
                    return mk_alt(parts.data(), parts.size());
                }
            }
            parts.push_back(d(e, b));
            return mk_alt(parts.data(), parts.size());
        }
        case K_ALT: {  // members that cannot start with b derive to NOTHING: skipped
            InlineVec<int32_t, 16> parts;
            for (uint32_t i = 0, n = arg_count(e); i < n; ++i) {  // (args re-read: deriving may move them)
                const int32_t m = static_cast<int32_t>(args(e)[i]);
                if (test(first_known_[m] == 1 ? first_[m] : first_bytes(m), b)) parts.push_back(d(m, b));
            }
            return mk_alt(parts.data(), parts.size());
        }
        case K_AND: {  // NOTHING as soon as one member dies: the others are not derived
            InlineVec<int32_t, 16> parts;
            for (uint32_t i = 0, n = arg_count(e); i < n; ++i) {
                const int32_t m = d(static_cast<int32_t>(args(e)[i]), b);
                if (m == NOTHING) return NOTHING;
                parts.push_back(m);
            }
            return mk_and(parts.data(), parts.size());
        }
        case K_NOT: return mk_not(d(static_cast<int32_t>(args(e)[0]), b));
        case K_REPEAT: {
            const int32_t item = static_cast<int32_t>(args(e)[0]);
            const int64_t lo = args(e)[1], hi = args(e)[2];
            const int32_t rest = mk_repeat(item, std::max<int64_t>(lo - 1, 0), hi < 0 ? -1 : hi - 1);
            return mk_seq(d(item, b), rest);
        }
        case K_REF: return mk_frame(d(body(static_cast<int32_t>(args(e)[0])), b));
        case K_UNORDERED: return d(expand_unordered(e), b);
        case K_FRAME: return mk_frame(d(static_cast<int32_t>(args(e)[0]), b));
        default: return NOTHING;
    }
}

int32_t ExprCore::derive_bytes(int32_t e, const uint8_t* data, size_t n) {
    for (size_t i = 0; i < n; ++i) e = derive(e, data[i]);
    return e;
}

std::vector<ByteSet> ExprCore::byte_classes(int32_t e) {
    std::vector<ByteSet> uncached;
    size_t n = 0;
    const ByteSet* classes = classes_of(e, uncached, n);
    return {classes, classes + n};
}

const ByteSet* ExprCore::classes_of(int32_t e, std::vector<ByteSet>& uncached, size_t& n) {
    if (classes_[e] >= 0) {
        n = class_count_[e];
        return class_pool_.data() + classes_[e];
    }
    if (class_open_.depth[e] >= 0) {  // a cycle through rules adds no first byte of its own
        class_cut_ = std::min<int64_t>(class_cut_, class_open_.depth[e]);
        uncached.assign(1, ALL_BYTES);
        n = 1;
        return uncached.data();
    }
    CutScope scope(class_open_, class_cut_, e);
    InlineVec<ByteSet, 16> parts;
    parts.push_back(ALL_BYTES);
    // parts refined by m's classes: read in place (nothing grows the pool while they are read)
    auto refine_by = [&](int32_t m) {
        std::vector<ByteSet> own;
        size_t k = 0;
        const ByteSet* q = classes_of(m, own, k);
        if (k == 1) return;
        if (parts.size() == 1) {
            parts.truncate(0);
            parts.append(q, q + k);
            return;
        }
        InlineVec<ByteSet, 16> meet;
        for (const ByteSet& x : parts)
            for (size_t j = 0; j < k; ++j) {
                const ByteSet z = x & q[j];
                if (any(z)) meet.push_back(z);
            }
        parts.truncate(0);
        parts.append(meet.begin(), meet.end());
    };
    {
        Level level(level_, budget_.max_nesting);
        switch (kind(e)) {
            case K_BYTES: {
                ByteSet m, rest;
                std::memcpy(m.data(), args(e), sizeof m);
                for (int i = 0; i < 4; ++i) rest[i] = ~m[i];
                parts.truncate(0);
                for (const ByteSet& p : {m, rest})
                    if (any(p)) parts.push_back(p);
                break;
            }
            case K_SEQ:  // the heads that may be empty and the one after them
                each_in_spine(e, [&](int32_t m) {
                    refine_by(m);
                    return nullable(m);
                });
                break;
            case K_ALT:
            case K_AND:
                for (uint32_t i = 0, count = arg_count(e); i < count; ++i) refine_by(static_cast<int32_t>(args(e)[i]));
                break;
            case K_NOT:
            case K_REPEAT:
            case K_FRAME: refine_by(static_cast<int32_t>(args(e)[0])); break;
            case K_REF: refine_by(body(static_cast<int32_t>(args(e)[0]))); break;
            case K_UNORDERED: refine_by(expand_unordered(e)); break;
            default: break;
        }
    }
    if (scope.close()) {
        classes_[e] = static_cast<int32_t>(class_pool_.size());
        class_count_[e] = static_cast<uint16_t>(parts.size());
        class_pool_.insert(class_pool_.end(), parts.begin(), parts.end());
        n = parts.size();
        return class_pool_.data() + classes_[e];
    }
    uncached.assign(parts.begin(), parts.end());
    n = uncached.size();
    return uncached.data();
}

ByteSet ExprCore::first_bytes(int32_t e) {
    if (first_known_[e] == 1) return first_[e];
    if (first_known_[e] == 2) return ALL_BYTES;  // busy: only left recursion cycles here
    first_known_[e] = 2;
    ByteSet out{};
    try {
        Level level(level_, budget_.max_nesting);
        switch (kind(e)) {
            case K_BYTES: std::memcpy(out.data(), args(e), sizeof out); break;
            case K_SEQ:
                each_in_spine(e, [&](int32_t m) {
                    out = out | first_bytes(m);
                    return nullable(m);
                });
                break;
            case K_ALT:
                for (uint32_t i = 0, n = arg_count(e); i < n; ++i) out = out | first_bytes(static_cast<int32_t>(args(e)[i]));
                break;
            case K_AND:
                out = ALL_BYTES;
                for (uint32_t i = 0, n = arg_count(e); i < n; ++i) out = out & first_bytes(static_cast<int32_t>(args(e)[i]));
                break;
            case K_REPEAT:
            case K_FRAME: out = first_bytes(static_cast<int32_t>(args(e)[0])); break;
            case K_REF: out = first_bytes(body(static_cast<int32_t>(args(e)[0]))); break;
            case K_UNORDERED: out = unordered_first(e); break;
            case K_NOTHING:
            case K_EMPTY: break;
            default: out = ALL_BYTES;  // complement
        }
    } catch (...) {
        first_known_[e] = 0;
        throw;
    }
    first_[e] = out;
    first_known_[e] = 1;
    return out;
}

ByteSet ExprCore::unordered_first(int32_t e) {
    const int32_t d = static_cast<int32_t>(args(e)[0]);
    const int64_t count = args(e)[1];
    const Unordered& u = unordered_[d];
    const std::vector<uint64_t> seen(args(e) + 2, args(e) + 2 + u.words);
    const std::vector<int32_t> items = u.items;
    const int32_t extra = u.extra, first = u.first, sep = u.sep, last = u.last;
    const int64_t lo = u.lo, hi = u.hi;
    bool complete = count >= lo;
    for (size_t i = 0; i < seen.size() && complete; ++i) complete = (u.required[i] & ~seen[i]) == 0;
    ByteSet out{};
    if (count && complete) out = first_bytes(last);
    if (hi < 0 || count < hi) {
        const int32_t lead = count == 0 ? first : sep;
        out = out | first_bytes(lead);
        if (nullable(lead)) {
            for (size_t j = 0; j < items.size(); ++j)
                if (!bit(seen.data(), seen.size(), j)) out = out | first_bytes(items[j]);
            out = out | first_bytes(extra);
        }
    }
    return out;
}

double ExprCore::min_completion(int32_t e) {
    if (!std::isnan(min_[e])) return min_[e];
    return structural_min<true>(e);
}

double ExprCore::min_bound(int32_t e) {
    if (!std::isnan(min_[e])) return min_[e];
    if (!std::isnan(bound_[e])) return bound_[e];
    return structural_min<false>(e);
}

double ExprCore::boolean_bound(int32_t e) {
    if (kind(e) != K_AND) return 0;
    double out = -INF;
    for (int32_t m : members(e)) out = std::max(out, min_bound(m));
    return out;
}

// The shortest completion of e by its structure: exact (searching intersections and
// complements) or a lower bound (never searching); one recursion for both, as in the twin.
template <bool Exact>
double ExprCore::structural_min(int32_t e) {
    Level level(level_, budget_.max_nesting);
    auto recurse = [this](int32_t m) { return Exact ? min_completion(m) : min_bound(m); };
    const int64_t* a = args(e);
    double out = INF;
    switch (kind(e)) {
        case K_AND:
        case K_NOT: out = Exact ? search_min(e) : boolean_bound(e); break;
        case K_BYTES: out = 1; break;
        case K_EMPTY: out = 0; break;
        case K_SEQ:
            out = 0;
            for (int32_t m : spine(e)) out += recurse(m);
            break;
        case K_ALT:
            for (int32_t m : members(e)) out = std::min(out, recurse(m));
            break;
        case K_REPEAT: {
            const int64_t lo = a[1];
            out = lo == 0 ? 0 : static_cast<double>(lo) * recurse(static_cast<int32_t>(a[0]));
            break;
        }
        case K_REF: out = rule_min_[a[0]]; break;
        case K_UNORDERED: {
            const std::vector<uint64_t> seen(a + 2, a + 2 + unordered_[a[0]].words);
            out = unordered_min(static_cast<int32_t>(a[0]), seen.data(), a[1]);
            break;
        }
        case K_FRAME: out = recurse(static_cast<int32_t>(a[0])); break;
        default: break;
    }
    (Exact ? min_ : bound_)[e] = out;
    return out;
}

// Best-first (A*) search for the nearest accepting derivative, guided by min_bound; when it gives
// up, the least bound left on its frontier (a lower bound).
double ExprCore::search_min(int32_t e) {
    using Item = std::tuple<double, int64_t, int32_t>;  // (bound, -depth, state): the deepest of a bound first
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
    std::unordered_map<int32_t, int64_t> best{{e, 0}};
    heap.emplace(min_bound(e), 0, e);
    while (!heap.empty() && best.size() < LIVENESS_BUDGET) {
        const auto [bound_here, neg, s] = heap.top();
        heap.pop();
        const int64_t depth = -neg;
        const auto known = best.find(s);
        if (known != best.end() && depth > known->second) continue;  // reached again by a shorter way
        if (nullable(s)) return static_cast<double>(depth);
        for (const ByteSet& part : byte_classes(s)) {
            const int32_t n = derive(s, lowest(part));
            if (n == NOTHING || live_[n] == 0) continue;
            const auto seen = best.find(n);
            if (seen != best.end() && depth + 1 >= seen->second) continue;
            const double bound = min_bound(n);
            if (bound == INF) continue;
            best[n] = depth + 1;
            heap.emplace(static_cast<double>(depth + 1) + bound, -(depth + 1), n);
        }
    }
    return heap.empty() ? INF : std::get<0>(heap.top());
}

bool ExprCore::is_live(int32_t e) {
    if (e == NOTHING) return false;
    if (!exprs_[e].boolean) return true;  // smart constructors reduce every empty regular expression to NOTHING
    if (live_[e] >= 0) return live_[e];
    bool live = true;
    {
        Level level(level_, budget_.max_nesting);
        switch (kind(e)) {
            case K_SEQ:
                for (int32_t m : spine(e))
                    if (!is_live(m)) {
                        live = false;
                        break;
                    }
                break;
            case K_ALT:
                live = false;
                for (int32_t m : members(e)) live = is_live(m) || live;
                break;
            case K_REPEAT: {
                const int32_t item = static_cast<int32_t>(args(e)[0]);
                live = args(e)[1] == 0 || is_live(item);
                break;
            }
            case K_FRAME: live = is_live(static_cast<int32_t>(args(e)[0])); break;
            default: live = witness_live(e) || search_live(e);
        }
    }
    live_[e] = live;
    return live;
}

// Life proven by the shortest string of a plain member (no intersection or complement inside:
// its shortest completion is exact by structure) that every member accepts: a derivative per byte
// of each member, where the search derives every byte class of the intersection itself
// (ExprTable._witness_live).
bool ExprCore::witness_live(int32_t e) {
    if (kind(e) != K_AND) return false;
    const std::vector<int32_t> all = members(e);
    std::vector<uint8_t> witness;
    for (int32_t plain : all) {
        if (exprs_[plain].boolean || !shortest_string(plain, witness)) continue;
        bool accepted = true;
        for (int32_t m : all)
            if (m != plain && !nullable(derive_bytes(m, witness.data(), witness.size()))) {
                accepted = false;
                break;
            }
        if (accepted) return true;
    }
    return false;
}

// A shortest string of the plain expression e (the lowest byte of each class), at most
// MAX_WITNESS_BYTES long; false past that or where the structure's length is not exact.
bool ExprCore::shortest_string(int32_t e, std::vector<uint8_t>& out) {
    out.clear();
    int32_t s = e;
    while (!nullable(s)) {
        const double left = min_completion(s);
        if (out.size() == MAX_WITNESS_BYTES || left == INF) return false;
        bool stepped = false;
        for (const ByteSet& part : byte_classes(s)) {
            const int b = lowest(part);
            const int32_t n = derive(s, b);
            if (n != NOTHING && min_completion(n) == left - 1) {
                out.push_back(static_cast<uint8_t>(b));
                s = n;
                stepped = true;
                break;
            }
        }
        if (!stepped) return false;
    }
    return true;
}

// Best-first (A*) search from an intersection/complement state for acceptance, guided by min_bound
// (breadth first expands every byte class up to the nearest acceptance's depth: aerleon's hostname
// pattern, 31k new expressions in one head walk, 23k this way). Every state on the path to a live
// one is live; when everything reachable was explored, all of it is dead.
bool ExprCore::search_live(int32_t e) {
    using Item = std::tuple<double, int64_t, int32_t>;  // (depth + bound, -depth, state)
    std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
    std::unordered_map<int32_t, int32_t> parent{{e, e}};
    heap.emplace(min_bound(e), 0, e);
    while (!heap.empty() && parent.size() < LIVENESS_BUDGET) {
        auto [bound, neg, s] = heap.top();
        heap.pop();
        if (nullable(s) || (s != e && (!exprs_[s].boolean || live_[s] == 1))) {
            while (true) {  // the path back to e is live
                live_[s] = 1;
                if (s == e) return true;
                s = parent[s];
            }
        }
        for (const ByteSet& part : byte_classes(s)) {
            const int32_t n = derive(s, lowest(part));
            if (n == NOTHING || live_[n] == 0 || parent.count(n)) continue;
            const double next_bound = min_bound(n);
            if (next_bound == INF) continue;  // no completion at all: dead
            parent.emplace(n, s);
            heap.emplace(static_cast<double>(1 - neg) + next_bound, neg - 1, n);
        }
    }
    if (!heap.empty()) return true;  // gave up: a wrong "live" can only stall a walk
    for (const auto& [s, _] : parent) live_[s] = 0;
    return false;
}

namespace {

// Repetitions of an item whose non-empty matches have at least m bytes: the most iterations that
// `limit` bytes can start, and the most they can complete (ExprTable's _started, _completed).
int64_t started(int64_t limit, double m) { return m >= limit ? 1 : (limit - 1) / static_cast<int64_t>(m) + 1; }
int64_t completed(int64_t limit, double m) { return m > limit ? 0 : limit / static_cast<int64_t>(m); }

}  // namespace

int32_t ExprCore::clamp(int32_t e, int64_t limit) {
    auto rule = [limit](double m, int64_t& lo, int64_t& hi) {
        const int64_t reach = started(limit, m);
        lo = std::min(lo, reach);
        if (hi >= reach) hi = -1;
        return true;
    };
    return recount(e, rule, clamped_[limit], limit);
}

int32_t ExprCore::clamp_intersection(int32_t e, int64_t limit) {
    // The counts that bind stay, the rest go; B (the closure's bound) depends on which stay, so
    // it is found again until no count that went is within its reach (ExprTable._clamp_intersection).
    std::vector<std::pair<double, int64_t>> lifted;  // (m, hi) of each count made unbounded
    int64_t reach = 0;
    auto relax = [limit, &reach, &lifted](double m, int64_t&, int64_t& hi) {
        if (hi > completed(limit, m) && hi >= completed(limit + reach, m)) {
            lifted.emplace_back(m, hi);
            hi = -1;
        }
        return true;
    };
    for (int round = 0; round < MAX_CLAMP_ROUNDS; ++round) {
        lifted.clear();
        FlatMap memo;
        const int32_t relaxed = recount(e, relax, memo, -1);
        if (relaxed == e) return e;
        const int64_t bound = closure_bound(relaxed);
        if (bound < 0) return e;
        bool within = true;
        for (const auto& [m, hi] : lifted) within = within && hi >= completed(limit + bound, m);
        if (within) return relaxed;
        reach = bound;
    }
    return e;
}

template <class Rule>
int32_t ExprCore::recount(int32_t e, const Rule& rule, FlatMap& memo, int64_t clamp_at) {
    if (!exprs_[e].counted) return e;
    if (const int32_t* known = memo.find(e)) return *known;
    Level level(level_, budget_.max_nesting);
    const int k = kind(e);
    int32_t out = e;
    if (k == K_SEQ || k == K_ALT || k == K_FRAME || (k == K_AND && clamp_at < 0)) {
        std::vector<int32_t> done = k == K_SEQ ? spine(e) : k == K_FRAME ? std::vector<int32_t>{static_cast<int32_t>(args(e)[0])} : members(e);
        for (int32_t& m : done) {
            m = recount(m, rule, memo, clamp_at);
            if (m < 0) {
                memo.set(e, -1);
                return -1;
            }
        }
        if (k == K_SEQ) {
            out = EMPTY;
            for (size_t i = done.size(); i-- > 0;) out = mk_seq(done[i], out);
        } else {
            out = k == K_ALT ? mk_alt(done) : k == K_AND ? mk_and(done) : mk_frame(done[0]);
        }
    } else if (k == K_REPEAT) {
        const int32_t item = recount(static_cast<int32_t>(args(e)[0]), rule, memo, clamp_at);
        int64_t lo = args(e)[1], hi = args(e)[2];
        out = item < 0 || !rule(std::max(1.0, min_bound(static_cast<int32_t>(args(e)[0]))), lo, hi) ? -1 : mk_repeat(item, lo, hi);
    } else if (k == K_AND) {
        out = clamp_intersection(e, clamp_at);
    }
    memo.set(e, out);
    return out;
}

int64_t ExprCore::closure_bound(int32_t u) {
    if (const int32_t* known = closure_bound_.find(u)) return *known;
    std::vector<int32_t> states{u};
    FlatMap index;  // state -> its position in states
    index.set(u, 0);
    std::vector<std::pair<int32_t, int32_t>> edges;  // (to, from): a byte leads from one to the other
    for (size_t i = 0; i < states.size(); ++i) {
        std::vector<ByteSet> uncached;
        size_t n_classes = 0;
        const ByteSet* pooled = classes_of(states[i], uncached, n_classes);
        InlineVec<ByteSet, 32> classes;  // (copied: deriving may grow the pool)
        classes.append(pooled, pooled + n_classes);
        for (const ByteSet& c : classes) {
            const int32_t next = d(states[i], lowest(c));
            if (next == NOTHING) continue;
            const int32_t* at = index.find(next);
            const int32_t j = at ? *at : static_cast<int32_t>(states.size());
            if (!at) {
                if (states.size() == MAX_CLOSURE_STATES) {  // (the explored states too: see the twin)
                    for (int32_t s : states)
                        if (!closure_bound_.find(s)) closure_bound_.set(s, -1);
                    return -1;
                }
                index.set(next, j);
                states.push_back(next);
            }
            edges.emplace_back(j, static_cast<int32_t>(i));
        }
    }
    // Per state, the states with a byte to it (edges grouped by target).
    std::vector<int32_t> first(states.size() + 1, 0), from(edges.size());
    for (const auto& [to, source] : edges) ++first[to + 1];
    for (size_t k = 0; k < states.size(); ++k) first[k + 1] += first[k];
    std::vector<int32_t> next_slot(first.begin(), first.end() - 1);
    for (const auto& [to, source] : edges) from[next_slot[to]++] = source;
    // Shortest completions, breadth first backwards from the states that may end; the largest
    // bounds every state of the closure (each one's closure is part of it).
    std::vector<int64_t> dist(states.size(), -1);
    std::vector<int32_t> queue;
    for (size_t i = 0; i < states.size(); ++i)
        if (nullable(states[i])) dist[i] = 0, queue.push_back(static_cast<int32_t>(i));
    int64_t bound = 0;
    for (size_t q = 0; q < queue.size(); ++q) {
        const int32_t i = queue[q];
        bound = dist[i];
        for (int32_t k = first[i]; k < first[i + 1]; ++k)
            if (dist[from[k]] < 0) dist[from[k]] = dist[i] + 1, queue.push_back(from[k]);
    }
    for (int32_t s : states)  // (bound < MAX_CLOSURE_STATES: it fits the map's int32)
        if (!closure_bound_.find(s)) closure_bound_.set(s, static_cast<int32_t>(bound));
    return bound;
}

bool ExprCore::alternatives(int32_t e, std::vector<int32_t>& out) {
    switch (kind(e)) {
        case K_ALT: out = members(e); return true;
        case K_FRAME: return alternatives(static_cast<int32_t>(args(e)[0]), out);
        case K_UNORDERED: {
            const int32_t body = expand_unordered(e);
            if (kind(body) != K_ALT) return false;
            out = members(body);
            return true;
        }
        case K_SEQ: {
            const int32_t head = static_cast<int32_t>(args(e)[0]), tail = static_cast<int32_t>(args(e)[1]);
            const Kind k = kind(head);
            if (k != K_ALT && k != K_UNORDERED && k != K_FRAME) return false;
            std::vector<int32_t> heads;
            if (!alternatives(head, heads)) return false;
            out.clear();
            for (int32_t m : heads) out.push_back(mk_seq(m, tail));
            return true;
        }
        default: return false;
    }
}

int32_t ExprCore::step_bytes(int32_t e, const uint8_t* data, size_t n) {
    int32_t s = e;
    for (size_t i = 0; i < n && s != NOTHING; ++i) {
        if (has_row(s)) {
            s = buffers_.rows[static_cast<size_t>(s) * 256 + data[i]];
        } else {  // the entry the row would hold: live derivatives only
            s = derive(s, data[i]);
            if (s != NOTHING && !is_live(s)) s = NOTHING;
        }
    }
    return s;
}

std::string ExprCore::forced_bytes(int32_t e, size_t max_bytes) {
    std::string out;
    int32_t s = e;
    while (out.size() < max_bytes && !nullable(s)) {
        ensure_row(s);
        const int32_t* row = buffers_.rows.get() + static_cast<size_t>(s) * 256;
        int only = -1;
        for (int b = 0; b < 256; ++b)
            if (row[b] != NOTHING) {
                if (only >= 0) return out;
                only = b;
            }
        if (only < 0) break;
        out.push_back(static_cast<char>(only));
        s = row[only];
    }
    return out;
}

// --------------------------------------------------------------------------- transition rows

void ExprCore::ensure_row(int32_t s) {
    if (s < 0) throw std::out_of_range("ExprCore: state " + std::to_string(s) + " < 0");
    if (static_cast<size_t>(s) >= exprs_.size())
        throw std::out_of_range("ExprCore: no state " + std::to_string(s));
    if (!has_row(s)) fill_row(s);
}

void ExprCore::fill_row(int32_t s) {
    check_budget();
    int32_t out[256] = {0};
    for (const ByteSet& part : byte_classes(s)) {
        const int32_t n = derive(s, lowest(part));
        if (n != NOTHING && is_live(n))
            for (int w = 0; w < 4; ++w)
                for (uint64_t bits = part[w]; bits; bits &= bits - 1) out[w * 64 + __builtin_ctzll(bits)] = n;
    }
    grow(std::max(static_cast<size_t>(s), exprs_.size()) + 1);
    std::memcpy(buffers_.rows.get() + static_cast<size_t>(s) * 256, out, sizeof out);
    buffers_.nullable[s] = nullable(s);
    rows_filled_ += !buffers_.done[s];
    buffers_.done[s] = true;
}

void ExprCore::grow(size_t need) {
    const size_t cap = buffers_.capacity;
    if (need <= cap) return;
    // Double, but not past the memory budget: at the end each row counts, not the capacity.
    const double room = std::floor((budget_.max_bytes - static_cast<double>(exprs_.size() * EXPR_BYTES)) / ROW_BYTES);
    const size_t new_cap = std::max(need, static_cast<size_t>(std::max(0.0, std::min(static_cast<double>(cap ? cap * 2 : need), room))));
    RowBuffers grown;
    grown.rows = zeroed<int32_t>(new_cap * 256);
    grown.done = zeroed<bool>(new_cap);
    grown.nullable = zeroed<bool>(new_cap);
    grown.capacity = new_cap;
    // Only filled rows are copied: the rows of expressions that never get one stay untouched
    // zero pages (most expressions are states inside tokens or parts of others, never walked from).
    for (size_t s = 0; s < cap; ++s)
        if (buffers_.done[s])
            std::memcpy(grown.rows.get() + s * 256, buffers_.rows.get() + s * 256, 256 * sizeof(int32_t));
    if (cap) {  // walks reading the old buffers keep them alive until they end
        std::memcpy(grown.done.get(), buffers_.done.get(), cap);
        std::memcpy(grown.nullable.get(), buffers_.nullable.get(), cap);
    }
    buffers_ = std::move(grown);
}

}  // namespace constrain
