#include "cli.h"

namespace octet::cli {

const std::vector<Command>& commands() {
  // In the order `octet --help` lists them.
  static const std::vector<Command> table = {
      info_command(),       train_command(),    prepare_command(),    describe_command(),
      init_command(),       quantize_command(), dequantize_command(), quant_report_command(),
      moe_report_command(), gemm_command(),     bench_command(),      eval_command(),
      compare_command(),    export_command(),
  };
  return table;
}

}  // namespace octet::cli
