// Sharded safetensors directories (safetensors_dir.h).
#include "io/safetensors_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/check.h"
#include "io/atomic_file.h"
#include "io/json_keys.h"

namespace octet::io {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;  // std::map-backed: keys sorted, as transformers' sort_keys=True

std::string tensor_in(const std::string& file, const std::string& name) {
  return file + ": tensor '" + name + "'";
}

fs::path normalized_dir(const std::string& dir) {
  OCTET_CHECK(!dir.empty(), "safetensors directory: the name is empty");
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p;
}

// The whole of a small text file (an index): a FIFO or device would block or never end.
std::string read_small_text(const fs::path& path) {
  std::error_code ec;
  OCTET_CHECK(fs::is_regular_file(path, ec), path.string(), ": cannot open: not a regular file");
  std::ifstream in(path, std::ios::binary);
  OCTET_CHECK(in, path.string(), ": cannot open: ", std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- The staging directory and its swap into place ----

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // durability is best effort for directories; the renames are what is atomic
  ::fsync(fd);
  ::close(fd);
}

// Files of an existing directory `dir` that the new one replaces: the caller's named files, the
// index and the shard files it names, model.safetensors, and stale staging files. Everything else
// (tokenizer, generation config, README, other .safetensors files, ...) is carried over, except a
// file with the name of one the new directory holds, which the new one replaces.
std::set<std::string> old_dir_files(const fs::path& dir, const SafetensorsDirWrite& w) {
  std::set<std::string> files = {kShardIndexName, kSingleShardName};
  for (const auto& [name, write] : w.files) files.insert(name);
  std::ifstream in(dir / kShardIndexName);
  const Json index = in ? Json::parse(in, nullptr, false) : Json();
  if (index.is_object() && index.contains("weight_map") && index["weight_map"].is_object())
    for (const auto& [name, file] : index["weight_map"].items())
      if (file.is_string()) files.insert(file.get<std::string>());
  return files;
}

// Whether `name` is an AtomicFile temporary (`<file>.tmp.<pid>.<random>`) of one of `files`: left
// by a writer of that file that crashed. Other names with ".tmp." in them are the user's.
bool is_stale_temporary_of(const std::string& name, const std::set<std::string>& files) {
  const size_t at = name.find(".tmp.");
  return at != std::string::npos && files.count(name.substr(0, at)) != 0;
}

void carry_over(const fs::path& from, const fs::path& to, const SafetensorsDirWrite& w) {
  const std::set<std::string> replaced = old_dir_files(from, w);
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (replaced.count(name) || is_stale_temporary_of(name, replaced) ||
        fs::exists(fs::symlink_status(to / name)))
      continue;
    std::error_code ec;
    if (e.is_regular_file() && !e.is_symlink()) fs::create_hard_link(e.path(), to / name, ec);
    if (ec || !e.is_regular_file() || e.is_symlink())
      fs::copy(e.path(), to / name, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
}

// A new, empty directory `<base>.<tag>.XXXXXX` made by mkdtemp: a name no file or link had, so
// nothing of anyone else's is written through or removed. mkdtemp makes it 0700; it gets what
// mkdir would give it (it becomes the directory).
fs::path make_temp_dir(const fs::path& base, const char* tag) {
  std::string name = base.string() + "." + tag + ".XXXXXX";
  OCTET_CHECK(::mkdtemp(name.data()) != nullptr, base.string(),
              ": cannot create a temporary directory beside it: ", std::strerror(errno));
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(name.c_str(), 0777 & ~mask);
  return name;
}

// Puts the complete `staging` directory at `target`, replacing what is there.
void swap_into_place(const fs::path& staging, const fs::path& target) {
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::exists(fs::symlink_status(target))) {
    OCTET_CHECK(std::rename(staging.c_str(), target.c_str()) == 0, target.string(),
                ": cannot rename ", staging.string(), " onto it: ", std::strerror(errno));
    fsync_path(parent);
    return;
  }
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_path(parent);
    std::error_code ec;  // the new checkpoint is in place: leftovers of the old one are no error
    fs::remove_all(staging, ec);
    return;
  }
  OCTET_CHECK(errno == EINVAL || errno == ENOSYS, target.string(), ": cannot exchange it with ",
              staging.string(), ": ", std::strerror(errno));
#endif
  const fs::path holder = make_temp_dir(target, "old");
  const fs::path old = holder / target.filename();
  if (std::rename(target.c_str(), old.c_str()) != 0) {
    const int err = errno;
    fs::remove(holder);
    OCTET_THROW(target.string(), ": cannot move it to ", old.string(), ": ", std::strerror(err));
  }
  if (std::rename(staging.c_str(), target.c_str()) != 0) {
    const int err = errno;
    std::rename(old.c_str(), target.c_str());
    OCTET_THROW(target.string(), ": cannot rename ", staging.string(),
                " onto it: ", std::strerror(err));
  }
  fsync_path(parent);
  std::error_code ec;
  fs::remove_all(holder, ec);
}

// The caller's files, the shards, then the index: a directory with an index has all its shards.
void write_files(const fs::path& staging, const SafetensorsDirWrite& w) {
  int64_t total = 0;
  for (int64_t b : w.shard_bytes) total += b;
  auto done = [&](const fs::path& file, int64_t bytes) {
    if (w.progress) w.progress(file.string(), bytes, total);
  };
  for (const auto& [name, write] : w.files) {
    write((staging / name).string());
    done(staging / name, 0);
  }
  Json weight_map = Json::object();
  int64_t written = 0;
  const size_t n = w.shard_bytes.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string file = n == 1 ? kSingleShardName : shard_file_name(i, n);
    const NamedTensors tensors = w.shard(i);
    for (const auto& nt : tensors) weight_map[nt.first] = file;
    written += w.shard_bytes[i];
    write_safetensors((staging / file).string(), tensors, {{"format", "pt"}});
    done(staging / file, written);
  }
  if (n > 1) {
    const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text_file_atomic((staging / kShardIndexName).string(), index.dump(2) + "\n");
    done(staging / kShardIndexName, written);
  }
}

}  // namespace

std::string shard_file_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

void write_safetensors_dir(const std::string& dir, const SafetensorsDirWrite& write) {
  OCTET_CHECK(!write.shard_bytes.empty() && write.shard, dir, ": no shards to write");
  const fs::path target = normalized_dir(dir);
  OCTET_CHECK(!fs::exists(target) || fs::is_directory(target), target.string(),
              ": exists and is not a directory");
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const fs::path staging = make_temp_dir(target, "tmp");
  try {
    write_files(staging, write);
    if (fs::exists(target)) carry_over(target, staging, write);
    fsync_path(staging);
    swap_into_place(staging, target);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(staging, ec);  // the previous directory, if any, is untouched
    throw;
  }
}

std::map<std::string, std::string> parse_safetensors_index(std::string_view text,
                                                           const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    OCTET_THROW(source, ": not valid JSON: ", e.what());
  }
  auto wm = j.is_object() ? j.find("weight_map") : j.end();
  OCTET_CHECK(wm != j.end() && wm->is_object(), source,
              ": expected an object with a \"weight_map\" object");
  // The parsed object kept one of two equal keys: a tensor listed twice is seen in the text.
  if (const std::optional<DuplicateKey> d = find_duplicate_key(text)) {
    OCTET_CHECK(d->depth != 2 || d->parent != "weight_map", source, ": weight_map lists tensor '",
                d->key, "' twice");
    OCTET_THROW(source, ": duplicate key '", d->key, "'");
  }
  std::map<std::string, std::string> map;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    OCTET_CHECK(it.value().is_string(), source, ": weight_map['", it.key(),
                "'] must be a file name, got ", it.value().dump());
    const std::string file = it.value().get<std::string>();
    OCTET_CHECK(!file.empty() && file.find('/') == std::string::npos &&
                    file.find('\0') == std::string::npos && file != "." && file != "..",
                source, ": weight_map['", it.key(), "'] = '", file,
                "' is not a file name inside the directory");
    map[it.key()] = file;
  }
  return map;
}

std::map<std::string, LocatedTensor> read_safetensors_dir(const std::string& dir_name,
                                                          const ElementRanges* ranges) {
  auto read = [ranges](const std::string& path) {
    return ranges != nullptr ? read_safetensors_ranges(path, *ranges) : read_safetensors(path);
  };
  const fs::path dir = normalized_dir(dir_name);
  const fs::path index = dir / kShardIndexName, single = dir / kSingleShardName;
  std::error_code ec;  // the error_code forms: a name too long is a missing file, not a throw
  const bool has_index = fs::exists(index, ec), has_single = fs::exists(single, ec);
  OCTET_CHECK(!(has_index && has_single), dir.string(), ": holds both ", kShardIndexName, " and ",
              kSingleShardName, "; which one holds the tensors is ambiguous");
  OCTET_CHECK(has_index || has_single, dir.string(), ": no safetensors (neither ", kShardIndexName,
              " nor ", kSingleShardName, ")");
  std::map<std::string, LocatedTensor> found;
  if (has_single) {
    for (auto& [name, t] : read(single.string()).tensors)
      found.emplace(name, LocatedTensor{std::move(t), single.string()});
    return found;
  }
  const std::map<std::string, std::string> weight_map =
      parse_safetensors_index(read_small_text(index), index.string());
  std::map<std::string, std::vector<std::string>> files;  // file -> names the index puts there
  for (const auto& [name, file] : weight_map) files[file].push_back(name);
  // All files first, so that a tensor in two shards reads as a duplicate whatever the file order.
  std::map<std::string, std::vector<LocatedTensor>> held;
  for (const auto& [file, names] : files) {
    const fs::path path = dir / file;
    const bool regular = fs::is_regular_file(path, ec);
    OCTET_CHECK(regular, path.string(), ": ",
                ec && ec != std::errc::no_such_file_or_directory
                    ? "cannot open (" + ec.message() + ")"
                    : std::string("missing"),
                " (", kShardIndexName, " maps tensor '", names.front(), "'",
                names.size() > 1 ? " and others" : "", " to it)");
    for (auto& [name, t] : read(path.string()).tensors)
      held[name].push_back(LocatedTensor{std::move(t), path.string()});
  }
  for (auto& [name, locs] : held) {
    OCTET_CHECK(locs.size() == 1, tensor_in(locs[0].file, name), ": also in ", locs[1].file,
                " (duplicate tensors across shards)");
    const std::string& path = locs[0].file;
    auto listed = weight_map.find(name);
    OCTET_CHECK(listed != weight_map.end(), tensor_in(path, name), ": not listed in ",
                kShardIndexName);
    OCTET_CHECK(dir / listed->second == fs::path(path), tensor_in(path, name), ": ",
                kShardIndexName, " maps it to ", listed->second);
    found.emplace(name, std::move(locs[0]));
  }
  for (const auto& [name, file] : weight_map)
    OCTET_CHECK(found.count(name), tensor_in((dir / file).string(), name), ": listed in ",
                kShardIndexName, " but absent from the file");
  return found;
}

}  // namespace octet::io
