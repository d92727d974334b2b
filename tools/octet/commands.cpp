#include "cli.h"

namespace octet::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      info_command(),         quantize_command(), dequantize_command(),
      quant_report_command(), bench_command(),    gemm_command(),
  };
  return table;
}

}  // namespace octet::cli
