// Test support: FakeEngine — an engine::Engine without a model. A sequence's logits row is a
// deterministic function of its own token history only (so batch composition cannot matter),
// state bytes are base + per_token * tokens, and every step's batch is recorded.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace ds41::testing {

class FakeEngine final : public engine::Engine {
 public:
  explicit FakeEngine(int64_t vocab = 64, int64_t max_context = 1 << 20) {
    info_.model_name = "fake";
    info_.device = "cpu";
    info_.vocab_size = vocab;
    info_.max_context = max_context;
    info_.eos_token_id = -1;
  }
  engine::EngineInfo& mutable_info() { return info_; }
  int64_t base_bytes = 1000, bytes_per_token = 10;
  std::chrono::milliseconds step_delay{0};
  // As the GPU engine: StepItem::greedy_only items get their greedy token in StepOutput::token
  // (the sampler's draw; kInvalidRow for a row it refuses) instead of the row.
  bool draws_greedy = false;
  // The row after a history of this length holds a NaN (index 3): the sampler refuses it.
  int64_t nan_at_length = -1;
  std::atomic<int64_t> greedy_drawn{0};

  const engine::EngineInfo& info() const override { return info_; }
  Result<engine::SeqId> create_sequence() override {
    seqs_[next_] = {};
    return next_++;
  }
  Result<engine::SeqId> fork_sequence(engine::SeqId src) override {
    auto it = seqs_.find(src);
    if (it == seqs_.end()) return not_found("no sequence");
    seqs_[next_] = it->second;
    return next_++;
  }
  Status free_sequence(engine::SeqId seq) override {
    return seqs_.erase(seq) ? ok_status() : not_found("no sequence " + std::to_string(seq));
  }
  Result<int64_t> sequence_position(engine::SeqId seq) const override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return not_found("no sequence");
    return static_cast<int64_t>(it->second.size());
  }
  Result<int64_t> sequence_bytes(engine::SeqId seq) const override {
    auto p = sequence_position(seq);
    if (!p.ok()) return p.status();
    return bytes_for_tokens(*p);
  }
  int64_t bytes_for_tokens(int64_t n) const override { return base_bytes + bytes_per_token * n; }
  int64_t live_sequences() const override { return static_cast<int64_t>(seqs_.size()); }

  Status step(std::span<const engine::StepItem> items, engine::StepOutput* out) override {
    std::set<engine::SeqId> seen;
    for (const auto& it : items) {
      if (!seqs_.count(it.seq) || !seen.insert(it.seq).second || it.tokens.empty())
        return invalid_argument("bad step item");
      for (int32_t t : it.tokens)
        if (t < 0 || t >= info_.vocab_size) return invalid_argument("bad token");
    }
    if (step_delay.count() > 0) std::this_thread::sleep_for(step_delay);
    std::vector<std::pair<engine::SeqId, int64_t>> rec;
    out->vocab = info_.vocab_size;
    out->logits.clear();
    out->row.assign(items.size(), -1);
    out->token.assign(items.size(), -1);
    for (size_t i = 0; i < items.size(); ++i) {
      auto& h = seqs_[items[i].seq];
      h.insert(h.end(), items[i].tokens.begin(), items[i].tokens.end());
      rec.push_back({items[i].seq, static_cast<int64_t>(items[i].tokens.size())});
      if (!items[i].want_logits) continue;
      auto row = logits_for(h, info_.vocab_size);
      if (static_cast<int64_t>(h.size()) == nan_at_length) row[3] = std::nanf("");
      if (draws_greedy && items[i].greedy_only) {  // the sampler's greedy draw, or its refusal
        auto greedy = engine::Sampler::create(engine::SamplerParams{});
        if (!greedy.ok()) return greedy.status();
        const Result<int32_t> tok = greedy->sample(row);
        out->token[i] = tok.ok() ? *tok : engine::StepOutput::kInvalidRow;
        ++greedy_drawn;
        continue;
      }
      out->row[i] = static_cast<int64_t>(out->logits.size()) / info_.vocab_size;
      out->logits.insert(out->logits.end(), row.begin(), row.end());
    }
    std::lock_guard<std::mutex> lk(mu_);
    steps_.push_back(std::move(rec));
    return ok_status();
  }

  // The logits row after `history`: depends on the history only.
  static std::vector<float> logits_for(const std::vector<int32_t>& history, int64_t vocab) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : history) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
    std::vector<float> row(vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      uint64_t x = h + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(v + 1);
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
      x ^= x >> 31;
      row[v] = static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1 << 24) * 6.0);
    }
    return row;
  }
  std::vector<std::vector<std::pair<engine::SeqId, int64_t>>> steps() const {
    std::lock_guard<std::mutex> lk(mu_);
    return steps_;
  }

 private:
  engine::EngineInfo info_;
  std::map<engine::SeqId, std::vector<int32_t>> seqs_;
  engine::SeqId next_ = 1;
  mutable std::mutex mu_;
  std::vector<std::vector<std::pair<engine::SeqId, int64_t>>> steps_;
};

}  // namespace ds41::testing
