// Tensor: a reference-counted, contiguous, row-major buffer on one device.
//
// Tensors are cheap handles (copying one shares the buffer). Host tensors are allocated without a
// context; device tensors come from the Context's backend, which owns the stream they are used on.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace octet {

struct Context;

enum class Device : uint8_t { kCpu, kCuda };
const char* device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  // Host tensor, 64-byte aligned, uninitialised.
  static Tensor empty(const Shape& shape, DType dtype);
  // Tensor on the context's device (uninitialised; device memory is stream-ordered on ctx's
  // stream).
  static Tensor empty(Context& ctx, const Shape& shape, DType dtype);
  // Wraps memory owned elsewhere; `owner` keeps it alive (may be null for memory that outlives the
  // tensor).
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device,
                     std::shared_ptr<void> owner = nullptr);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t size(int dim) const;
  int64_t numel() const { return shape_numel(shape_); }
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }
  // Matrix view used by every op: leading dimensions flattened into rows, the last one is columns.
  int64_t rows() const;
  int64_t cols() const;

  // Same buffer, new shape with the same element count.
  Tensor reshape(const Shape& shape) const;
  // Copy to `device` (a host copy needs no context for host sources). Synchronises for
  // device->host.
  Tensor to(Context& ctx, Device device) const;
  Tensor to_host(Context& ctx) const { return to(ctx, Device::kCpu); }

 private:
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  Shape shape_;
};

// Checks shared by the op dispatchers; the message names the tensor.
void check_dtype(const Tensor& t, const char* name, std::initializer_list<DType> allowed);
void check_device(const Tensor& t, const char* name, Device expected);

}  // namespace octet
