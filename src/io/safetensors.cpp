#include "io/safetensors.h"
#include "io/safetensors_parts.h"

#include "io/atomic_file.h"
#include "io/json_keys.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

namespace octet::io {

// The format stores little-endian data, and tensors are read straight into host memory.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

// Insertion order kept, so the written header matches the reference writer's byte for byte.
using Json = nlohmann::ordered_json;

// huggingface/safetensors refuses headers above 100 MB; checking first bounds the allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// No file holds 2^62 bytes: larger dimensions are rejected outright (and so always fit int64_t).
constexpr uint64_t kMaxDim = uint64_t{1} << 62;

constexpr DType kDTypes[] = {DType::kF32,  DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2,
                             DType::kE8M0, DType::kI32,  DType::kI64, DType::kU8,   DType::kU16};

std::string supported_dtypes() {
  std::string s;
  for (DType d : kDTypes) s += (s.empty() ? "" : "|") + std::string(dtype_name(d));
  return s;
}

struct Entry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

std::string tensor_where(const std::string& path, const std::string& name) {
  return path + ": tensor '" + name + "'";
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// Headers are parsed into std::map-backed JSON: ordered_json finds each key by a linear scan, which
// made reading a header of n tensors take O(n^2) time (80k tensors: 15 s). The entries are put in
// data order by check_coverage, so the header's own key order is not needed.
using ParsedJson = nlohmann::json;

ParsedJson parse_header_json(std::string_view text, const std::string& path) {
  ParsedJson j;
  try {
    j = ParsedJson::parse(text);
  } catch (const ParsedJson::exception& e) {
    OCTET_THROW(path, ": header is not valid JSON (", e.what(), ")");
  }
  // The parsed object kept one of two equal keys; the format forbids duplicate tensor names.
  if (const std::optional<DuplicateKey> d = find_duplicate_key(text))
    OCTET_THROW(path, ": header has a duplicate ", d->depth == 1 ? "tensor name '" : "key '",
                d->key, "'");
  OCTET_CHECK(j.is_object(), path, ": header is not a JSON object (got ", j.type_name(), ")");
  return j;
}

std::map<std::string, std::string> parse_metadata(const ParsedJson& v, const std::string& path) {
  OCTET_CHECK(v.is_object(), path, ": __metadata__ must be an object of strings, got ",
              v.type_name());
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : v.items()) {
    OCTET_CHECK(value.is_string(), path, ": __metadata__ value of '", key,
                "' must be a string, got ", value.type_name());
    out[key] = value.get<std::string>();
  }
  return out;
}

DType parse_dtype(const ParsedJson& v, const std::string& where) {
  OCTET_CHECK(v.is_string(), where, ": dtype must be a string, got ", v.dump());
  const std::string name = v.get<std::string>();
  const std::optional<DType> d = dtype_from_safetensors_name(name);
  OCTET_CHECK(d, where, ": unsupported dtype '", name, "' (supported: ", supported_dtypes(), ")");
  return *d;
}

Shape parse_shape(const ParsedJson& v, const std::string& where) {
  OCTET_CHECK(v.is_array(), where, ": shape must be an array of non-negative integers, got ",
              v.dump());
  Shape shape;
  for (const ParsedJson& d : v) {
    OCTET_CHECK(d.is_number_unsigned() && d.get<uint64_t>() < kMaxDim, where,
                ": shape must hold non-negative integers below 2^62, got ", v.dump());
    shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  return shape;
}

// Bytes of a shape and dtype, or nullopt when the product overflows (no file can hold it).
std::optional<uint64_t> checked_nbytes(const Shape& shape, DType dtype) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t n = static_cast<uint64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    if (n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

// Whether the nonzero dimensions, times the element size, fit in int64_t: a Tensor multiplies its
// dimensions in order (numel, rows, nbytes), so an empty shape such as [2^61, 2^61, 0] would
// overflow on the way to its zero (UBSan under fuzz/fuzz_safetensors).
bool addressable(const Shape& shape, DType dtype) {
  auto n = static_cast<uint64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    if (d == 0) continue;
    if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(d))
      return false;
    n *= static_cast<uint64_t>(d);
  }
  return true;
}

Entry parse_entry(const std::string& name, const ParsedJson& v, const std::string& path) {
  const std::string where = tensor_where(path, name);
  OCTET_CHECK(v.is_object(), where, ": expected an object with dtype, shape and data_offsets, got ",
              v.type_name());
  for (const auto& [key, unused] : v.items())
    OCTET_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where,
                ": unexpected field '", key, "' (expected exactly dtype, shape and data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    OCTET_CHECK(v.contains(key), where, ": missing field '", key, "'");
  Entry e;
  e.name = name;
  e.dtype = parse_dtype(v["dtype"], where);
  e.shape = parse_shape(v["shape"], where);
  const ParsedJson& off = v["data_offsets"];
  OCTET_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                  off[1].is_number_unsigned(),
              where, ": data_offsets must be two non-negative integers [begin, end], got ",
              off.dump());
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  OCTET_CHECK(e.begin <= e.end, where, ": data_offsets ", offsets_str(e.begin, e.end),
              " has begin after end");
  const std::optional<uint64_t> need = checked_nbytes(e.shape, e.dtype);
  // A non-empty shape is bounded by the bytes it needs (below); an empty one is not.
  OCTET_CHECK(need != uint64_t{0} || addressable(e.shape, e.dtype), where, ": shape ",
              shape_str(e.shape), " of ", dtype_name(e.dtype),
              " is too large: its nonzero dimensions come to 2^63 bytes or more");
  OCTET_CHECK(need && *need == e.end - e.begin, where, ": data_offsets ",
              offsets_str(e.begin, e.end), " span ", e.end - e.begin, " bytes, but shape ",
              shape_str(e.shape), " of ", dtype_name(e.dtype), " needs ",
              need ? std::to_string(*need) : std::string("more than 2^64"));
  return e;
}

// The reference reader requires the tensors to tile the buffer exactly: no overlap, no gap, no
// tail.
void check_coverage(std::vector<Entry>& entries, uint64_t buffer_bytes, const std::string& path) {
  for (const Entry& e : entries)
    OCTET_CHECK(e.end <= buffer_bytes, tensor_where(path, e.name), ": data_offsets ",
                offsets_str(e.begin, e.end), " extend beyond the ", buffer_bytes,
                "-byte data buffer (truncated file?)");
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    OCTET_CHECK(e.begin >= cursor, tensor_where(path, e.name), ": data_offsets ",
                offsets_str(e.begin, e.end), " overlap tensor '", prev ? prev->name : "", "' at ",
                prev ? offsets_str(prev->begin, prev->end) : "");
    OCTET_CHECK(e.begin == cursor, tensor_where(path, e.name), ": gap in the data buffer: bytes ",
                offsets_str(cursor, e.begin), " before this tensor belong to no tensor");
    cursor = e.end;
    prev = &e;
  }
  OCTET_CHECK(cursor == buffer_bytes, path, ": the last ", buffer_bytes - cursor,
              " bytes of the data buffer are not covered by any tensor");
}

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

Header parse_header(std::string_view text, const std::string& path, uint64_t buffer_bytes) {
  const ParsedJson j = parse_header_json(text, path);
  Header h;
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__")
      h.metadata = parse_metadata(value, path);
    else
      h.entries.push_back(parse_entry(key, value, path));
  }
  check_coverage(h.entries, buffer_bytes, path);
  return h;
}

// Reads up to `n` bytes into `dst` and returns how many it read: a file, or bytes in memory.
using ReadFn = std::function<uint64_t(void* dst, uint64_t n)>;

// Returns the header text and leaves `read` at the start of the data buffer.
std::string read_header_text(const ReadFn& read, uint64_t file_size, const std::string& path) {
  OCTET_CHECK(file_size >= 8, path, ": file is ", file_size,
              " bytes, too short for the 8-byte header length (not a safetensors file?)");
  unsigned char len_bytes[8];
  OCTET_CHECK(read(len_bytes, 8) == 8, path, ": cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  OCTET_CHECK(n <= kMaxHeaderBytes, path, ": header length ", n, " exceeds the limit of ",
              kMaxHeaderBytes, " bytes (not a safetensors file?)");
  OCTET_CHECK(n <= file_size - 8, path, ": header length ", n, " runs past the end of the ",
              file_size, "-byte file (truncated file?)");
  std::string text(n, '\0');
  OCTET_CHECK(read(text.data(), n) == n, path, ": cannot read the ", n, "-byte header");
  return text;
}

// The whole file, `file_size` bytes, from `read`.
SafetensorsFile read_from(const ReadFn& read, uint64_t file_size, const std::string& path) {
  const std::string text = read_header_text(read, file_size, path);
  Header h = parse_header(text, path, file_size - 8 - text.size());

  SafetensorsFile out;
  out.path = path;
  out.metadata = std::move(h.metadata);
  // The entries tile the buffer in offset order, so the data reads sequentially.
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    const uint64_t bytes = e.end - e.begin;
    OCTET_CHECK(!bytes || read(t.data(), bytes) == bytes, tensor_where(path, e.name),
                ": file ended while reading its data (truncated file?)");
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

uint64_t regular_file_size(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  OCTET_CHECK(fs::exists(st), path, ": cannot open: no such file");
  OCTET_CHECK(fs::is_regular_file(st), path, ": cannot open: not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  OCTET_CHECK(!ec, path, ": cannot read its size: ", ec.message());
  return size;
}

}  // namespace

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (DType d : kDTypes)
    if (dtype_name(d) == name) return d;
  return std::nullopt;
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& t) { return t.first == name; });
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  OCTET_THROW(path, ": no tensor named '", name, "'");
}

SafetensorsFile read_safetensors(const std::string& path) {
  const uint64_t file_size = regular_file_size(path);
  std::ifstream in(path, std::ios::binary);
  OCTET_CHECK(in.is_open(), path, ": cannot open: ", std::strerror(errno));
  const ReadFn read = [&in](void* dst, uint64_t n) -> uint64_t {
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    return static_cast<uint64_t>(in.gcount());
  };
  return read_from(read, file_size, path);
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name) {
  uint64_t pos = 0;
  const ReadFn read = [&](void* dst, uint64_t n) -> uint64_t {
    const uint64_t got = std::min<uint64_t>(n, bytes.size() - pos);
    if (got) std::memcpy(dst, bytes.data() + pos, got);
    pos += got;
    return got;
  };
  return read_from(read, bytes.size(), name);
}

namespace {

// Position of a dtype in huggingface/safetensors' layout order: its dtype enumeration, descending.
// Wider types come first, so in an 8-byte aligned buffer every tensor starts aligned to its element
// size.
int layout_rank(DType d) {
  switch (d) {
    case DType::kI64:
      return 0;
    case DType::kF32:
      return 1;
    case DType::kI32:
      return 2;
    case DType::kBF16:
      return 3;
    case DType::kF16:
      return 4;
    case DType::kU16:
      return 5;
    case DType::kE8M0:
      return 6;
    case DType::kE4M3:
      return 7;
    case DType::kE5M2:
      return 8;
    case DType::kU8:
      return 9;
  }
  return 10;
}

// Indices of `tensors` in the reference writer's order (dtype rank, then name), after checking that
// the set can be written.
std::vector<size_t> checked_write_order(const std::vector<TensorDecl>& tensors,
                                        const std::string& path) {
  std::vector<size_t> order(tensors.size());
  std::set<std::string> names;
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string& name = tensors[i].name;
    OCTET_CHECK(!name.empty(), path, ": cannot write a tensor with an empty name");
    OCTET_CHECK(name != "__metadata__", path,
                ": '__metadata__' is reserved and cannot name a tensor");
    OCTET_CHECK(names.insert(name).second, path, ": duplicate tensor name '", name, "'");
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int ra = layout_rank(tensors[a].dtype), rb = layout_rank(tensors[b].dtype);
    return ra != rb ? ra < rb : tensors[a].name < tensors[b].name;
  });
  return order;
}

std::string build_header(const std::vector<TensorDecl>& tensors, const std::vector<size_t>& order,
                         const std::map<std::string, std::string>& metadata,
                         const std::string& path) {
  // Keys are appended to ordered_json's underlying vector: its operator[] searches every key
  // before it (quadratic in the tensor count), and the keys are known to be unique.
  Json j = Json::object();
  auto& entries = j.get_ref<Json::object_t&>();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) m.get_ref<Json::object_t&>().emplace_back(k, v);
    entries.emplace_back("__metadata__", std::move(m));
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorDecl& t = tensors[i];
    const auto bytes = static_cast<uint64_t>(t.nbytes());
    Json e = Json::object();
    e["dtype"] = std::string(dtype_name(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + bytes};
    entries.emplace_back(t.name, std::move(e));
    offset += bytes;
  }
  std::string text;
  try {
    text = j.dump();
  } catch (const Json::exception& e) {
    OCTET_THROW(path, ": cannot encode the header (names and metadata must be UTF-8): ", e.what());
  }
  // Spaces keep the JSON valid and start the data buffer 8-byte aligned, as the reference writer
  // does.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

SafetensorsLayout safetensors_layout(const std::vector<TensorDecl>& tensors,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::string& path) {
  const std::vector<size_t> order = checked_write_order(tensors, path);
  const std::string header = build_header(tensors, order, metadata, path);
  SafetensorsLayout l;
  l.prefix.resize(8);
  for (int i = 0; i < 8; ++i)
    l.prefix[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  l.prefix += header;
  l.offset.assign(tensors.size(), 0);
  int64_t at = static_cast<int64_t>(l.prefix.size());
  for (size_t i : order) {
    l.offset[i] = at;
    at += tensors[i].nbytes();
  }
  l.file_bytes = at;
  return l;
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorDecl> decls;
  decls.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    OCTET_CHECK(t.device() == Device::kCpu, tensor_where(path, name), ": is on ",
                device_name(t.device()), "; copy it to the host before writing");
    OCTET_CHECK(t.data() != nullptr || t.numel() == 0, tensor_where(path, name), ": has no data");
    decls.push_back({name, t.dtype(), t.shape()});
  }
  const SafetensorsLayout l = safetensors_layout(decls, metadata, path);
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return l.offset[a] < l.offset[b]; });
  AtomicFile f(path);
  f.write(l.prefix);
  for (size_t i : order)
    f.write(tensors[i].second.data(), static_cast<size_t>(tensors[i].second.nbytes()));
  f.commit();
}

SafetensorsFile read_safetensors_ranges(const std::string& path, const ElementRanges& wanted) {
  const uint64_t file_size = regular_file_size(path);
  std::ifstream in(path, std::ios::binary);
  OCTET_CHECK(in.is_open(), path, ": cannot open: ", std::strerror(errno));
  const ReadFn read = [&in](void* dst, uint64_t n) -> uint64_t {
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    return static_cast<uint64_t>(in.gcount());
  };
  const std::string text = read_header_text(read, file_size, path);
  const uint64_t base = 8 + text.size();
  Header h = parse_header(text, path, file_size - base);
  SafetensorsFile out;
  out.path = path;
  out.metadata = std::move(h.metadata);
  auto read_at = [&](void* dst, uint64_t at, uint64_t n, const std::string& name) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(at));
    OCTET_CHECK(!n || read(dst, n) == n, tensor_where(path, name),
                ": file ended while reading its data (truncated file?)");
  };
  for (const Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    const auto it = wanted.find(e.name);
    if (it == wanted.end()) {
      read_at(t.data(), base + e.begin, e.end - e.begin, e.name);
    } else {
      const auto es = static_cast<uint64_t>(dtype_size(e.dtype));
      for (const auto& [lo, hi] : it->second) {
        OCTET_CHECK(lo >= 0 && lo <= hi && hi <= t.numel(), tensor_where(path, e.name),
                    ": elements [", lo, ", ", hi, ") asked for, but it has ", t.numel());
        read_at(static_cast<uint8_t*>(t.data()) + static_cast<uint64_t>(lo) * es,
                base + e.begin + static_cast<uint64_t>(lo) * es,
                static_cast<uint64_t>(hi - lo) * es, e.name);
      }
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace octet::io
