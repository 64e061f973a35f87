// ds41 model: one mHC site's mapping (hc_site.h).
#include "model/hc_site.h"

namespace ds41::model {

void hc_site_map(ops::Backend& be, const ModelConfig& c, const HcSiteWeights& w, const float* streams,
                 int64_t n, std::vector<float>* pre, std::vector<float>* post, std::vector<float>* comb) {
  const int64_t C = c.hc_mult;
  pre->resize(n * C);
  post->resize(n * C);
  comb->resize(n * C * C);
  ops::HcMapArgs a;
  a.n = n;
  a.c = C;
  a.h = c.hidden_size;
  a.sinkhorn_iters = c.hc_sinkhorn_iters;
  a.streams = streams;
  a.fn = w.fn.data();
  a.scale = w.scale.data();
  a.base = w.base.data();
  a.hc_eps = static_cast<float>(c.hc_eps);
  a.norm_eps = static_cast<float>(c.rms_norm_eps);
  a.pre = pre->data();
  a.post = post->data();
  a.comb = comb->data();
  be.hc_map(a);
}

}  // namespace ds41::model
