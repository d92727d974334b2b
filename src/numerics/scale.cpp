// Names of the scale vocabulary (scale.h), for messages, tables and file metadata.
#include "numerics/scale.h"

namespace octet {

const char* granularity_name(Granularity g) {
  switch (g) {
    case Granularity::kTensor:
      return "tensor";
    case Granularity::kRow:
      return "row";
    case Granularity::k1x128:
      return "1x128";
    case Granularity::k128x1:
      return "128x1";
    case Granularity::k128x128:
      return "128x128";
  }
  return "?";
}

const char* format_name(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2";
}

}  // namespace octet
