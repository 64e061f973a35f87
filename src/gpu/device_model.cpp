// ds41 gpu: DeviceModel::load (device_model.h). One device arena holds every weight (the small
// float32 vectors, the expert struct arrays and the RoPE tables first, then the checkpoint-format
// payloads, each 256-byte aligned); Engram tables go to a mapped host-pinned arena instead with
// engram_host_pinned. The total is checked against cudaMemGetInfo before anything is allocated,
// so the full released layout (510 GB) fails at once with the numbers instead of after minutes.
#include "gpu/device_model.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "backends/cuda/cuda_status.h"
#include "gpu/device_buffer.h"
#include "gpu/device_weight_items.h"
#include "gpu/device_weight_upload.h"
#include "gpu/dummy_weights.h"
#include "model/dspark_weights.h"
#include "model/loader/safetensors.h"
#include "model/loader/tensor_contract.h"
#include "model/model.h"
#include "model/model_setup.h"
#include "model/model_weights.h"
#include "model/presets.h"
#include "model/vision_weights.h"

namespace ds41::gpu {
namespace {

constexpr uint64_t kWeightAlign = 256;
uint64_t align_up(uint64_t x) { return (x + kWeightAlign - 1) / kWeightAlign * kWeightAlign; }

bool has_safetensors(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return false;
  if (fs::exists(fs::path(dir) / "model.safetensors.index.json", ec)) return true;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") return true;
  return false;
}

// Where each item lives: offsets into the device arena (or the pinned arena).
struct Placement {
  uint64_t data = 0, scale = 0;
  bool pinned = false;
};

struct Plan {
  std::vector<Placement> at;  // per item
  uint64_t small_end = 0;     // [0, small_end): vectors, expert structs, RoPE (one host image)
  uint64_t device_bytes = 0;
  uint64_t pinned_bytes = 0;
  std::vector<uint64_t> structs;  // per layer: offset of 3 * n_experts DeviceWeight (w1, w2, w3)
  uint64_t rope_main = 0, rope_yarn = 0;
  // Bytes by kind, for the messages.
  uint64_t linear_bytes = 0, engram_bytes = 0, embed_bytes = 0, small_bytes = 0;
};

// n_experts: per block with experts (the layers, then the DSpark stages) its expert count.
Plan make_plan(const std::vector<WeightItem>& items, const std::vector<int64_t>& n_experts,
               const model::ModelConfig& c, bool engram_pinned) {
  Plan p;
  p.at.resize(items.size());
  uint64_t off = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const WeightItem& it = items[i];
    if (it.kind == WeightItemKind::kVec || it.kind == WeightItemKind::kOmega) {
      p.at[i].data = off;
      off = align_up(off + it.data_bytes());
    }
  }
  for (int64_t ne : n_experts) {
    p.structs.push_back(off);
    off = align_up(off + 3 * static_cast<uint64_t>(ne) * sizeof(cuda::DeviceWeight));
  }
  const uint64_t rope_bytes = static_cast<uint64_t>(c.qk_rope_head_dim / 2) * sizeof(float);
  p.rope_main = off;
  off = align_up(off + rope_bytes);
  p.rope_yarn = off;
  off = align_up(off + rope_bytes);
  p.small_end = off;
  p.small_bytes = off;
  uint64_t pin = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const WeightItem& it = items[i];
    if (it.kind == WeightItemKind::kVec || it.kind == WeightItemKind::kOmega) continue;
    const bool pinned = engram_pinned && it.kind == WeightItemKind::kEngramTable;
    uint64_t& o = pinned ? pin : off;
    p.at[i].pinned = pinned;
    p.at[i].data = o;
    o = align_up(o + it.data_bytes());
    p.at[i].scale = o;
    o = align_up(o + it.scale_bytes());
    const uint64_t b = it.data_bytes() + it.scale_bytes();
    (it.kind == WeightItemKind::kEngramTable ? p.engram_bytes
     : it.kind == WeightItemKind::kEmbed     ? p.embed_bytes
                                             : p.linear_bytes) += b;
  }
  p.device_bytes = off;
  p.pinned_bytes = pin;
  return p;
}

}  // namespace

struct DeviceModel::Impl {
  model::ModelConfig cfg;
  model::LayerSchedule sched;
  model::KvLayout layout;
  std::unique_ptr<engram::EngramHasher> hasher;
  DeviceModelWeights w;
  DeviceVec rope_main, rope_yarn;
  DeviceBuffer arena;
  PinnedBuffer pinned;
  int device = 0;
};

DeviceModel::DeviceModel() : impl_(std::make_unique<Impl>()) {}
DeviceModel::~DeviceModel() = default;
const model::ModelConfig& DeviceModel::config() const { return impl_->cfg; }
const model::LayerSchedule& DeviceModel::schedule() const { return impl_->sched; }
const model::KvLayout& DeviceModel::kv_layout() const { return impl_->layout; }
const engram::EngramHasher* DeviceModel::hasher() const { return impl_->hasher.get(); }
const DeviceModelWeights& DeviceModel::weights() const { return impl_->w; }
const DeviceVec& DeviceModel::rope_inv_freq(bool yarn) const {
  return yarn ? impl_->rope_yarn : impl_->rope_main;
}
int DeviceModel::device() const { return impl_->device; }
uint64_t DeviceModel::weight_bytes() const {
  return impl_->arena.size();
}  // pinned Engram tables not counted

Result<std::unique_ptr<DeviceModel>> DeviceModel::load(const std::string& dir, const DeviceLoadOptions& opt) {
  const int n_dev = cuda::cuda_device_count();
  if (n_dev == 0) return failed_precondition("no CUDA device found (the device model needs a GPU)");
  if (opt.device < 0 || opt.device >= n_dev)
    return invalid_argument("CUDA device " + std::to_string(opt.device) + " does not exist (" +
                            std::to_string(n_dev) + " visible)");
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaSetDevice(opt.device), "cudaSetDevice"));
  std::unique_ptr<DeviceModel> m(new DeviceModel());
  Impl& I = *m->impl_;
  I.device = opt.device;

  // Format and config.
  LoadFormat fmt = opt.format;
  if (fmt == LoadFormat::kAuto) {
    if (!has_safetensors(dir))
      return not_found((dir.empty() ? std::string("no model folder") : dir + ": no safetensors files") +
                       " (pass --load-format dummy to generate random weights on the device)");
    fmt = LoadFormat::kSafetensors;
  }
  const bool have_config =
      !dir.empty() && std::filesystem::exists(std::filesystem::path(dir) / "config.json");
  std::string where = dir + "/config.json";
  if (have_config) {
    DS41_ASSIGN_OR_RETURN(I.cfg, model::load_model_config(dir));
  } else if (fmt == LoadFormat::kDummy && !opt.preset.empty()) {
    DS41_ASSIGN_OR_RETURN(I.cfg, model::preset_config(opt.preset));
    where = "preset " + opt.preset;
  } else {
    return not_found(fmt == LoadFormat::kDummy ? "dummy weights need a folder with config.json or a preset"
                                               : where + ": missing");
  }
  const model::ModelConfig& c = I.cfg;
  DS41_RETURN_IF_ERROR(model::validate_model_config(c).with_context(where));
  DS41_RETURN_IF_ERROR(model::check_model_config_supported(c, where));
  DS41_ASSIGN_OR_RETURN(I.sched, model::derive_layer_schedule(c));
  DS41_ASSIGN_OR_RETURN(I.layout, model::make_kv_layout(c, I.sched));

  // The weights' host view (safetensors: the whole contract validated, every mismatch reported).
  std::unique_ptr<model::Checkpoint> ck;
  std::unique_ptr<model::ModelWeights> mw;
  std::unique_ptr<model::VisionWeights> vw;
  std::unique_ptr<model::DsparkWeights> dsw;
  model::TensorContract contract;
  if (fmt == LoadFormat::kSafetensors) {
    DS41_ASSIGN_OR_RETURN(ck, model::Checkpoint::open(dir));
    DS41_ASSIGN_OR_RETURN(mw, model::bind_model_weights(*ck, c, I.sched));
    if (c.has_vision) {
      DS41_ASSIGN_OR_RETURN(vw, model::bind_vision_weights(*ck, c));
    }
    if (c.num_nextn_predict_layers > 0) {
      DS41_ASSIGN_OR_RETURN(dsw, model::bind_dspark_weights(*ck, c));
    }
  } else {
    DS41_ASSIGN_OR_RETURN(contract, model::derive_tensor_contract(c, I.sched));
  }
  DS41_ASSIGN_OR_RETURN(I.hasher, model::make_engram_hasher(c, dir, opt.tokenizer_dir));
  std::vector<WeightItem> items = list_device_weights(c, I.sched, I.w, mw.get(), vw.get(), dsw.get());
  if (fmt == LoadFormat::kDummy) DS41_RETURN_IF_ERROR(apply_contract_formats(contract, items));

  // Memory check before any allocation.
  std::vector<DeviceLayer*> blocks;  // every block with experts: the layers, then the DSpark stages
  for (DeviceLayer& d : I.w.layers) blocks.push_back(&d);
  if (I.w.dspark)
    for (DeviceLayer& d : I.w.dspark->stages) blocks.push_back(&d);
  std::vector<int64_t> n_experts;
  for (DeviceLayer* d : blocks) n_experts.push_back(static_cast<int64_t>(d->experts.size()));
  const Plan plan = make_plan(items, n_experts, c, opt.engram_host_pinned);
  size_t free_b = 0, total_b = 0;
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"));
  if (plan.device_bytes > free_b) {
    std::string m2 = "out of device memory loading " + where + ": the weights need " +
                     gib_text(plan.device_bytes) + " on the device (linear weights " + gib_text(plan.linear_bytes) +
                     ", embedding " + gib_text(plan.embed_bytes) + ", Engram tables " +
                     (opt.engram_host_pinned ? "0 (host-pinned: " + gib_text(plan.engram_bytes) + ")"
                                             : gib_text(plan.engram_bytes)) +
                     ", vectors " + gib_text(plan.small_bytes) + ") but only " + gib_text(free_b) + " of " +
                     gib_text(total_b) + " is free on CUDA device " + std::to_string(opt.device);
    if (!opt.engram_host_pinned && plan.engram_bytes > 0)
      m2 += " (--engram-host-pinned keeps the Engram tables in host memory)";
    return resource_exhausted(m2);
  }
  DS41_ASSIGN_OR_RETURN(I.arena, DeviceBuffer::allocate(plan.device_bytes, "the model weights"));
  if (plan.pinned_bytes > 0) {
    DS41_ASSIGN_OR_RETURN(I.pinned,
                          PinnedBuffer::allocate(plan.pinned_bytes, "the Engram tables", /*mapped=*/true));
  }

  // Device addresses.
  uint8_t* base = I.arena.as<uint8_t>();
  uint8_t* pin_host = static_cast<uint8_t*>(I.pinned.data());
  uint8_t* pin_dev = static_cast<uint8_t*>(I.pinned.device_ptr());
  for (size_t i = 0; i < items.size(); ++i) {
    WeightItem& it = items[i];
    const Placement& at = plan.at[i];
    uint8_t* b = at.pinned ? pin_dev : base;
    switch (it.kind) {
      case WeightItemKind::kVec:
      case WeightItemKind::kOmega:
        *it.vec = DeviceVec{reinterpret_cast<const float*>(base + at.data), it.rows * it.cols};
        break;
      case WeightItemKind::kEmbed: *it.data = b + at.data; break;
      case WeightItemKind::kEngramTable:
        *it.data = b + at.data;
        *it.scale = b + at.scale;
        break;
      case WeightItemKind::kLinear:
        it.weight->format = it.format;
        it.weight->data = b + at.data;
        it.weight->scale = it.scale_bytes() > 0 ? b + at.scale : nullptr;
        break;
    }
  }

  // The small region's host image: float vectors (safetensors), expert struct arrays, RoPE tables.
  std::vector<uint8_t> image(plan.small_end, 0);
  for (size_t i = 0; i < items.size(); ++i) {
    const WeightItem& it = items[i];
    if ((it.kind == WeightItemKind::kVec || it.kind == WeightItemKind::kOmega) && it.host_vec) {
      if (it.host_vec->size() * sizeof(float) != it.data_bytes())
        return internal_error(it.name + ": host vector of " + std::to_string(it.host_vec->size()) +
                              " floats, expected " + std::to_string(it.rows * it.cols));
      std::memcpy(image.data() + plan.at[i].data, it.host_vec->data(), it.data_bytes());
    }
  }
  for (size_t l = 0; l < blocks.size(); ++l) {
    DeviceLayer& d = *blocks[l];
    const size_t ne = d.experts.size();
    auto* st = reinterpret_cast<cuda::DeviceWeight*>(image.data() + plan.structs[l]);
    for (size_t e = 0; e < ne; ++e) {
      st[e] = d.experts[e].w1;
      st[ne + e] = d.experts[e].w2;
      st[2 * ne + e] = d.experts[e].w3;
    }
    auto* dst = reinterpret_cast<const cuda::DeviceWeight*>(base + plan.structs[l]);
    d.d_w1 = dst;
    d.d_w2 = dst + ne;
    d.d_w3 = dst + 2 * ne;
  }
  const std::vector<float> rm = model::rope_inv_freq_main(c), ry = model::rope_inv_freq_yarn(c);
  std::memcpy(image.data() + plan.rope_main, rm.data(), rm.size() * sizeof(float));
  std::memcpy(image.data() + plan.rope_yarn, ry.data(), ry.size() * sizeof(float));
  I.rope_main =
      DeviceVec{reinterpret_cast<const float*>(base + plan.rope_main), static_cast<int64_t>(rm.size())};
  I.rope_yarn =
      DeviceVec{reinterpret_cast<const float*>(base + plan.rope_yarn), static_cast<int64_t>(ry.size())};
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpy(base, image.data(), image.size(), cudaMemcpyHostToDevice),
                                         "upload of the vectors"));
  // A pageable cudaMemcpy may return before its DMA lands; the dummy kernels below (another stream)
  // overwrite parts of this region, so wait for it.
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaDeviceSynchronize(), "upload of the vectors"));

  if (fmt == LoadFormat::kDummy) {
    cudaStream_t stream = nullptr;
    DS41_RETURN_IF_ERROR(
        cuda::cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
    Status s = fill_dummy_weights(c, contract, items, opt.seed, stream);
    cudaStreamDestroy(stream);
    DS41_RETURN_IF_ERROR(s);
    if (opt.progress)
      opt.progress(plan.device_bytes + plan.pinned_bytes, plan.device_bytes + plan.pinned_bytes);
    return m;
  }

  // Safetensors: every checkpoint-format payload streamed from its shard.
  std::map<const model::SafetensorsFile*, int> file_index;
  std::vector<std::string> paths;
  for (const auto& f : ck->files()) {
    file_index[f.get()] = static_cast<int>(paths.size());
    paths.push_back(f->path());
  }
  std::map<const uint8_t*, const model::TensorRef*> by_ptr;
  for (const auto& [name, t] : ck->tensors()) by_ptr[t.data] = &t;
  std::vector<UploadJob> jobs;
  auto add_job = [&](const uint8_t* src, uint64_t bytes, uint8_t* dst_dev, uint8_t* dst_host,
                     const std::string& name) -> Status {
    if (bytes == 0) return ok_status();
    auto f = by_ptr.find(src);
    if (f == by_ptr.end()) return internal_error(name + ": source bytes are not a checkpoint tensor");
    const model::TensorRef& t = *f->second;
    if (t.info->nbytes() != bytes)
      return internal_error(name + ": " + std::to_string(t.info->nbytes()) + " bytes in the file, " +
                            std::to_string(bytes) + " expected");
    UploadJob j;
    j.file = file_index.at(t.file);
    j.offset = t.file->data_section_offset() + t.info->begin;
    j.bytes = bytes;
    j.dst = dst_host ? static_cast<void*>(dst_host) : static_cast<void*>(dst_dev);
    j.dst_host = dst_host != nullptr;
    jobs.push_back(j);
    return ok_status();
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const WeightItem& it = items[i];
    if (it.kind == WeightItemKind::kVec || it.kind == WeightItemKind::kOmega) continue;
    const Placement& at = plan.at[i];
    uint8_t* dev = at.pinned ? nullptr : base;
    uint8_t* host = at.pinned ? pin_host : nullptr;
    auto d = [&](uint64_t o) { return dev ? dev + o : nullptr; };
    auto h = [&](uint64_t o) { return host ? host + o : nullptr; };
    DS41_RETURN_IF_ERROR(add_job(it.host_data, it.data_bytes(), d(at.data), h(at.data), it.name));
    if (it.scale_bytes() > 0)
      DS41_RETURN_IF_ERROR(
          add_job(it.host_scale, it.scale_bytes(), d(at.scale), h(at.scale), it.name + ".scale"));
  }
  UploadOptions uo;
  uo.device = opt.device;
  uo.io_threads = std::max(1, opt.io_threads);
  uo.progress = opt.progress;
  DS41_RETURN_IF_ERROR(upload_file_ranges(paths, jobs, uo).with_context("loading " + dir + " to the device"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaDeviceSynchronize(), "loading the weights"));
  return m;
}

}  // namespace ds41::gpu
