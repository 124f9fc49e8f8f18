// remat/version.hpp — the library's version, for code that must check it at compile time.
// CMake reads its project version from this file, so there is one place to change it.
#pragma once

#define REMAT_VERSION_MAJOR 0
#define REMAT_VERSION_MINOR 2
#define REMAT_VERSION_PATCH 0
#define REMAT_VERSION_STRING "0.2.0"
/// One number that grows with every release: major * 10000 + minor * 100 + patch.
#define REMAT_VERSION (REMAT_VERSION_MAJOR * 10000 + REMAT_VERSION_MINOR * 100 + REMAT_VERSION_PATCH)

namespace remat {

/// The version as "major.minor.patch".
inline constexpr const char* version_string = REMAT_VERSION_STRING;

}  // namespace remat
