// Parts of safetensors files: what several writers need to fill one file together, and what a
// reader needs to read only some elements of its tensors (io/safetensors.h has the format).
//
// A file's layout (its header bytes and each tensor's place) is a pure function of the tensors'
// names, dtypes and shapes and the metadata: safetensors_layout computes it exactly as
// write_safetensors writes it (write_safetensors uses it), so writers that each put some tensors'
// element ranges at their offsets (pwrite) produce the same bytes as one write_safetensors of
// the whole set.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace octet::io {

struct TensorDecl {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t nbytes() const { return shape_numel(shape) * dtype_size(dtype); }
};

struct SafetensorsLayout {
  std::string prefix;  // the 8-byte header length and the header: the file's first bytes
  std::vector<int64_t>
      offset;  // per declared tensor (declaration order): its first byte in the file
  int64_t file_bytes = 0;
};

// The layout of a file holding `tensors` (names unique, non-empty, not "__metadata__"); errors
// name `path`.
SafetensorsLayout safetensors_layout(const std::vector<TensorDecl>& tensors,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::string& path);

// Element ranges [begin, end) per tensor name.
using ElementRanges = std::map<std::string, std::vector<std::pair<int64_t, int64_t>>>;

// Reads a file as read_safetensors does (the header fully validated), except that a tensor named
// in `wanted` has only those element ranges read from the file: its other elements are left
// uninitialised (a large tensor's unread pages are never touched). Tensors not named are read
// whole. Errors name the file and the tensor (a range outside the tensor included).
SafetensorsFile read_safetensors_ranges(const std::string& path, const ElementRanges& wanted);

}  // namespace octet::io
