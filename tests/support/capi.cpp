// A C ABI over octet's public conversions, for the Python tests that compare octet with independent
// implementations (tests/numerics/fp8_exhaustive.py loads this library through ctypes).
//
// The FP8 conversions go through the real ops (quantize / dequantize with a per-tensor scale of 1,
// so q = cvt_rn_satfinite(x * 1) = cvt_rn_satfinite(x) and x = q * 1), which makes the test cover
// what the kernels actually do on each device rather than a helper that nothing else calls.
//
// Every function returns 0 on success, 77 when a GPU was asked for and none is visible (ctest's
// skip code in tests/CMakeLists.txt), and 1 on any other error, whose message goes to stderr.
// Arguments: device 0 = cpu, 1 = cuda; format 0 = e4m3, 1 = e5m2; n = element count (int64_t).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>

#include "backend/backend.h"
#include "core/context.h"
#include "numerics/fp8.h"
#include "ops/quantize/quantize.h"

namespace {

using namespace octet;

constexpr int kOk = 0;
constexpr int kError = 1;
constexpr int kSkipNoGpu = 77;

bool gpu_visible() {
  return cuda_built() && cuda_device_count() > 0;
}

// One context per device for the life of the process: a CUDA context costs far more than a call,
// and the Python test calls in a loop. A static is acceptable here because this is test support,
// not the library (which never keeps globals). The mutex makes first use safe if a caller uses
// threads.
Context& context(Device d) {
  static std::mutex mu;
  static Context* contexts[2] = {nullptr, nullptr};
  const std::lock_guard<std::mutex> lock(mu);
  Context*& c = contexts[d == Device::kCuda ? 1 : 0];
  if (!c) c = new Context(make_context(d));  // never freed: a CUDA teardown at exit gains nothing
  return *c;
}

// Runs `body(ctx)` with the device's context, translating exceptions into return codes.
template <typename Body>
int guarded(const char* fn, int device, Body&& body) {
  try {
    if (device != 0 && device != 1) {
      std::fprintf(stderr, "%s: device must be 0 (cpu) or 1 (cuda), got %d\n", fn, device);
      return kError;
    }
    if (device == 1 && !gpu_visible()) return kSkipNoGpu;
    body(context(device == 1 ? Device::kCuda : Device::kCpu));
    return kOk;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s (%s:%d)\n", fn, e.what(), e.file(), e.line());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", fn, e.what());
  }
  return kError;
}

Fp8Format to_format(int format) {
  OCTET_CHECK(format == 0 || format == 1, "format must be 0 (e4m3) or 1 (e5m2), got ", format);
  return format == 0 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
}

// A per-tensor conversion does not depend on the shape; a 2-D shape with rows of 1024 looks like
// the activations the kernels are written for, where n allows it.
Shape matrix_shape(int64_t n) {
  OCTET_CHECK(n >= 0, "n must be >= 0, got ", n);
  constexpr int64_t kCols = 1024;
  if (n >= kCols && n % kCols == 0) return {n / kCols, kCols};
  return {1, n};
}

Tensor host_scalar(float v) {
  Tensor t = Tensor::empty({1}, DType::kF32);
  t.data_as<float>()[0] = v;
  return t;
}

// Host memory owned by the caller, viewed as a tensor, then moved to the context's device.
Tensor input_on_device(Context& ctx, const void* p, const Shape& shape, DType dtype) {
  Tensor h = Tensor::wrap(const_cast<void*>(p), shape, dtype, Device::kCpu);
  return ctx.device == Device::kCpu ? h : h.to(ctx, ctx.device);
}

void copy_to_caller(Context& ctx, const Tensor& t, void* dst) {
  if (t.nbytes() == 0) return;
  const Tensor h = t.device() == Device::kCpu ? t : t.to_host(ctx);
  std::memcpy(dst, h.data(), static_cast<size_t>(h.nbytes()));
}

}  // namespace

extern "C" {

int octet_capi_has_gpu() {
  return gpu_visible() ? 1 : 0;
}

// out[i] = cvt_rn_satfinite(in[i]) through quantize(granularity tensor, given scale 1).
int octet_capi_cast_to_fp8(int device, int format, const float* in, uint8_t* out, int64_t n) {
  return guarded(__func__, device, [&](Context& ctx) {
    QuantizeArgs a;
    a.input = input_on_device(ctx, in, matrix_shape(n), DType::kF32);
    a.format = to_format(format);
    a.granularity = Granularity::kTensor;
    a.output = QuantizeOutput::kRowwise;
    a.scale = host_scalar(1.0f);
    if (ctx.device != Device::kCpu) a.scale = a.scale.to(ctx, ctx.device);
    const QuantTensor q = quantize(ctx, a);
    copy_to_caller(ctx, q.data, out);
  });
}

// out[i] = decode(in[i]) through dequantize(granularity tensor, scale_inv 1).
int octet_capi_fp8_to_float(int device, int format, const uint8_t* in, float* out, int64_t n) {
  return guarded(__func__, device, [&](Context& ctx) {
    QuantTensor q;
    q.format = to_format(format);
    q.granularity = Granularity::kTensor;
    q.data = input_on_device(ctx, in, matrix_shape(n), fp8_dtype(q.format));
    q.scale_inv = host_scalar(1.0f);
    if (ctx.device != Device::kCpu) q.scale_inv = q.scale_inv.to(ctx, ctx.device);
    copy_to_caller(ctx, dequantize(ctx, q, DType::kF32), out);
  });
}

// Host conversion of numerics/fp8.h (the BF16 rounding every op uses for BF16 outputs).
int octet_capi_float_to_bf16(const float* in, uint16_t* out, int64_t n) {
  return guarded(__func__, 0, [&](Context&) {
    OCTET_CHECK(n >= 0, "n must be >= 0, got ", n);
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
  });
}

// Host emulation of an ExMy storage format: out[i] = round_to_exmy(in[i]). kind 0 = IEEE (all-ones
// exponent reserved, like E5M2 and E5M6), 1 = finite-only (like E4M3fn).
int octet_capi_round_exmy(const float* in, float* out, int64_t n, int exp_bits, int man_bits,
                          int kind) {
  return guarded(__func__, 0, [&](Context&) {
    OCTET_CHECK(n >= 0, "n must be >= 0, got ", n);
    // fp8.h's ExMy code is exact for formats whose values are all FP32 values.
    OCTET_CHECK(exp_bits >= 2 && exp_bits <= 8, "exp_bits must be in [2, 8], got ", exp_bits);
    OCTET_CHECK(man_bits >= 1 && man_bits <= 23, "man_bits must be in [1, 23], got ", man_bits);
    OCTET_CHECK(kind == 0 || kind == 1, "kind must be 0 (ieee) or 1 (finite-only), got ", kind);
    const ExMyFormat f{exp_bits, man_bits, kind == 0 ? ExMyKind::kIeee : ExMyKind::kFiniteOnly};
    for (int64_t i = 0; i < n; ++i) out[i] = round_to_exmy(in[i], f);
  });
}

}  // extern "C"
