// The octet binary end to end: quantize / dequantize round trips on odd shapes (file layout,
// bitwise agreement with the library ops, error bounds), DeepSeek-V3-style files without metadata,
// one-line errors that leave no output behind, and quant-report's table.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "backend/backend.h"
#include "cli_fixture.h"
#include "io/safetensors.h"
#include "ops/quantize/quantize.h"
#include "test_util.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

using RunResult = test::CliResult;
using test::slurp;

class CliTest : public test::CliFixture {
 protected:
  RunResult run(const std::string& args) const { return run_octet(args); }

  // Expects exit code 1, one line on stderr "octet <cmd>: error: ...<fragment>...", and no `out`
  // file.
  void expect_failure(const std::string& cmd, const std::string& args, const std::string& fragment,
                      const std::string& out = "") const {
    const RunResult r = run(cmd + " " + args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("octet " + cmd + ": error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos)
        << "missing '" << fragment << "' in: " << r.err;
    if (!out.empty()) EXPECT_FALSE(fs::exists(out)) << out;
    for (const auto& e : fs::directory_iterator(dir_))
      EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
  }
};

// Scale layout, written out independently of the library: [] for one per-tensor scale.
Shape expected_scale_shape(Granularity g, int64_t rows, int64_t cols) {
  auto cdiv = [](int64_t a) { return (a + 127) / 128; };
  switch (g) {
    case Granularity::kTensor:
      return {};
    case Granularity::kRow:
      return {rows, 1};
    case Granularity::k1x128:
      return {rows, cdiv(cols)};
    case Granularity::k128x1:
      return {cdiv(rows), cols};
    case Granularity::k128x128:
      return {cdiv(rows), cdiv(cols)};
  }
  return {};
}

int64_t scale_index(Granularity g, int64_t i, int64_t j, int64_t rows, int64_t cols) {
  switch (g) {
    case Granularity::kTensor:
      return 0;
    case Granularity::kRow:
      return i;
    case Granularity::k1x128:
      return i * ((cols + 127) / 128) + j / 128;
    case Granularity::k128x1:
      return (i / 128) * cols + j;
    case Granularity::k128x128:
      return (i / 128) * ((cols + 127) / 128) + j / 128;
  }
  (void)rows;
  return 0;
}

float value_at(const Tensor& t, int64_t k) {
  return t.dtype() == DType::kF32 ? t.data_as<float>()[k] : bf16_to_float(t.data_as<uint16_t>()[k]);
}

struct Case {
  std::string granularity_flag;
  Granularity granularity;
  Fp8Format format;
  bool pow2;
};

// The input every round trip uses: odd shapes in both float dtypes, a 0-d and an empty tensor, and
// an integer tensor that must pass through untouched.
io::NamedTensors round_trip_input() {
  Tensor scalar = Tensor::empty({}, DType::kF32);
  scalar.data_as<float>()[0] = -3.7f;
  Tensor ids = Tensor::empty({5}, DType::kI64);
  for (int64_t i = 0; i < 5; ++i) ids.data_as<int64_t>()[i] = (i - 2) * 1000003;
  return {{"act", test::random_tensor({3, 129, 257}, DType::kF32, 11, test::Dist::kOutliers)},
          {"w", test::random_tensor({1481, 7}, DType::kBF16, 12)},
          {"scalar", scalar},
          {"empty", Tensor::empty({0, 5}, DType::kF32)},
          {"ids", ids}};
}

// Checks one quantized tensor of the file against the library's CPU quantize of the same input.
void check_quantized(const io::SafetensorsFile& f, const std::string& name, const Tensor& x,
                     const Case& c, bool columnwise) {
  SCOPED_TRACE(name);
  const int64_t rows = x.rows(), cols = x.cols();
  const DType dt = c.format == Fp8Format::kE4M3 ? DType::kE4M3 : DType::kE5M2;
  const Tensor& data = f.at(name);
  const Tensor& sinv = f.at(name + "_scale_inv");
  EXPECT_EQ(data.dtype(), dt);
  EXPECT_EQ(data.shape(), x.shape());
  EXPECT_EQ(sinv.dtype(), DType::kF32);
  EXPECT_EQ(sinv.shape(), expected_scale_shape(c.granularity, rows, cols));
  EXPECT_EQ(f.metadata.at("octet.granularity." + name), c.granularity_flag);
  EXPECT_EQ(f.contains(name + "_columnwise"), columnwise);
  if (x.numel() == 0) return;
  Context ctx = make_context(Device::kCpu);
  QuantizeArgs args;
  args.input = x;
  args.format = c.format;
  args.granularity = c.granularity;
  args.rounding = c.pow2 ? ScaleRounding::kPow2 : ScaleRounding::kExact;
  args.output = columnwise ? QuantizeOutput::kBoth : QuantizeOutput::kRowwise;
  const QuantTensor q = quantize(ctx, args);
  EXPECT_TRUE(test::bitwise_equal(q.data.reshape(x.shape()), data));
  EXPECT_TRUE(test::bitwise_equal(q.scale_inv.reshape(sinv.shape()), sinv));
  if (!columnwise) return;
  const Tensor& cdata = f.at(name + "_columnwise");
  const Tensor& csinv = f.at(name + "_columnwise_scale_inv");
  EXPECT_EQ(cdata.shape(), (Shape{cols, rows}));
  EXPECT_EQ(csinv.shape(), expected_scale_shape(c.granularity, cols, rows));
  EXPECT_TRUE(test::bitwise_equal(q.columnwise_data, cdata));
  EXPECT_TRUE(test::bitwise_equal(q.columnwise_scale_inv.reshape(csinv.shape()), csinv));
}

// |x - deq| within half an FP8 ulp of x (2^-4 relative for E4M3, 2^-3 for E5M2) or, below the
// normal range, half the smallest subnormal times the group's scale_inv; slack for the FP32
// products.
void check_dequantized(const Tensor& x, const Tensor& deq, const Tensor& sinv, const Case& c) {
  ASSERT_EQ(deq.dtype(), DType::kF32);
  ASSERT_EQ(deq.shape(), x.shape());
  const int64_t rows = x.rows(), cols = x.cols();
  const double rel = c.format == Fp8Format::kE4M3 ? 0x1p-4 : 0x1p-3;
  const double abs_units = c.format == Fp8Format::kE4M3 ? 0x1p-10 : 0x1p-17;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double v = value_at(x, i * cols + j), d = deq.data_as<float>()[i * cols + j];
      const double s = sinv.data_as<float>()[scale_index(c.granularity, i, j, rows, cols)];
      const double bound = (rel * std::fabs(v) + abs_units * s) * (1 + 1e-6);
      ASSERT_LE(std::fabs(v - d), bound)
          << "at (" << i << ", " << j << "): x " << v << ", deq " << d;
    }
  }
}

TEST_F(CliTest, QuantizeDequantizeRoundTrip) {
  const io::NamedTensors input = round_trip_input();
  io::write_safetensors(path("in.safetensors"), input, {{"origin", "test"}});
  const std::vector<Case> cases = {
      {"tensor", Granularity::kTensor, Fp8Format::kE4M3, false},
      {"row", Granularity::kRow, Fp8Format::kE4M3, false},
      {"1x128", Granularity::k1x128, Fp8Format::kE4M3, false},
      {"1x128", Granularity::k1x128, Fp8Format::kE4M3, true},
      {"128x1", Granularity::k128x1, Fp8Format::kE4M3, false},
      {"128x128", Granularity::k128x128, Fp8Format::kE4M3, true},
      {"128x128", Granularity::k128x128, Fp8Format::kE5M2, false},
      {"tensor", Granularity::kTensor, Fp8Format::kE5M2, true},
  };
  for (const Case& c : cases) {
    const std::string fmt = c.format == Fp8Format::kE4M3 ? "e4m3" : "e5m2";
    SCOPED_TRACE(c.granularity_flag + " " + fmt + (c.pow2 ? " pow2" : ""));
    const RunResult q = run("quantize " + path("in.safetensors") + " " + path("q.safetensors") +
                            " --format " + fmt + " --granularity " + c.granularity_flag +
                            (c.pow2 ? " --pow2-scales" : "") + " --force");
    ASSERT_EQ(q.code, 0) << q.err;
    EXPECT_NE(q.out.find("quantized 4 tensors"), std::string::npos) << q.out;
    const io::SafetensorsFile qf = io::read_safetensors(path("q.safetensors"));
    EXPECT_EQ(qf.tensors.size(), 4u * 2 + 1);
    EXPECT_EQ(qf.metadata.at("octet.format"), fmt);
    EXPECT_EQ(qf.metadata.at("octet.pow2_scales"), c.pow2 ? "true" : "false");
    EXPECT_EQ(qf.metadata.at("origin"), "test");
    for (const auto& [name, x] : input) {
      if (name == "ids")
        EXPECT_TRUE(test::bitwise_equal(x, qf.at("ids")));
      else
        check_quantized(qf, name, x, c, false);
    }

    const RunResult d =
        run("dequantize --force " + path("q.safetensors") + " " + path("d.safetensors"));
    ASSERT_EQ(d.code, 0) << d.err;
    const io::SafetensorsFile df = io::read_safetensors(path("d.safetensors"));
    EXPECT_EQ(df.tensors.size(), input.size());
    EXPECT_EQ(df.metadata, (std::map<std::string, std::string>{{"origin", "test"}}));
    for (const auto& [name, x] : input) {
      SCOPED_TRACE(name);
      if (name == "ids")
        EXPECT_TRUE(test::bitwise_equal(x, df.at("ids")));
      else
        check_dequantized(x, df.at(name), qf.at(name + "_scale_inv"), c);
    }
  }
}

TEST_F(CliTest, ColumnwiseCopiesAreWrittenAndDropped) {
  const io::NamedTensors input = round_trip_input();
  io::write_safetensors(path("in.safetensors"), input);
  for (const Case& c : {Case{"1x128", Granularity::k1x128, Fp8Format::kE4M3, true},
                        Case{"tensor", Granularity::kTensor, Fp8Format::kE4M3, false},
                        Case{"128x128", Granularity::k128x128, Fp8Format::kE4M3, false}}) {
    SCOPED_TRACE(c.granularity_flag);
    const RunResult q = run("quantize --columnwise --granularity=" + c.granularity_flag +
                            (c.pow2 ? " --pow2-scales " : " ") + path("in.safetensors") + " " +
                            path("q") + " --force");
    ASSERT_EQ(q.code, 0) << q.err;
    const io::SafetensorsFile qf = io::read_safetensors(path("q"));
    EXPECT_EQ(qf.tensors.size(), 4u * 4 + 1);
    for (const auto& [name, x] : input)
      if (name != "ids") check_quantized(qf, name, x, c, true);
    EXPECT_EQ(qf.at("empty_columnwise").shape(), (Shape{5, 0}));

    const RunResult d = run("dequantize --force --dtype bf16 " + path("q") + " " + path("d"));
    ASSERT_EQ(d.code, 0) << d.err;
    EXPECT_NE(d.out.find("dropped 4 column-wise copies"), std::string::npos) << d.out;
    const io::SafetensorsFile df = io::read_safetensors(path("d"));
    std::set<std::string> names;
    for (const auto& [name, t] : df.tensors) {
      names.insert(name);
      if (name != "ids") EXPECT_EQ(t.dtype(), DType::kBF16) << name;
    }
    EXPECT_EQ(names, (std::set<std::string>{"act", "w", "scalar", "empty", "ids"}));
  }
}

// DeepSeek-V3's released checkpoints: `weight` F8_E4M3 with 128x128 `weight_scale_inv`, no
// metadata.
TEST_F(CliTest, DequantizesFilesWithoutMetadataByScaleShape) {
  Context ctx = make_context(Device::kCpu);
  io::NamedTensors tensors;
  std::vector<std::pair<std::string, QuantTensor>> refs;
  const std::pair<const char*, Granularity> layouts[] = {
      {"model.layers.0.mlp.weight", Granularity::k128x128},
      {"act", Granularity::k1x128},
      {"rows", Granularity::kRow}};
  for (const auto& [name, g] : layouts) {
    QuantizeArgs args;
    args.input = test::random_tensor({300, 200}, DType::kBF16, 21);
    args.granularity = g;
    QuantTensor q = quantize(ctx, args);
    tensors.emplace_back(name, q.data);
    tensors.emplace_back(std::string(name) + "_scale_inv", q.scale_inv);
    refs.emplace_back(name, q);
  }
  tensors.emplace_back("norm.weight", test::random_tensor({200}, DType::kBF16, 22));
  io::write_safetensors(path("ds.safetensors"), tensors);

  const RunResult d = run("dequantize " + path("ds.safetensors") + " " + path("out.safetensors"));
  ASSERT_EQ(d.code, 0) << d.err;
  const io::SafetensorsFile f = io::read_safetensors(path("out.safetensors"));
  EXPECT_EQ(f.tensors.size(), 4u);
  for (const auto& [name, q] : refs)
    EXPECT_TRUE(test::bitwise_equal(dequantize(ctx, q, DType::kF32), f.at(name))) << name;
  EXPECT_EQ(f.at("norm.weight").dtype(), DType::kBF16);
}

TEST_F(CliTest, ErrorsAreOneLineAndLeaveNoOutput) {
  const std::string in = path("in.safetensors"), out = path("out.safetensors");
  io::write_safetensors(in, {{"x", test::random_tensor({4, 130}, DType::kF32, 31)}});
  std::ofstream(path("garbage")) << "hello, world: not a safetensors file";
  // An F64 tensor: a valid safetensors dtype that octet does not support.
  const std::string f64_header = R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  std::string f64(8, '\0');
  f64[0] = static_cast<char>(f64_header.size());
  std::ofstream(path("f64"), std::ios::binary) << f64 << f64_header << std::string(8, '\0');

  expect_failure("quantize", path("garbage") + " " + out, path("garbage"), out);
  expect_failure("quantize", path("f64") + " " + out, "unsupported dtype 'F64'", out);
  expect_failure("quantize", path("nope") + " " + out, "no such file", out);
  expect_failure("quantize", in + " " + out + " --format e3m4", "bad value 'e3m4' for --format",
                 out);
  expect_failure("quantize", in + " " + out + " --granularity 64x64", "--granularity", out);
  expect_failure("quantize", in + " " + out + " --frobnicate", "unknown flag --frobnicate", out);
  expect_failure("quantize", in, "expected 2 arguments", out);
  expect_failure("quantize", in + " " + path("no/such/dir/out"), "cannot create");
  expect_failure("dequantize", path("garbage") + " " + out, path("garbage"), out);
  expect_failure("dequantize", in + " " + out + " --dtype f16", "bad value 'f16' for --dtype", out);
  expect_failure("quant-report", path("f64"), "unsupported dtype 'F64'");
  expect_failure("quant-report", "", "missing IN");
  expect_failure("quant-report", in + " --demo", "not both");

  // A scale whose shape fits no granularity.
  io::write_safetensors(path("badscale"), {{"w", Tensor::empty({4, 300}, DType::kE4M3)},
                                           {"w_scale_inv", Tensor::empty({7}, DType::kF32)}});
  expect_failure("dequantize", path("badscale") + " " + out,
                 "tensor 'w_scale_inv': shape [7] fits no granularity", out);
  // Output names that would collide.
  io::write_safetensors(path("collide"), {{"x", test::random_tensor({4, 4}, DType::kF32, 32)},
                                          {"x_scale_inv", Tensor::empty({2}, DType::kI32)}});
  expect_failure("quantize", path("collide") + " " + out,
                 "two output tensors would be named 'x_scale_inv'", out);

  // An existing OUT is replaced only with --force, and a failing command leaves it untouched.
  std::ofstream(out) << "precious";
  for (const std::string cmd : {"quantize", "dequantize"}) {
    expect_failure(cmd, in + " " + out, "already exists; pass --force");
    EXPECT_EQ(slurp(out), "precious");
  }
  expect_failure("quantize", path("garbage") + " " + out + " --force", "not a safetensors file");
  EXPECT_EQ(slurp(out), "precious");
}

TEST_F(CliTest, HelpDescribesArgumentsAndDefaults) {
  for (const std::string cmd : {"quantize", "dequantize", "quant-report"}) {
    const RunResult r = run(cmd + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("usage: octet " + cmd), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("default"), std::string::npos) << r.out;
  }
  EXPECT_NE(run("quantize --help").out.find("copied through unchanged"), std::string::npos);
}

// Splits quant-report's table rows (columns are separated by two or more spaces).
std::map<std::string, std::vector<std::string>> report_rows(const std::string& out) {
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream lines(out);
  const std::regex sep(" {2,}");
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> cols(std::sregex_token_iterator(line.begin(), line.end(), sep, -1),
                                  {});
    if (cols.size() == 8) rows[cols[0] + " | " + cols[3]] = cols;
  }
  return rows;
}

const char* const kRecipes[] = {"tensor e4m3",     "tensor e5m2",  "row e4m3",         "1x128 e4m3",
                                "1x128 e4m3 pow2", "128x128 e4m3", "128x128 e4m3 pow2"};

TEST_F(CliTest, QuantReportTabulatesEveryTensorAndRecipe) {
  // "flush": 448 then 255 values 2^-12. One scale for the row (scale 1) flushes them; a 1x128 group
  // of its own scales the second half up exactly; E5M2's scale 128 keeps all of them.
  Tensor flush = Tensor::empty({1, 256}, DType::kF32);
  for (int j = 0; j < 256; ++j) flush.data_as<float>()[j] = j == 0 ? 448.0f : 0x1p-12f;
  // "clip": inf sets the per-tensor scale to 1, so 1000 is clipped to 448 (and inf is left out).
  Tensor clip = Tensor::empty({2}, DType::kF32);
  clip.data_as<float>()[0] = INFINITY;
  clip.data_as<float>()[1] = 1000.0f;
  io::write_safetensors(path("in"),
                        {{"flush", flush},
                         {"clip", clip},
                         {"w", test::random_tensor({129, 300}, DType::kBF16, 41)},
                         {"ids", Tensor::empty({3}, DType::kI32)},
                         {"q", Tensor::empty({2, 2}, DType::kE4M3)},
                         {"q_scale_inv", test::random_tensor({1, 1}, DType::kF32, 42)}});
  const RunResult r = run("quant-report " + path("in"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = report_rows(r.out);
  EXPECT_EQ(rows.size(), 1u + 3 * 7) << r.out;
  EXPECT_TRUE(rows.count("tensor | recipe")) << r.out;
  for (const char* name : {"flush", "clip", "w"})
    for (const char* recipe : kRecipes)
      EXPECT_TRUE(rows.count(std::string(name) + " | " + recipe)) << name << recipe;
  for (const char* name : {"ids", "q_scale_inv"})
    EXPECT_EQ(r.out.find(name), std::string::npos) << name << ": " << r.out;
  EXPECT_NE(r.out.find("3 tensor(s) skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'clip': 1 non-finite"), std::string::npos) << r.out;

  EXPECT_EQ(rows.at("flush | tensor e4m3")[5], "99.6094%");
  EXPECT_EQ(rows.at("flush | row e4m3")[5], "99.6094%");
  EXPECT_EQ(rows.at("flush | 1x128 e4m3")[5], "49.6094%");
  EXPECT_EQ(rows.at("flush | tensor e5m2")[4], "inf");
  EXPECT_EQ(rows.at("flush | tensor e5m2")[5], "0.0000%");
  EXPECT_EQ(rows.at("flush | tensor e4m3")[7], "1.00e+00");
  EXPECT_EQ(rows.at("clip | tensor e4m3")[6], "100.0000%");
  EXPECT_EQ(rows.at("w | 1x128 e4m3")[6], "0.0000%");
  EXPECT_EQ(rows.at("w | tensor e4m3")[2], "BF16");
  EXPECT_EQ(rows.at("w | tensor e4m3")[1], "[129, 300]");
}

TEST_F(CliTest, QuantReportDemoShowsFineGrainedScalingWins) {
  const RunResult r = run("quant-report --demo");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = report_rows(r.out);
  for (const char* recipe : kRecipes)
    ASSERT_TRUE(rows.count(std::string("demo.activation | ") + recipe)) << r.out;
  auto snr = [&](const char* recipe) {
    return std::stod(rows.at(std::string("demo.activation | ") + recipe)[4]);
  };
  EXPECT_GT(snr("1x128 e4m3"), snr("tensor e4m3") + 3.0) << r.out;
  EXPECT_GT(snr("1x128 e4m3"), snr("128x128 e4m3")) << r.out;
}

// A tensor name is data from the file: quant-report prints its control characters (ESC, BEL, CR, a
// C1 CSI) and invalid UTF-8 as \xNN escapes, never raw (issue 13), and keeps printable UTF-8.
TEST_F(CliTest, QuantReportEscapesTerminalControlsInNames) {
  const std::string hostile =
      "x\x1b[2J\x1b]0;pwned\x07\r\xc2\x9b"
      "31m\\";
  Tensor t = test::random_tensor({4, 8}, DType::kF32, 7);
  Tensor u = test::random_tensor({4, 8}, DType::kF32, 8);
  u.data_as<float>()[0] = INFINITY;  // so the name also appears in a note
  io::write_safetensors(path("in"), {{hostile, u}, {"caf\xc3\xa9", t}});
  const RunResult r = run("quant-report " + path("in"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char c : r.out)
    EXPECT_FALSE((c >= 0 && c < 0x20 && c != '\n') || c == 0x7F)
        << "control byte " << int(c) << " in the output";
  EXPECT_EQ(r.out.find("\xc2\x9b"), std::string::npos) << "a raw C1 CSI in the output";
  const std::string shown = "x\\x1b[2J\\x1b]0;pwned\\x07\\x0d\\xc2\\x9b31m\\\\";
  const auto rows = report_rows(r.out);
  EXPECT_TRUE(rows.count(shown + " | tensor e4m3")) << r.out;
  EXPECT_TRUE(rows.count("caf\xc3\xa9 | tensor e4m3")) << r.out;
  EXPECT_NE(r.out.find("note: '" + shown + "': 1 non-finite"), std::string::npos) << r.out;
}

// The error line quotes the name too, and escapes it the same way.
TEST_F(CliTest, ErrorsEscapeTerminalControlsInNames) {
  const std::string header =
      R"({"\u001b[2Jx\u0007":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(header.size());
  std::ofstream(path("esc"), std::ios::binary) << len << header << std::string(8, '\0');
  expect_failure("quant-report", path("esc"), "tensor '\\x1b[2Jx\\x07': unsupported dtype 'F64'");
  EXPECT_EQ(run("quant-report " + path("esc")).err.find('\x1b'), std::string::npos);
}

// A command never writes its output over its own input (issue 13): `quantize x x`, `dequantize x x`
// and `gemm x x` are refused, also through another spelling of the path or a symbolic link, and the
// input stays byte for byte as it was.
TEST_F(CliTest, OutputOverInputIsRefusedAndTheInputKept) {
  const io::NamedTensors input = round_trip_input();
  io::write_safetensors(path("in.safetensors"), input, {{"origin", "test"}});
  std::filesystem::create_symlink(path("in.safetensors"), path("link.safetensors"));
  const std::string before = test::slurp(path("in.safetensors"));
  const std::string dotted = (dir_ / "." / "in.safetensors").string();
  for (const std::string& out : {path("in.safetensors"), dotted, path("link.safetensors")}) {
    for (const std::string& cmd :
         {std::string("quantize"), std::string("dequantize"), std::string("gemm")}) {
      const std::string extra = cmd == "gemm" ? " --recipe bf16" : "";
      const RunResult r = run(cmd + " " + path("in.safetensors") + " " + out + extra);
      EXPECT_EQ(r.code, 1) << cmd << " " << out << "\n" << r.err;
      EXPECT_NE(r.err.find("is the input file"), std::string::npos) << cmd << ": " << r.err;
      EXPECT_EQ(test::slurp(path("in.safetensors")), before) << cmd << " changed its input";
    }
  }
}

// Every command that writes a file refuses to replace an existing OUT without --force and leaves
// it byte for byte; with --force it is replaced (issue 13). `init` and `train` have their own
// tests (InitCli, TrainSafetyCli); `compare --out` with --force needs matplotlib (CompareCliTest).
TEST_F(CliTest, EveryWritingCommandRefusesAnExistingOutWithoutForce) {
  const std::string in = path("in.safetensors"), q = path("q.safetensors"),
                    out = path("out.safetensors");
  io::write_safetensors(in, {{"a", test::random_tensor({4, 32}, DType::kF32, 41)},
                             {"b", test::random_tensor({3, 32}, DType::kF32, 42)}});
  ASSERT_EQ(run("quantize " + in + " " + q).code, 0);
  const struct {
    std::string cmd, args;
  } cases[] = {{"quantize", in + " " + out},
               {"dequantize", q + " " + out},
               {"gemm", in + " " + out + " --recipe bf16"},
               {"gemm", in + " " + out + " --recipe blockwise --out-dtype f32"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.cmd + " " + c.args);
    std::ofstream(out) << "precious";
    expect_failure(c.cmd, c.args, "output " + out + " already exists; pass --force");
    EXPECT_EQ(slurp(out), "precious");
    const RunResult r = run(c.cmd + " " + c.args + " --force");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_FALSE(io::read_safetensors(out).tensors.empty());
  }
  // A link in OUT's place is refused too (it exists), and what it points to is kept.
  fs::remove(out);
  std::ofstream(path("target")) << "precious";
  fs::create_symlink(path("target"), out);
  expect_failure("quantize", in + " " + out, "already exists; pass --force");
  EXPECT_EQ(slurp(path("target")), "precious");
  // compare --out: refused before the runs are read or anything is plotted.
  fs::create_directories(path("run"));
  std::ofstream(path("plot.png")) << "precious";
  expect_failure("compare", path("run") + " --out " + path("plot.png"),
                 "output " + path("plot.png") + " already exists; pass --force");
  EXPECT_EQ(slurp(path("plot.png")), "precious");
}

}  // namespace
}  // namespace octet
