// ds41 model: DsparkState allocation.
#include "model/dspark_state.h"

namespace ds41::model {

DsparkState::DsparkState(int64_t n_stages, int64_t window, int64_t row_bytes)
    : window_(window), row_bytes_(row_bytes) {
  rings_.assign(static_cast<size_t>(n_stages),
                std::vector<uint8_t>(static_cast<size_t>(window * row_bytes), 0));
}

}  // namespace ds41::model
