// Sharded safetensors directories, as the transformers library's save_pretrained writes them and
// its loader reads them:
//   model.safetensors                     when every tensor fits in one shard, or
//   model-00001-of-0000N.safetensors ...  + model.safetensors.index.json
//                                           {"metadata": {"total_size": data bytes},
//                                            "weight_map": {name: file}}
// Each shard carries the safetensors metadata {"format": "pt"} that transformers' loader expects.
// Reading takes the index when present (its total_size is informational and not checked, as in
// transformers); a directory holding both an index and model.safetensors is rejected as ambiguous.
//
// Generic: what the tensors are, their names and the other files of the directory (a model's
// config.json) are the caller's (model/checkpoint.h has the DeepSeek-V3 layout).
//
// Atomicity of a write: the directory is written into a new staging directory
// `<dir>.tmp.XXXXXX` (mkdtemp: a fresh name, never an existing file or a link; every file in it
// via AtomicFile, the index last) and then swapped into place with one
// renameat2(RENAME_EXCHANGE), after which the old directory (now in the staging name) is deleted.
// Files of an existing `dir` that are not part of its sharded tensors (tokenizer files, README,
// other .safetensors files, ...) are carried over into the new directory; only the old directory's
// own files (the caller's named files, the index and the files it names, model.safetensors) and
// their stale AtomicFile temporaries are left behind. A crash leaves `dir` either wholly old or
// wholly new, plus possibly a stale `<dir>.tmp.XXXXXX` (safe to delete; readers never look at it).
// Where RENAME_EXCHANGE is unavailable (old kernels, some network file systems) two renames are
// used: a crash between them leaves no `dir` but the complete old directory in
// `<dir>.old.XXXXXX/` and the complete new one in `<dir>.tmp.XXXXXX`.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/safetensors.h"
#include "io/safetensors_parts.h"

namespace octet::io {

inline constexpr const char* kSingleShardName = "model.safetensors";
inline constexpr const char* kShardIndexName = "model.safetensors.index.json";

// The name of shard i (0-based) of n: model-0000{i+1}-of-0000{n}.safetensors.
std::string shard_file_name(size_t i, size_t n);

// What a write puts into the directory.
struct SafetensorsDirWrite {
  // Other files, written first, each by its function given the file's path in the staging
  // directory (e.g. config.json). They replace files of those names in an existing directory.
  std::vector<std::pair<std::string, std::function<void(const std::string& path)>>> files;
  // The shards' data bytes, one entry per shard (at least one); their sum is the index's
  // total_size.
  std::vector<int64_t> shard_bytes;
  // Shard i's tensors (host), made when it is written: at most one shard is held at a time.
  std::function<NamedTensors(size_t i)> shard;
  // Optional: after each file, its path and the data bytes written so far of the total.
  std::function<void(const std::string& file, int64_t done, int64_t total)> progress;
};

// Writes the directory `dir` (created with its parents; replacing an existing one atomically, as
// above). Throws naming the directory or file.
void write_safetensors_dir(const std::string& dir, const SafetensorsDirWrite& write);

// One tensor of a directory and the shard it came from (for messages).
struct LocatedTensor {
  Tensor tensor;
  std::string file;
};

// Every tensor of the directory, checked against the index: each listed tensor in its file, each
// file's tensors listed there, no tensor twice. Throws naming the file and tensor. With `ranges`,
// a tensor named there has only those elements read (read_safetensors_ranges: a rank reading
// only what it holds); the others are read whole.
std::map<std::string, LocatedTensor> read_safetensors_dir(const std::string& dir,
                                                          const ElementRanges* ranges = nullptr);

// The weight_map (tensor name -> shard file) of the text of a model.safetensors.index.json. Every
// file must be a plain name inside the directory and no tensor may be listed twice; errors name
// `source`.
std::map<std::string, std::string> parse_safetensors_index(std::string_view text,
                                                           const std::string& source);

}  // namespace octet::io
