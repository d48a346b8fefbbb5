#include "packed_trie.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace constrain {

namespace {

uint32_t pack_token(uint32_t token, uint8_t byte) { return token << 8 | byte; }

}  // namespace

PackedTrie::PackedTrie(const std::vector<std::string_view>& token_bytes)
    : n_ids_(static_cast<uint32_t>(token_bytes.size())) {
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < n_ids_; ++i) {
        if (token_bytes[i].size() > MAX_DEPTH)
            throw std::length_error("PackedTrie: token " + std::to_string(i) + " has " +
                                    std::to_string(token_bytes[i].size()) + " bytes, more than the " +
                                    std::to_string(MAX_DEPTH) + " a packed node's depth holds");
        if (!token_bytes[i].empty()) ids.push_back(i);
    }
    if (token_bytes.size() + ids.size() >= NO_TOKEN)
        throw std::length_error("PackedTrie: " + std::to_string(token_bytes.size()) +
                                " token ids do not fit the 24 bits of a packed node");
    std::stable_sort(ids.begin(), ids.end(),
                     [&](uint32_t a, uint32_t b) { return token_bytes[a] < token_bytes[b]; });
    n_tokens_ = ids.size();
    group_start_.push_back(0);
    // In byte order, each token adds the nodes of its path below its longest common prefix with
    // the token before it: that is depth-first order. open[d] is the path's node at depth d.
    nodes_.push_back({pack_token(NO_TOKEN, 0), 0});
    std::vector<uint32_t> open{0};
    auto close_below = [&](size_t depth) {
        while (open.size() > depth + 1) {
            const uint32_t node = open.back();
            nodes_[node].size_depth |= static_cast<uint32_t>(nodes_.size() - node) << 8;
            open.pop_back();
        }
    };
    std::string_view prev;
    for (uint32_t id : ids) {
        const std::string_view bytes = token_bytes[id];
        if (bytes == prev) {  // a duplicate: the node's tokens become a group
            TrieNode& end = nodes_.back();
            if (end.token() < n_ids_) {
                group_tokens_.push_back(static_cast<int32_t>(end.token()));
                end.token_byte = pack_token(n_ids_ + static_cast<uint32_t>(group_start_.size()) - 1, end.byte());
                group_start_.push_back(0);
            }
            group_tokens_.push_back(static_cast<int32_t>(id));
            group_start_.back() = static_cast<uint32_t>(group_tokens_.size());
            continue;
        }
        const auto lcp = static_cast<size_t>(
            std::mismatch(bytes.begin(), bytes.begin() + std::min(bytes.size(), prev.size()), prev.begin()).first -
            bytes.begin());
        close_below(lcp);
        for (size_t d = lcp; d < bytes.size(); ++d) {
            open.push_back(static_cast<uint32_t>(nodes_.size()));
            nodes_.push_back({pack_token(NO_TOKEN, static_cast<uint8_t>(bytes[d])), static_cast<uint32_t>(d + 1)});
        }
        nodes_.back().token_byte = pack_token(id, nodes_.back().byte());
        max_depth_ = std::max(max_depth_, static_cast<uint32_t>(bytes.size()));
        prev = bytes;
        if (nodes_.size() > MAX_NODES)
            throw std::length_error("PackedTrie: more than " + std::to_string(MAX_NODES) +
                                    " nodes, the 24 bits of a packed subtree size");
    }
    close_below(0);
    nodes_[0].size_depth = static_cast<uint32_t>(nodes_.size()) << 8;
    for (size_t c = 1; c < nodes_.size(); c += nodes_[c].subtree_size()) {
        root_child_[nodes_[c].byte()] = static_cast<uint32_t>(c);
        root_end_[nodes_[c].byte()] = static_cast<uint32_t>(c + nodes_[c].subtree_size());
    }
}

Slice PackedTrie::make_slice(const std::vector<int8_t>& next) const {
    Slice out;
    out.next = next;
    out.words.assign((n_ids_ + 31) / 32, 0);
    out.token_words.assign((n_ids_ + 31) / 32, 0);
    // One run of the region over the trie: from the root (the root part), or from the state the
    // first byte leads to (the relative part). `keep(node, token)` for a node that keeps to it,
    // `leave(node, parent's state)` for one where the bytes leave it (its subtree is not entered).
    auto run = [&](bool relative, auto&& keep, auto&& leave) {
        int8_t region[MAX_DEPTH + 1];  // per depth on the current path: the region state
        region[0] = 0;
        for (size_t p = 1; p < nodes_.size();) {
            const TrieNode n = nodes_[p];
            const uint32_t d = n.depth();
            const int8_t q = relative && d == 1 ? out.first_state(n.byte()) : next[region[d - 1] * 256 + n.byte()];
            if (q < 0) {
                leave(p, region[d - 1]);
                p += n.subtree_size();
                continue;
            }
            region[d] = q;
            if (!relative || d >= 2) keep(p, n.token());
            ++p;
        }
    };
    auto to_words = bit_setter(out.words.data());
    run(false, [&](size_t, uint32_t tok) { to_words(tok, 0); }, [&](size_t p, int8_t from) {
        out.root_exits.push_back(static_cast<int32_t>(p));
        out.root_exit_from.push_back(from);
    });
    run(true, [&](size_t p, uint32_t tok) {
        if (tok == NO_TOKEN) return;
        const bool group = tok >= n_ids_;
        const uint32_t first = group ? group_start_[tok - n_ids_] : 0, last = group ? group_start_[tok - n_ids_ + 1] : 1;
        for (uint32_t i = first; i < last; ++i) {
            const auto t = group ? static_cast<uint32_t>(group_tokens_[i]) : tok;
            out.token_nodes.push_back(static_cast<int32_t>(p));
            out.token_ids.push_back(static_cast<int32_t>(t));
            out.token_words[t >> 5] |= 1u << (t & 31);
        }
    }, [&](size_t p, int8_t from) {
        out.exits.push_back(static_cast<int32_t>(p));
        out.exit_from.push_back(from);
    });
    return out;
}

std::shared_ptr<const Slice> PackedTrie::slice(const std::vector<int8_t>& next) const {
    if (next.empty() || next.size() % 256 != 0 || next.size() > MAX_REGION_STATES * 256)
        throw std::invalid_argument("PackedTrie.slice: a region has 1 to " + std::to_string(MAX_REGION_STATES) +
                                    " states of 256 entries");
    const auto states = static_cast<int>(next.size() / 256);
    for (const int8_t q : next)
        if (q < -1 || q >= states) throw std::invalid_argument("PackedTrie.slice: a region's entry is -1 or a state");
    {
        std::lock_guard<std::mutex> hold(slices_->mutex);
        auto& kept = slices_->kept;
        for (size_t i = 0; i < kept.size(); ++i) {
            if (kept[i]->next != next) continue;
            std::rotate(kept.begin() + i, kept.begin() + i + 1, kept.end());  // now the most recent
            return kept.back();
        }
    }
    auto made = std::make_shared<const Slice>(make_slice(next));  // outside the lock: two passes over the nodes
    std::lock_guard<std::mutex> hold(slices_->mutex);
    slices_->kept.push_back(made);
    if (slices_->kept.size() > MAX_SLICES) slices_->kept.erase(slices_->kept.begin());
    return made;
}

size_t PackedTrie::nbytes() const {
    size_t out = sizeof(PackedTrie) + nodes_.size() * sizeof(TrieNode) + (group_start_.size() + group_tokens_.size()) * 4;
    std::lock_guard<std::mutex> hold(slices_->mutex);
    for (const auto& s : slices_->kept) out += s->nbytes();
    return out;
}

std::vector<int32_t> PackedTrie::outermost(const int32_t* nodes, size_t count, const bool* bytes) const {
    std::vector<int32_t> out;
    size_t covered = 0;  // end of the subtree of the last node kept
    for (size_t i = 0; i < count; ++i) {
        const auto node = static_cast<size_t>(nodes[i]);
        if (node < covered || !bytes[nodes_[node].byte()]) continue;
        out.push_back(static_cast<int32_t>(i));
        covered = node + nodes_[node].subtree_size();
    }
    return out;
}

std::string PackedTrie::path(uint32_t node) const {
    // Down from the root: at each level, jump over the children whose subtrees end before `node`
    // (at most 256 a level; a scan back to the parent crossed every earlier sibling's subtree).
    std::string out;
    for (size_t p = 0; p != node;) {
        size_t c = p + 1;
        while (c + nodes_[c].subtree_size() <= node) c += nodes_[c].subtree_size();
        out.push_back(static_cast<char>(nodes_[c].byte()));
        p = c;
    }
    return out;
}

}  // namespace constrain
