#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "core/check.h"

namespace octet::io {

// The temporary file is created new (O_EXCL): never an existing file, and never through a link
// planted at its name. The name carries the pid and a random part, and is retried on a collision.
AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  std::random_device rd;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, ".%08x", static_cast<unsigned>(rd()));
    tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + suffix;
    fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  OCTET_CHECK(fd >= 0, path_, ": cannot create ", tmp_, ": ", std::strerror(errno));
  file_ = ::fdopen(fd, "wb");
  if (!file_) ::close(fd);
  OCTET_CHECK(file_, path_, ": cannot open ", tmp_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (file_) std::fclose(file_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  OCTET_CHECK(file_ && !committed_, path_, ": write after commit");
  OCTET_CHECK(bytes == 0 || std::fwrite(data, 1, bytes, file_) == bytes, tmp_,
              ": write failed: ", std::strerror(errno));
}

void AtomicFile::commit() {
  // Flushed and synced before the rename, so that the name never points at incomplete data.
  OCTET_CHECK(std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0, tmp_,
              ": write failed: ", std::strerror(errno));
  const int closed = std::fclose(file_);
  file_ = nullptr;
  OCTET_CHECK(closed == 0, tmp_, ": close failed: ", std::strerror(errno));
  OCTET_CHECK(std::rename(tmp_.c_str(), path_.c_str()) == 0, path_, ": cannot rename ", tmp_,
              " onto it: ", std::strerror(errno));
  committed_ = true;
}

void write_text_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace octet::io
