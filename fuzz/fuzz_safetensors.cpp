// The safetensors reader (io/safetensors.h) on arbitrary bytes: every input is either read or
// refused with octet::Error. A file that reads must write back (write_safetensors) and read again
// to the same names, dtypes, shapes, bytes and metadata.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/check.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

namespace {

void expect_same(const octet::io::SafetensorsFile& a, const octet::io::SafetensorsFile& b) {
  using octet::fuzz::fail;
  if (a.metadata != b.metadata) fail("metadata changed in a write and read");
  if (a.tensors.size() != b.tensors.size()) fail("tensor count changed in a write and read");
  for (const auto& [name, t] : a.tensors) {
    if (!b.contains(name)) fail("tensor '" + name + "' lost in a write and read");
    const octet::Tensor& u = b.at(name);
    if (u.dtype() != t.dtype() || u.shape() != t.shape() || u.nbytes() != t.nbytes() ||
        (t.nbytes() && std::memcmp(u.data(), t.data(), static_cast<size_t>(t.nbytes())) != 0))
      fail("tensor '" + name + "' changed in a write and read");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  octet::io::SafetensorsFile f;
  try {
    f = octet::io::parse_safetensors(bytes, "input.safetensors");
  } catch (const octet::Error&) {
    return 0;
  }
  // What read, writes: the reader accepts only what octet's own writer can reproduce.
  const std::string path = octet::fuzz::scratch_dir() + "/copy.safetensors";
  try {
    octet::io::write_safetensors(path, f.tensors, f.metadata);
  } catch (const octet::Error& e) {
    octet::fuzz::fail(std::string("a file that reads does not write: ") + e.what());
  }
  expect_same(f, octet::io::read_safetensors(path));
  return 0;
}
