// ds41 engine: ImageEncoder (image_encoder.h).
#include "engine/image_encoder.h"

#include <string>

namespace ds41::engine {

bool EncodeTicket::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

Result<std::vector<std::vector<float>>> EncodeTicket::take() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!done_) return failed_precondition("the image job has not ended");
  if (taken_) return failed_precondition("the image job's result was taken already");
  taken_ = true;
  Result<std::vector<std::vector<float>>> r = std::move(result_);
  result_ = unavailable("the image job's result was taken");
  return r;
}

void EncodeTicket::cancel() {
  std::lock_guard<std::mutex> lk(mu_);
  cancelled_ = true;
}

bool EncodeTicket::cancelled() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cancelled_;
}

ImageEncoder::ImageEncoder(Engine* engine, int64_t max_jobs, Clock* clock)
    : engine_(engine), max_jobs_(max_jobs < 1 ? 1 : max_jobs), clock_(clock) {}

ImageEncoder::~ImageEncoder() { stop(); }

void ImageEncoder::set_listener(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  listener_ = std::move(fn);
}

Result<std::shared_ptr<EncodeTicket>> ImageEncoder::submit(
    std::vector<std::shared_ptr<const image::PreparedImage>> images) {
  for (size_t i = 0; i < images.size(); ++i)
    if (!images[i]) return invalid_argument("image encoder: image " + std::to_string(i) + " is null");
  auto t = std::make_shared<EncodeTicket>();
  t->images_ = std::move(images);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return unavailable("the image encoder is stopped");
    if (static_cast<int64_t>(queue_.size()) + st_.running >= max_jobs_) {
      ++st_.rejected;
      return resource_exhausted("the image encoder queue is full (" + std::to_string(max_jobs_) + " jobs)");
    }
    queue_.push_back(t);
    st_.queued = static_cast<int64_t>(queue_.size());
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  cv_.notify_all();
  return t;
}

void ImageEncoder::run() {
  for (;;) {
    std::shared_ptr<EncodeTicket> t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;  // stop() ended the queued jobs
      t = std::move(queue_.front());
      queue_.pop_front();
      st_.queued = static_cast<int64_t>(queue_.size());
      if (!t->cancelled()) st_.running = 1;
    }
    const bool skip = t->cancelled();
    Result<std::vector<std::vector<float>>> res = unavailable("the image job was cancelled before it ran");
    int64_t busy = 0;
    if (!skip) {
      std::vector<const image::PreparedImage*> ptrs;
      ptrs.reserve(t->images_.size());
      for (const auto& p : t->images_) ptrs.push_back(p.get());
      const int64_t t0 = clock_->now_mono_ns();
      res = engine_->encode_images(ptrs);
      busy = clock_->now_mono_ns() - t0;
      if (res.ok() && res->size() != ptrs.size())
        res = internal_error("the engine returned " + std::to_string(res->size()) + " span-row sets for " +
                             std::to_string(ptrs.size()) + " images");
    }
    std::function<void()> listener;
    {
      std::lock_guard<std::mutex> lk(mu_);
      st_.running = 0;
      if (!skip) {
        ++st_.jobs;
        st_.busy_ns += busy;
        if (res.ok())
          st_.images += static_cast<int64_t>(t->images_.size());
        else
          ++st_.errors;
      }
      listener = listener_;
    }
    {
      std::lock_guard<std::mutex> lk(t->mu_);
      t->result_ = t->cancelled_
                       ? Result<std::vector<std::vector<float>>>(unavailable("the image job was cancelled"))
                       : std::move(res);
      t->images_.clear();
      t->done_ = true;
    }
    if (listener) listener();
  }
}

void ImageEncoder::stop() {
  std::lock_guard<std::mutex> join_lk(join_mu_);
  std::deque<std::shared_ptr<EncodeTicket>> rest;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    rest.swap(queue_);
    st_.queued = 0;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& t : rest) {
    std::lock_guard<std::mutex> lk(t->mu_);
    t->result_ = unavailable("the image encoder stopped before the job ran");
    t->images_.clear();
    t->done_ = true;
  }
}

ImageEncoderStats ImageEncoder::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return st_;
}

}  // namespace ds41::engine
