// A vector that keeps its first N elements inline (on the stack) and moves to the heap past them.
//
// Why: a derivative builds a few short lists (the members of a union, the parts of a sequence's
// derivative) and drops them at once; as std::vector each cost a malloc and a free, about a fifth
// of a new expression's time in closure searches and trie walks. Trivially copyable T only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace constrain {

template <class T, size_t N>
class InlineVec {
    static_assert(std::is_trivially_copyable_v<T>);

public:
    InlineVec() = default;
    InlineVec(const InlineVec&) = delete;  // data_ may point into this object
    InlineVec& operator=(const InlineVec&) = delete;

    void push_back(const T& v) {
        if (size_ == cap_) grow();
        data_[size_++] = v;
    }
    void append(const T* first, const T* last) {
        for (; first != last; ++first) push_back(*first);
    }
    // Keeps the first n elements (n <= size()).
    void truncate(size_t n) { size_ = std::min(n, size_); }
    // Sorts and drops duplicates.
    void sort_unique() {
        std::sort(begin(), end());
        truncate(static_cast<size_t>(std::unique(begin(), end()) - begin()));
    }

    T* data() { return data_; }
    const T* data() const { return data_; }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    T* begin() { return data_; }
    T* end() { return data_ + size_; }
    const T* begin() const { return data_; }
    const T* end() const { return data_ + size_; }
    T& operator[](size_t i) { return data_[i]; }
    const T& operator[](size_t i) const { return data_[i]; }
    T& back() { return data_[size_ - 1]; }

private:
    void grow() {
        if (data_ == inline_) heap_.assign(inline_, inline_ + size_);
        heap_.resize(cap_ * 2);
        data_ = heap_.data();
        cap_ *= 2;
    }

    T inline_[N];
    std::vector<T> heap_;
    T* data_ = inline_;
    size_t size_ = 0, cap_ = N;
};

}  // namespace constrain
