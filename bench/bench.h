// Benchmarks behind `octet bench <suite>`: timing programs that print tables of throughput and
// ratios against a baseline measured in the same run. Correctness belongs in tests/, not here.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/context.h"

namespace octet::bench {

struct Suite {
  std::string name;
  std::string summary;
  std::string help;
  std::function<int(const std::vector<std::string>& argv)> run;
};

const std::vector<Suite>& suites();

// Declared by each bench/bench_<suite>.cpp.
Suite quantize_suite();
Suite gemm_suite(), gemm_accum_suite();  // bench_gemm.cpp
Suite attention_suite();                 // bench_attention.cpp
Suite train_step_suite();                // bench_train_step.cpp
Suite moe_dispatch_suite();              // bench_moe_dispatch.cpp
Suite swiglu_suite();                    // bench_swiglu.cpp
Suite comm_suite();                      // bench_comm.cpp
Suite adamw_suite();                     // bench_adamw.cpp

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int runs = 0;
};

// Runs `fn` `warmup` times, then `runs` times each timed alone on the device (events), with
// `before_each` (e.g. an L2 flush or input rotation) outside the timed region. Median and min in
// ms.
Timing time_op(Context& ctx, const std::function<void()>& fn, int warmup, int runs,
               const std::function<void()>& before_each = {});

// Evicts the GPU's L2 by writing a buffer twice its size (no-op on the CPU).
class L2Flusher {
 public:
  explicit L2Flusher(Context& ctx);
  void operator()();

 private:
  Context* ctx_;
  Tensor buf_;
};

// Device-to-device copy bandwidth in GB/s (bytes read + bytes written), median over `runs` copies
// of `bytes` bytes: the memory-bound baseline every bandwidth figure is divided by.
double copy_bandwidth_gbs(Context& ctx, int64_t bytes, int runs = 30);

// Random BF16 data of `shape` on ctx's device (a host LCG, a sum of three uniforms in [-1, 1)),
// reproducible from `seed`.
Tensor random_bf16(Context& ctx, const Shape& shape, uint64_t seed);

// Prints a table: header row then rows, columns padded to their widest cell.
void print_table(const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows);
std::string fmt(double v, int precision = 2);

}  // namespace octet::bench
