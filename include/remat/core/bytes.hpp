// remat/core/bytes.hpp — the one type of memory sizes in remat.
#pragma once

#include <cstdint>

namespace remat {

/// Sizes in bytes. Signed so that differences and "not enough memory" stay representable.
using Bytes = std::int64_t;

}  // namespace remat
