// safetensors: the checkpoint and tensor file format of the Hugging Face ecosystem and of
// DeepSeek-V3's released FP8 weights.
//
// Layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON, then the data buffer. The JSON
// object maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}
// (offsets into the buffer, row-major, little-endian) and may hold "__metadata__": {string:
// string}.
//
// Reading validates every field, and more strictly than the reference reader
// (huggingface/safetensors) where that catches corrupt files: each entry has exactly dtype, shape
// and data_offsets; sizes agree with shape and dtype; the tensors tile the buffer with no overlap,
// gap or trailing bytes (as the reference requires); names are unique; the file is not truncated.
// Every error names the file and the tensor.
//
// Writing follows the reference writer's bytes: compact JSON with "__metadata__" first, then the
// tensors ordered by dtype (widest first, in huggingface/safetensors' enumeration order) and by
// name, data laid out in that order, the header padded with spaces to a multiple of 8 bytes. So the
// buffer starts 8-byte aligned and every tensor is aligned to its element size. The write is atomic
// (temporary file, then rename): a failure never leaves a partial file and never damages an
// existing one.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace octet::io {

// The safetensors dtype spelling ("F32", "F8_E4M3", ...) -> DType; nullopt for dtypes octet lacks.
std::optional<DType> dtype_from_safetensors_name(std::string_view name);

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsFile {
  std::string path;      // where it was read from, for error messages
  NamedTensors tensors;  // host tensors, in the order of their data in the file
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent

  bool contains(const std::string& name) const;
  // Throws naming the file and the missing tensor.
  const Tensor& at(const std::string& name) const;
};

// Reads and validates the whole file; tensors are host tensors, each in its own 64-byte aligned
// buffer.
SafetensorsFile read_safetensors(const std::string& path);

// The same, from the bytes of a whole file in memory; errors name `name` where read_safetensors
// names the path.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name);

// Writes host tensors (any of octet's dtypes, 0-d and empty included). Names must be unique,
// non-empty and not "__metadata__". Atomic: writes a new `path.tmp.<pid>.<random>` and renames it
// onto `path`.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace octet::io
