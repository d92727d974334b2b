#include "core/tensor.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/backend_interface.h"
#include "core/context.h"

namespace octet {

const char* device_name(Device d) {
  return d == Device::kCpu ? "cpu" : "cuda";
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    OCTET_CHECK(d >= 0 && !__builtin_mul_overflow(n, d, &n), "shape ", shape_str(s),
                d < 0 ? ": negative dimension" : ": more elements than a 64-bit count holds");
  return n;
}

// Shapes whose byte size a 64-bit count holds (with room for the 64-byte rounding of allocations).
static void check_shape(const Shape& shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  int64_t bytes = 0;
  OCTET_CHECK(!__builtin_mul_overflow(n, dtype_size(dtype), &bytes) && bytes <= INT64_MAX - 64,
              "shape ", shape_str(shape), ": its size in bytes overflows a 64-bit count");
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  check_shape(shape, dtype);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = Device::kCpu;
  // Round up so that 16-byte vector loads of the last element stay inside the allocation.
  const int64_t bytes = ((t.nbytes() + 63) / 64) * 64;
  void* p = bytes ? std::aligned_alloc(64, static_cast<size_t>(bytes)) : nullptr;
  OCTET_CHECK(bytes == 0 || p, "out of host memory allocating ", bytes, " bytes");
  t.owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::empty(Context& ctx, const Shape& shape, DType dtype) {
  if (ctx.device == Device::kCpu) return empty(shape, dtype);
  check_shape(shape, dtype);
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = ctx.device;
  std::shared_ptr<Backend> be = ctx.backend;
  void* p = t.nbytes() ? be->alloc(t.nbytes()) : nullptr;
  t.owner_ = std::shared_ptr<void>(p, [be](void* q) {
    if (q) be->free(q);
  });
  t.data_ = p;
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device,
                    std::shared_ptr<void> owner) {
  check_shape(shape, dtype);
  Tensor t;
  t.owner_ = std::move(owner);
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

int64_t Tensor::size(int dim) const {
  OCTET_CHECK(dim >= 0 && dim < rank(), "dimension ", dim, " out of range for shape ",
              shape_str(shape_));
  return shape_[static_cast<size_t>(dim)];
}

int64_t Tensor::rows() const {
  if (shape_.empty()) return 1;
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape_.size(); ++i) r *= shape_[i];
  return r;
}

int64_t Tensor::cols() const {
  return shape_.empty() ? 1 : shape_.back();
}

Tensor Tensor::reshape(const Shape& shape) const {
  OCTET_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_str(shape_), " to ",
              shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::to(Context& ctx, Device device) const {
  if (device == Device::kCpu && device_ == Device::kCpu) {
    Tensor out = empty(shape_, dtype_);
    if (nbytes()) std::memcpy(out.data(), data_, static_cast<size_t>(nbytes()));
    return out;
  }
  OCTET_CHECK(ctx.device == Device::kCuda, "copy to or from cuda needs a cuda context");
  Tensor out = device == Device::kCpu ? empty(shape_, dtype_) : empty(ctx, shape_, dtype_);
  const CopyKind kind =
      device_ == Device::kCpu
          ? CopyKind::kHostToDevice
          : (device == Device::kCpu ? CopyKind::kDeviceToHost : CopyKind::kDeviceToDevice);
  if (nbytes()) ctx.be().copy(out.data(), data_, nbytes(), kind);
  return out;
}

void check_dtype(const Tensor& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string list;
  for (DType d : allowed) {
    if (!list.empty()) list += '|';
    list += dtype_name(d);
  }
  OCTET_THROW(name, ": expected dtype ", list, ", got ", dtype_name(t.dtype()));
}

void check_device(const Tensor& t, const char* name, Device expected) {
  OCTET_CHECK(t.device() == expected, name, ": expected a ", device_name(expected), " tensor, got ",
              device_name(t.device()));
}

void Context::synchronize() const {
  if (backend) backend->synchronize();
}

}  // namespace octet
