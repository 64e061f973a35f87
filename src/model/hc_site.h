// ds41 model: the mapping of one mHC site (MODEL_SPEC 3.3): from the residual streams of n rows
// and a site's weights, the pre / post weights and the combination matrix (Sinkhorn), through
// the backend's hc_map. Shared by the target layers (forward_pass.cpp) and the DSpark draft
// stages (dspark_draft.cpp), which map their sites the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/model_weights.h"
#include "ops/backend.h"

namespace ds41::model {

// streams: [n, hc_mult, hidden]. Resizes and fills pre/post [n, hc_mult], comb [n, hc_mult^2].
void hc_site_map(ops::Backend& be, const ModelConfig& c, const HcSiteWeights& w, const float* streams,
                 int64_t n, std::vector<float>* pre, std::vector<float>* post, std::vector<float>* comb);

}  // namespace ds41::model
