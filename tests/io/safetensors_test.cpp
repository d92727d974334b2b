// safetensors reader and writer: round trips of every dtype, the exact bytes of the reference
// writer, hand-built files, and one test per kind of malformed header or truncation (each error
// must say what is wrong), plus the atomic write.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

namespace octet::io {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("octet_safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file of the 8-byte length, `header` and `data` bytes.
  std::string write_raw(const std::string& header, const std::string& data,
                        const std::string& name = "raw") {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    return write_bytes(bytes + header + data, name);
  }
  std::string write_bytes(const std::string& bytes, const std::string& name = "raw") {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  std::string read_bytes(const std::string& p) const {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Files left in the directory (a failed write must leave no temporary behind).
  std::vector<std::string> listing() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir_)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }

  fs::path dir_;
};

Tensor random_bytes(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937_64 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data());
  for (int64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

void expect_same_tensor(const Tensor& a, const Tensor& b, const std::string& name) {
  EXPECT_EQ(a.dtype(), b.dtype()) << name;
  EXPECT_EQ(a.shape(), b.shape()) << name;
  ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
  if (a.nbytes())
    EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())), 0) << name;
}

// Expects read_safetensors to throw an error that names the file and contains every fragment.
void expect_read_error(const std::string& file, std::initializer_list<std::string> fragments) {
  try {
    read_safetensors(file);
    ADD_FAILURE() << "no error reading " << file;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << "message does not name the file: " << msg;
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

const std::string kEntry = R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

TEST_F(SafetensorsTest, RoundTripsEveryDtypeAndShape) {
  const DType dtypes[] = {DType::kF32,  DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2,
                          DType::kE8M0, DType::kI32,  DType::kI64, DType::kU8,   DType::kU16};
  const Shape shapes[] = {{}, {0}, {3}, {2, 0, 5}, {7, 13}, {1, 3, 129}};
  NamedTensors tensors;
  uint64_t seed = 1;
  for (DType d : dtypes)
    for (const Shape& s : shapes)
      tensors.emplace_back(std::string(dtype_name(d)) + shape_str(s), random_bytes(s, d, seed++));
  write_safetensors(path("all.safetensors"), tensors);
  const SafetensorsFile f = read_safetensors(path("all.safetensors"));
  ASSERT_EQ(f.tensors.size(), tensors.size());
  EXPECT_TRUE(f.metadata.empty());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(f.contains(name)) << name;
    expect_same_tensor(t, f.at(name), name);
  }
  // Data is laid out widest dtype first, then by name; every tensor starts aligned to its element.
  int64_t offset = 0;
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const auto& [name, t] = f.tensors[i];
    EXPECT_EQ(offset % dtype_size(t.dtype()), 0) << name;
    offset += t.nbytes();
    if (i == 0) continue;
    const Tensor& prev = f.tensors[i - 1].second;
    EXPECT_GE(dtype_size(prev.dtype()), dtype_size(t.dtype())) << name;
    if (prev.dtype() == t.dtype()) EXPECT_LT(f.tensors[i - 1].first, name);
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"all.safetensors"});
}

TEST_F(SafetensorsTest, MetadataRoundTrips) {
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"octet.granularity.w", "1x128"},
                                                   {"empty", ""},
                                                   {"quote \"and\" \\", "ünïcode\n"}};
  write_safetensors(path("m.safetensors"), {{"w", random_bytes({4, 4}, DType::kBF16, 7)}}, meta);
  const SafetensorsFile f = read_safetensors(path("m.safetensors"));
  EXPECT_EQ(f.metadata, meta);
  EXPECT_EQ(f.path, path("m.safetensors"));
}

// The bytes huggingface/safetensors 0.8.0 writes (safetensors.numpy.save with ml_dtypes arrays) for
// these tensors and metadata: metadata first, tensors by dtype (widest first) then name, compact
// JSON padded with spaces to a multiple of 8.
const std::string kReferenceHeader =
    R"({"__metadata__":{"k":"v"},"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
    R"("a":{"dtype":"F32","shape":[],"data_offsets":[8,12]},)"
    R"("z":{"dtype":"F32","shape":[0,2],"data_offsets":[12,12]},)"
    R"("h":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]},)"
    R"("c":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[16,19]},)"
    R"("b":{"dtype":"U8","shape":[2],"data_offsets":[19,21]}}  )";
const std::string kReferenceData = std::string(
    "\xf9\xff\xff\xff\xff\xff\xff\xff"  // i: -7
    "\x00\x00\x80\x3f"                  // a: 1.0f
    "\x00\x3f\x40\x40"                  // h: bf16 0.5, 3.0
    "\x38\xc0\x7e"                      // c: e4m3 1, -2, 448
    "\xab\xcd",                         // b
    21);

TEST_F(SafetensorsTest, WritesTheReferenceBytes) {
  auto tensor = [](const Shape& shape, DType dtype, const std::string& bytes) {
    Tensor t = Tensor::empty(shape, dtype);
    std::memcpy(t.data(), bytes.data(), bytes.size());
    return t;
  };
  const NamedTensors tensors = {
      {"b", tensor({2}, DType::kU8, "\xab\xcd")},
      {"a", tensor({}, DType::kF32, std::string("\x00\x00\x80\x3f", 4))},
      {"c", tensor({3}, DType::kE4M3, "\x38\xc0\x7e")},
      {"z", Tensor::empty({0, 2}, DType::kF32)},
      {"h", tensor({2}, DType::kBF16, std::string("\x00\x3f\x40\x40", 4))},
      {"i", tensor({1}, DType::kI64, "\xf9\xff\xff\xff\xff\xff\xff\xff")},
  };
  write_safetensors(path("x"), tensors, {{"k", "v"}});
  ASSERT_EQ(kReferenceHeader.size(), 360u);
  const std::string expected =
      std::string("\x68\x01\0\0\0\0\0\0", 8) + kReferenceHeader + kReferenceData;
  EXPECT_EQ(read_bytes(path("x")), expected);

  const SafetensorsFile f = read_safetensors(write_bytes(expected, "reference"));
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) expect_same_tensor(t, f.at(name), name);
  EXPECT_EQ(f.tensors.front().first, "i");
  EXPECT_EQ(f.at("h").data_as<uint16_t>()[1], 0x4040);  // bf16 3.0
}

TEST_F(SafetensorsTest, ReadsAHandBuiltFile) {
  // Unpadded header, tensors listed out of data order, int and float data, an empty tensor in
  // between.
  const std::string header = R"({"z":{"dtype":"I32","shape":[2],"data_offsets":[4,12]},)"
                             R"("e":{"dtype":"BF16","shape":[0,3],"data_offsets":[4,4]},)"
                             R"("__metadata__":{"source":"hand"},)"
                             R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  const std::string data = std::string("\x00\x00\x20\xC0", 4) +                 // -2.5f
                           std::string("\x07\x00\x00\x00\xFE\xFF\xFF\xFF", 8);  // 7, -2
  const SafetensorsFile f = read_safetensors(write_raw(header, data));
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].first, "s");  // file order is data order
  EXPECT_EQ(f.tensors[1].first, "e");
  EXPECT_EQ(f.tensors[2].first, "z");
  EXPECT_EQ(f.at("s").shape(), Shape{});
  EXPECT_EQ(f.at("s").data_as<float>()[0], -2.5f);
  EXPECT_EQ(f.at("e").shape(), (Shape{0, 3}));
  EXPECT_EQ(f.at("e").dtype(), DType::kBF16);
  EXPECT_EQ(f.at("z").dtype(), DType::kI32);
  EXPECT_EQ(f.at("z").data_as<int32_t>()[0], 7);
  EXPECT_EQ(f.at("z").data_as<int32_t>()[1], -2);
  EXPECT_EQ(f.metadata.at("source"), "hand");
  // Tensors get their own aligned buffers even though the data follows an unaligned header.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.at("z").data()) % 64, 0u);
}

TEST_F(SafetensorsTest, AtNamesTheMissingTensor) {
  write_safetensors(path("f"), {{"w", random_bytes({2}, DType::kF32, 3)}});
  const SafetensorsFile f = read_safetensors(path("f"));
  EXPECT_FALSE(f.contains("v"));
  try {
    f.at("v");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named 'v'"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, RejectsBadFiles) {
  expect_read_error(path("missing"), {"no such file"});
  expect_read_error(dir_.string(), {"not a regular file"});
  expect_read_error(write_bytes("abc"), {"3 bytes, too short"});
  expect_read_error(write_bytes(std::string("\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x7F", 8) + "{}"),
                    {"exceeds the limit"});
  expect_read_error(write_bytes(std::string("\x40\x00\x00\x00\x00\x00\x00\x00", 8) + "{}"),
                    {"header length 64 runs past the end", "truncated"});
}

TEST_F(SafetensorsTest, RejectsMalformedHeaders) {
  const std::string d8(8, '\x01');
  expect_read_error(write_raw("{\"a\":", d8), {"not valid JSON"});
  expect_read_error(write_raw("[1, 2]", d8), {"not a JSON object", "array"});
  expect_read_error(write_raw(R"({"a":[1]})", d8), {"tensor 'a'", "expected an object"});
  expect_read_error(write_raw(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8),
                    {"tensor 'a'", "missing field 'dtype'"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", d8),
                    {"missing field 'shape'"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","shape":[2]}})", d8),
                    {"missing field 'data_offsets'"});
  expect_read_error(
      write_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", d8),
      {"tensor 'a'", "unexpected field 'x'"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", d8),
                    {"tensor 'a'", "unsupported dtype 'F64'", "F8_E4M3"});
  expect_read_error(write_raw(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", d8),
                    {"dtype must be a string"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8),
                    {"shape must hold non-negative"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", d8),
                    {"shape must hold non-negative"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", d8),
                    {"shape must be an array"});
  const std::string huge = "4611686018427387903";  // 2^62 - 1: each allowed, the product is not
  expect_read_error(write_raw(R"({"a":{"dtype":"U8","shape":[)" + huge + "," + huge +
                                  R"(],"data_offsets":[0,8]}})",
                              d8),
                    {"needs more than 2^64"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", d8),
                    {"data_offsets must be two"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", d8),
                    {"data_offsets must be two"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", d8),
                    {"begin after end"});
  expect_read_error(write_raw(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
                    {"tensor 'a'", "span 8 bytes", "needs 12"});
  expect_read_error(write_raw(R"({"__metadata__":[1],"a":)" + kEntry + "}", d8),
                    {"__metadata__ must be an object"});
  expect_read_error(write_raw(R"({"__metadata__":{"k":1},"a":)" + kEntry + "}", d8),
                    {"__metadata__ value of 'k'"});
}

TEST_F(SafetensorsTest, RejectsDuplicates) {
  expect_read_error(write_raw(R"({"a":)" + kEntry + R"(,"a":)" + kEntry + "}", std::string(8, 'x')),
                    {"duplicate tensor name 'a'"});
  expect_read_error(
      write_raw(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                std::string(8, 'x')),
      {"duplicate key 'dtype'"});
}

TEST_F(SafetensorsTest, RejectsBadCoverageOfTheBuffer) {
  auto entry = [](int b, int e) {
    return R"({"dtype":"U8","shape":[)" + std::to_string(e - b) + R"(],"data_offsets":[)" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  const std::string d8(8, 'x');
  expect_read_error(write_raw(R"({"a":)" + entry(0, 6) + R"(,"b":)" + entry(4, 8) + "}", d8),
                    {"tensor 'b'", "overlap tensor 'a'"});
  expect_read_error(write_raw(R"({"a":)" + entry(0, 4) + R"(,"b":)" + entry(6, 8) + "}", d8),
                    {"tensor 'b'", "gap", "[4, 6]"});
  expect_read_error(write_raw(R"({"a":)" + entry(0, 8) + "}", d8 + "zz"),
                    {"last 2 bytes", "not covered"});
  expect_read_error(
      write_raw(
          R"({"a":)" + entry(0, 4) + R"(,"e":)" + entry(2, 2) + R"(,"b":)" + entry(4, 8) + "}", d8),
      {"tensor 'e'", "overlap tensor 'a'"});
  // Truncated data: the last tensor ends past the end of the file.
  expect_read_error(write_raw(R"({"a":)" + entry(0, 4) + R"(,"b":)" + entry(4, 8) + "}", "xxxxx"),
                    {"tensor 'b'", "beyond the 5-byte data buffer", "truncated"});
  // A file written correctly and then cut short.
  write_safetensors(path("good"), {{"w", random_bytes({64}, DType::kF32, 5)}});
  const std::string bytes = read_bytes(path("good"));
  expect_read_error(write_bytes(bytes.substr(0, bytes.size() - 1), "cut"),
                    {"tensor 'w'", "truncated"});
  expect_read_error(write_bytes(bytes.substr(0, 20), "cut2"), {"runs past the end"});
}

TEST_F(SafetensorsTest, RejectsBadWritesAndKeepsExistingFiles) {
  const std::string out = path("out");
  write_bytes("precious", "out");
  auto expect_write_error = [&](const NamedTensors& t, const std::string& fragment) {
    try {
      write_safetensors(out, t);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_EQ(read_bytes(out), "precious");
    EXPECT_EQ(listing(), std::vector<std::string>{"out"});
  };
  const Tensor t = random_bytes({3}, DType::kF32, 9);
  expect_write_error({{"a", t}, {"b", t}, {"a", t}}, "duplicate tensor name 'a'");
  expect_write_error({{"", t}}, "empty name");
  expect_write_error({{"__metadata__", t}}, "reserved");
  expect_write_error({{"nodata", Tensor::wrap(nullptr, {4}, DType::kF32, Device::kCpu)}},
                     "tensor 'nodata': has no data");
  expect_write_error({{"bad\xFF", t}}, "UTF-8");
  // The rename onto a directory fails after the temporary file was written: it must be removed.
  fs::create_directories(dir_ / "adir" / "child");
  EXPECT_THROW(write_safetensors(path("adir"), {{"a", t}}), Error);
  EXPECT_EQ(listing(), (std::vector<std::string>{"adir", "out"}));
  EXPECT_THROW(write_safetensors(path("no/such/dir/f"), {{"a", t}}), Error);
  // A successful write replaces the old file.
  write_safetensors(out, {{"a", t}});
  expect_same_tensor(t, read_safetensors(out).at("a"), "a");
  EXPECT_EQ(listing(), (std::vector<std::string>{"adir", "out"}));
}

// An empty tensor whose other dimensions multiply past 2^63 made Tensor's element count overflow
// (undefined behaviour, reported by UBSan in fuzz/fuzz_safetensors on the input kept as
// fuzz/corpus/safetensors/crash_empty_huge_dims). Such a shape is refused; large empty shapes that
// fit still read.
TEST_F(SafetensorsTest, RejectsEmptyShapesWhoseOtherDimensionsOverflow) {
  expect_read_error(
      write_raw(R"({"a":{"dtype":"U8","shape":[4611686018427387903,4611686018427387903,0],)"
                R"("data_offsets":[0,0]}})",
                ""),
      {"tensor 'a'", "shape [4611686018427387903, 4611686018427387903, 0] of U8 is too large"});
  expect_read_error(
      write_raw(R"({"a":{"dtype":"F32","shape":[0,3037000500,3037000500],"data_offsets":[0,0]}})",
                ""),
      {"tensor 'a'", "too large"});
  const SafetensorsFile f = read_safetensors(write_raw(
      R"({"a":{"dtype":"F32","shape":[0,1073741824,1073741824],"data_offsets":[0,0]}})", "", "ok"));
  EXPECT_EQ(f.at("a").shape(), (Shape{0, 1073741824, 1073741824}));
  EXPECT_EQ(f.at("a").numel(), 0);
}

// 80k tensors (issue 13: reading such a header took 15 s, quadratic in the tensor count): a file
// written by octet and a hand-built header whose keys come in the reverse of the data order both
// read back whole, every tensor with its name, dtype, shape and bytes.
TEST_F(SafetensorsTest, EightyThousandTensorsReadAndWrite) {
  constexpr int kCount = 80'000;
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kU8, DType::kI64};
  NamedTensors tensors;
  for (int i = 0; i < kCount; ++i) {
    // Names not in layout order, so the writer really sorts them.
    const std::string name = "model.layers." + std::to_string((i * 7919) % kCount) + ".w";
    tensors.emplace_back(name, random_bytes({1 + i % 3}, dtypes[i % 4], static_cast<uint64_t>(i)));
  }
  // Linear time: about 0.3 s to write and 0.5 s to read here; the quadratic reader took 47 s and
  // the writer 25 s. The bound leaves room for a slow or busy machine.
  const auto t0 = std::chrono::steady_clock::now();
  write_safetensors(path("many"), tensors, {{"format", "pt"}});
  const auto t1 = std::chrono::steady_clock::now();
  const SafetensorsFile f = read_safetensors(path("many"));
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_LT(t1 - t0, std::chrono::seconds(10)) << "writing 80k tensors is not linear";
  EXPECT_LT(t2 - t1, std::chrono::seconds(10)) << "reading 80k tensors is not linear";
  ASSERT_EQ(f.tensors.size(), tensors.size());
  EXPECT_EQ(f.metadata.at("format"), "pt");
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : f.tensors) by_name[name] = &t;
  ASSERT_EQ(by_name.size(), tensors.size());
  for (const auto& [name, t] : tensors) expect_same_tensor(t, *by_name.at(name), name);
  // The reference layout: widest dtype first (I64, F32, BF16, U8), then by name.
  EXPECT_EQ(f.tensors.front().second.dtype(), DType::kI64);
  EXPECT_EQ(f.tensors.back().second.dtype(), DType::kU8);
  EXPECT_LT(f.tensors[0].first, f.tensors[1].first);

  // Hand-built: tensor i holds the 4 bytes of i, listed from the last to the first.
  std::string header = "{", data;
  for (int i = kCount - 1; i >= 0; --i) {
    header += (i == kCount - 1 ? "" : ",") + std::string("\"t") + std::to_string(i) +
              R"(":{"dtype":"I32","shape":[1],"data_offsets":[)" + std::to_string(4 * i) + "," +
              std::to_string(4 * i + 4) + "]}";
  }
  header += "}";
  for (int i = 0; i < kCount; ++i) data.append(reinterpret_cast<const char*>(&i), 4);
  const SafetensorsFile g = read_safetensors(write_raw(header, data));
  ASSERT_EQ(g.tensors.size(), static_cast<size_t>(kCount));
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(g.tensors[i].first, "t" + std::to_string(i));  // in data order
    ASSERT_EQ(g.tensors[i].second.data_as<int32_t>()[0], i);
  }
}

// parse_safetensors (what the fuzz harness calls) reads bytes in memory exactly as
// read_safetensors reads the file, and its errors name the name it is given.
TEST_F(SafetensorsTest, ParsesFromMemoryAsFromAFile) {
  const NamedTensors tensors = {{"a", random_bytes({3, 5}, DType::kBF16, 1)},
                                {"b", random_bytes({}, DType::kF32, 2)},
                                {"c", random_bytes({0, 4}, DType::kE4M3, 3)}};
  write_safetensors(path("f"), tensors, {{"k", "v"}});
  const std::string bytes = read_bytes(path("f"));
  const SafetensorsFile f = parse_safetensors(bytes, "in memory");
  EXPECT_EQ(f.path, "in memory");
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  ASSERT_EQ(f.tensors.size(), 3u);
  for (const auto& [name, t] : tensors) expect_same_tensor(t, f.at(name), name);
  for (const std::string& bad : {bytes.substr(0, bytes.size() - 1), bytes + "x", bytes.substr(0, 5),
                                 std::string("\x03\0\0\0\0\0\0\0{}", 10)}) {
    std::string from_file, from_memory;
    try {
      read_safetensors(write_bytes(bad, "bad"));
    } catch (const Error& e) {
      from_file = e.what();
    }
    try {
      parse_safetensors(bad, path("bad"));
    } catch (const Error& e) {
      from_memory = e.what();
    }
    EXPECT_FALSE(from_file.empty());
    EXPECT_EQ(from_memory, from_file);
  }
}

TEST(SafetensorsDtypes, NamesMapBothWays) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2, DType::kE8M0,
                  DType::kI32, DType::kI64, DType::kU8, DType::kU16})
    EXPECT_EQ(dtype_from_safetensors_name(dtype_name(d)), d) << dtype_name(d);
  EXPECT_FALSE(dtype_from_safetensors_name("F64"));
  EXPECT_FALSE(dtype_from_safetensors_name("f32"));
}

}  // namespace
}  // namespace octet::io
