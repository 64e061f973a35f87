// ds41 ops: WeightRef helpers.
#include "ops/weight_ref.h"

namespace ds41::ops {

int64_t WeightRef::bytes() const {
  return quant::weight_payload_bytes(format, out_dim, in_dim) +
         quant::weight_scale_bytes(format, out_dim, in_dim);
}

}  // namespace ds41::ops
