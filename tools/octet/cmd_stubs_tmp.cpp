#include "cli.h"
namespace octet::cli {
static int todo(const std::vector<std::string>&) { return 1; }
Command quantize_command() { return {"quantize", "todo", "todo", todo}; }
Command dequantize_command() { return {"dequantize", "todo", "todo", todo}; }
Command quant_report_command() { return {"quant-report", "todo", "todo", todo}; }
Command bench_command() { return {"bench", "todo", "todo", todo}; }
}
