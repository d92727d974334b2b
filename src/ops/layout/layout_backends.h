// Internal: per-backend implementations behind layout.h; layout.cpp validated the arguments.
#pragma once

#include "ops/layout/layout.h"

namespace octet {

namespace cpu {
void copy_columns(Context& ctx, const CopyColumnsArgs& args);
}
namespace cuda {
void copy_columns(Context& ctx, const CopyColumnsArgs& args);
}

}  // namespace octet
