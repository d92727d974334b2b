// AtomicFile: the temporary file is always a new file, so a link planted at a name it might use
// (the old `<path>.tmp.<pid>`) is never followed and its target never truncated.
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace octet::io {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(AtomicFile, NeverWritesThroughAPlantedLink) {
  const fs::path dir = fs::temp_directory_path() / ("octet_atomic_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "victim") << "precious";
  const fs::path out = dir / "out.txt";
  fs::create_symlink(dir / "victim", out.string() + ".tmp." + std::to_string(::getpid()));
  write_text_file_atomic(out.string(), "new text");
  EXPECT_EQ(read(out), "new text");
  EXPECT_EQ(read(dir / "victim"), "precious");
  int temporaries = 0;
  for (const auto& e : fs::directory_iterator(dir))
    temporaries += e.path().filename().string().find(".tmp.") != std::string::npos;
  EXPECT_EQ(temporaries, 1) << "only the planted link remains";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace octet::io
