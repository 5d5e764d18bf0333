#include "common/version.h"

#include "common/wire.h"

#ifndef PARASYNC_VERSION
#error "PARASYNC_VERSION must be defined by the build (common/CMakeLists.txt)"
#endif
#ifndef PARASYNC_SCHEMA_SHA256
#error "PARASYNC_SCHEMA_SHA256 must be defined by the build (common/CMakeLists.txt)"
#endif

namespace parasync {

BuildIdentity GetBuildIdentity() {
  return {PARASYNC_VERSION, std::to_string(kProtocolVersion),
          std::string(PARASYNC_SCHEMA_SHA256).substr(0, 12)};
}

std::string BuildVersion() {
  const BuildIdentity b = GetBuildIdentity();
  return b.version + " protocol " + b.protocol + " schema " + b.schema;
}

std::string VersionLine(const std::string& program) { return program + " " + BuildVersion(); }

}  // namespace parasync
