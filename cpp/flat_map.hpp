// An open-addressing hash map from non-negative int64 keys to int32 values, in one flat array.
//
// Why not std::unordered_map: its node per entry costs a malloc on insert, a pointer chase on
// lookup and a free on destruction. The derivative cache of a large grammar holds millions of
// entries, and freeing them one by one took ~20 ms when a context evicted the grammar, a pause
// that landed inside another grammar's mask. Here destruction is one free, and a lookup reads one
// or two adjacent slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace constrain {

class FlatMap {
public:
    // The value under key, or nullptr. Valid until the next insert.
    const int32_t* find(int64_t key) const {
        if (slots_.empty()) return nullptr;
        for (size_t i = index(key);; i = (i + 1) & mask_) {
            const Slot& s = slots_[i];
            if (s.key == key) return &s.value;
            if (s.key == EMPTY) return nullptr;
        }
    }

    size_t size() const { return size_; }

    // Sets key's value (key >= 0).
    void set(int64_t key, int32_t value) {
        if ((size_ + 1) * 2 > slots_.size()) grow();  // load at most one half: short probes
        for (size_t i = index(key);; i = (i + 1) & mask_) {
            Slot& s = slots_[i];
            if (s.key == key) {
                s.value = value;
                return;
            }
            if (s.key == EMPTY) {
                s = {key, value};
                ++size_;
                return;
            }
        }
    }

private:
    struct Slot {
        int64_t key;
        int32_t value;
    };
    static constexpr int64_t EMPTY = -1;

    size_t index(int64_t key) const {  // Fibonacci hashing: keys differing in low bits spread out
        return static_cast<size_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
    }

    void grow() {
        const std::vector<Slot> old = std::move(slots_);
        slots_.assign(old.empty() ? 16 : old.size() * 2, Slot{EMPTY, 0});
        mask_ = slots_.size() - 1;
        shift_ = 64 - __builtin_ctzll(slots_.size());
        size_ = 0;
        for (const Slot& s : old)
            if (s.key != EMPTY) set(s.key, s.value);
    }

    std::vector<Slot> slots_;
    size_t size_ = 0, mask_ = 0;
    int shift_ = 64;
};

}  // namespace constrain
