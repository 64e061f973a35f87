// ds41 engine: RequestStream — the thread-safe event queue between the engine loop (push) and one
// client (next / cancel). See engine_loop.h for the contract.
#include "engine/engine_loop.h"

namespace ds41::engine {

bool RequestStream::next(std::vector<TokenEvent>* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (delivered_final_ && events_.empty()) return false;
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  while (!events_.empty()) {
    if (events_.front().finish != FinishReason::kNone) delivered_final_ = true;
    out->push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

void RequestStream::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

bool RequestStream::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void RequestStream::set_notify(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  notify_ = std::move(fn);
}

void RequestStream::push(TokenEvent ev) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;  // exactly one final event per stream
    if (ev.finish != FinishReason::kNone) finished_ = true;
    events_.push_back(std::move(ev));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

}  // namespace ds41::engine
