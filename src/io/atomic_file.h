// AtomicFile: every file octet writes appears whole or not at all.
//
// Data goes to a new file `<path>.tmp.<pid>.<random>` (created exclusively, so never through a
// link); commit() flushes, fsyncs and renames it onto `path`. A writer
// that throws (or is destroyed without commit) removes the temporary file, so a failure never
// leaves a partial output and never damages an existing file of the same name.
#pragma once

#include <cstdio>
#include <string>

namespace octet::io {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  void commit();

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// Whole-file convenience: writes `text` atomically.
void write_text_file_atomic(const std::string& path, const std::string& text);

}  // namespace octet::io
