#include "train/data.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/check.h"
#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/megatron_dataset.h"
#include "io/token_shard.h"
#include "train/token_shard_writer.h"

namespace octet::train {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Tokenizer.

void append_byte_tokens(std::string_view text, std::vector<uint16_t>& out) {
  out.reserve(out.size() + text.size());
  for (const char c : text) out.push_back(static_cast<uint8_t>(c));
}

std::vector<uint16_t> encode_bytes(std::string_view text) {
  std::vector<uint16_t> out;
  append_byte_tokens(text, out);
  return out;
}

std::string decode_bytes(std::span<const int32_t> tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (const int32_t t : tokens) {
    if (t >= 0 && t < 256) {
      out.push_back(static_cast<char>(t));
    } else if (t == kEndOfText) {
      out += "<|endoftext|>";  // GPT-2's spelling of its end-of-text token
    } else {
      out += "<|" + std::to_string(t) + "|>";
    }
  }
  return out;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Text files.

// Offset of the first byte that does not begin a well-formed UTF-8 sequence (RFC 3629: no
// overlong forms, surrogates or code points above U+10FFFF), or -1 when the text is valid.
int64_t first_invalid_utf8(std::string_view s) {
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min_cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min_cp = 0x10000;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n) return static_cast<int64_t>(i);
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      if ((b & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return static_cast<int64_t>(i);
    }
    i += len;
  }
  return -1;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OCTET_CHECK(in, path, ": cannot open text file");
  std::ostringstream ss;
  ss << in.rdbuf();
  OCTET_CHECK(!in.bad(), path, ": read failed");
  std::string text = std::move(ss).str();
  const int64_t bad = first_invalid_utf8(text);
  if (bad >= 0) {
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02x", static_cast<uint8_t>(text[bad]));
    OCTET_THROW(path, ": not UTF-8 text: invalid byte ", byte, " at offset ", bad);
  }
  return text;
}

struct Range {
  size_t begin = 0, end = 0;
};

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isspace(uint8_t(c)) != 0; });
}

// The documents of a file: the text between separator lines (a line equal to `separator`, a
// trailing '\r' ignored), or the whole file when the separator is empty.
std::vector<Range> split_documents(std::string_view text, std::string_view separator) {
  std::vector<Range> docs;
  if (separator.empty()) {
    docs.push_back({0, text.size()});
    return docs;
  }
  size_t doc_begin = 0, line_begin = 0;
  while (line_begin < text.size()) {
    const size_t nl = text.find('\n', line_begin);
    const size_t line_end = nl == std::string_view::npos ? text.size() : nl;
    const size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    std::string_view line = text.substr(line_begin, line_end - line_begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == separator) {
      docs.push_back({doc_begin, line_begin});
      doc_begin = next;
    }
    line_begin = next;
  }
  docs.push_back({doc_begin, text.size()});
  return docs;
}

// Where a file's validation tail begins (text.size(): no tail): the first document start at or
// after the fraction's point; inside the last document, the nearest line start after it (else
// before it, for a last line that holds the point); without line breaks, a character boundary.
size_t validation_cut(std::string_view text, const std::vector<Range>& docs, double val_fraction) {
  if (val_fraction <= 0 || text.empty()) return text.size();
  const auto target = static_cast<size_t>(std::floor((1.0 - val_fraction) * text.size()));
  for (const Range& d : docs) {
    if (d.begin >= target) return d.begin;
  }
  if (target == 0 || text[target - 1] == '\n') return target;
  const size_t next = text.find('\n', target);
  if (next != std::string_view::npos && next + 1 < text.size()) return next + 1;
  const size_t prev = text.rfind('\n', target - 1);
  if (prev != std::string_view::npos) return prev + 1;
  size_t p = target;
  while (p < text.size() && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) ++p;
  return p;
}

// The text's shards: each non-blank document, byte tokens after an end-of-text token.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string prefix, int64_t shard_tokens)
      : shards_(std::move(dir), std::move(prefix), shard_tokens) {}

  void add_document(std::string_view text) {
    if (is_blank(text)) return;
    const std::vector<uint16_t> doc = encode_bytes(text);
    shards_.add_document(static_cast<uint16_t>(kEndOfText), doc);
  }
  void finish() { shards_.finish(); }
  const std::vector<std::string>& files() const { return shards_.files(); }
  int64_t total() const { return shards_.tokens(); }
  nlohmann::ordered_json list() const { return shards_.list(); }

 private:
  TokenShardWriter<uint16_t> shards_;
};

// ---------------------------------------------------------------------------------------------
// Preparation manifest.

using Json = nlohmann::ordered_json;
constexpr const char* kManifestName = "manifest.json";
constexpr int kManifestVersion = 1;

bool is_shard_name(const std::string& name, const char* prefix) {
  const std::string p = std::string(prefix) + "_";
  return name.size() == p.size() + 10 && name.starts_with(p) && name.ends_with(".bin") &&
         std::all_of(name.begin() + p.size(), name.end() - 4,
                     [](char c) { return c >= '0' && c <= '9'; });
}

// What a preparation depends on: equal inputs give equal shards.
Json manifest_inputs(const PrepareTextArgs& args) {
  Json sources = Json::array();
  for (const std::string& f : args.corpus.files) {
    std::error_code ec;  // error_code forms throughout: a name too long is "not found", not a throw
    OCTET_CHECK(fs::is_regular_file(f, ec), f, ": text file not found");
    // stat(2) rather than fs::last_write_time, whose clock's epoch is the library's choice.
    struct stat st = {};
    OCTET_CHECK(::stat(f.c_str(), &st) == 0, f, ": cannot stat text file");
    const int64_t mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
    sources.push_back({{"path", fs::absolute(f).lexically_normal().string()},
                       {"bytes", static_cast<int64_t>(st.st_size)},
                       {"mtime_ns", mtime_ns}});
  }
  return Json{{"format", "octet text shards"},
              {"version", kManifestVersion},
              {"tokenizer", "bytes"},
              {"document_separator", args.corpus.document_separator},
              {"val_fraction", args.val_fraction},
              {"shard_tokens", args.shard_tokens},
              {"sources", sources}};
}

// The earlier preparation in out_dir when its manifest matches `inputs` and its shards are
// intact; anything unreadable just means "prepare again".
std::optional<PreparedText> reuse_prepared(const std::string& out_dir, const Json& inputs) {
  std::ifstream in(fs::path(out_dir) / kManifestName);
  if (!in) return std::nullopt;
  try {
    const Json m = Json::parse(in);
    if (m.at("inputs") != inputs) return std::nullopt;
    PreparedText p;
    p.reused = true;
    const auto intact = [&](const Json& list, std::vector<std::string>& paths, int64_t& total) {
      for (const Json& s : list) {
        const std::string path = (fs::path(out_dir) / s.at("file").get<std::string>()).string();
        const auto tokens = s.at("tokens").get<int64_t>();
        if (io::TokenShard::open(path).size() != tokens) return false;
        paths.push_back(path);
        total += tokens;
      }
      return true;
    };
    if (!intact(m.at("train"), p.shards.train, p.train_tokens) ||
        !intact(m.at("val"), p.shards.val, p.val_tokens) || p.shards.train.empty()) {
      return std::nullopt;
    }
    return p;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

TextCorpus default_corpus(const std::string& dir) {
  const char* hint = "; run scripts/setup.sh to install it (Debian package 'fortunes')";
  std::error_code ec;
  OCTET_CHECK(fs::is_directory(dir, ec), "default training corpus not found: ", dir, " is missing",
              hint);
  TextCorpus corpus;
  corpus.document_separator = kDefaultCorpusSeparator;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (fs::is_regular_file(e.symlink_status()) && name.find('.') == std::string::npos) {
      corpus.files.push_back(e.path().string());
    }
  }
  std::sort(corpus.files.begin(), corpus.files.end());
  OCTET_CHECK(!corpus.files.empty(), "default training corpus not found: ", dir,
              " holds no corpus files", hint);
  return corpus;
}

PreparedText prepare_text_shards(const PrepareTextArgs& args) {
  OCTET_CHECK(!args.corpus.files.empty(), "prepare_text_shards: no text files given");
  OCTET_CHECK(!args.out_dir.empty(), "prepare_text_shards: out_dir is empty");
  OCTET_CHECK(args.val_fraction >= 0 && args.val_fraction < 1,
              "prepare_text_shards: val_fraction must be in [0, 1), got ", args.val_fraction);
  OCTET_CHECK(args.shard_tokens >= 1 && args.shard_tokens <= io::kShardMaxTokens,
              "prepare_text_shards: shard_tokens must be in [1, ", io::kShardMaxTokens, "], got ",
              args.shard_tokens);
  const Json inputs = manifest_inputs(args);
  std::error_code ec;
  fs::create_directories(args.out_dir, ec);
  OCTET_CHECK(!ec && fs::is_directory(args.out_dir), args.out_dir,
              ": cannot create the shard directory: ", ec.message());
  if (std::optional<PreparedText> p = reuse_prepared(args.out_dir, inputs)) return *p;

  // The manifest goes first and comes back last, so an interrupted run is never taken as done;
  // shards of an earlier preparation go too, so a directory glob never picks up stale ones.
  fs::remove(fs::path(args.out_dir) / kManifestName);
  for (const fs::directory_entry& e : fs::directory_iterator(args.out_dir)) {
    const std::string name = e.path().filename().string();
    if (is_shard_name(name, "train") || is_shard_name(name, "val")) fs::remove(e.path());
  }
  ShardWriter train(args.out_dir, "train", args.shard_tokens);
  ShardWriter val(args.out_dir, "val", args.shard_tokens);
  for (const std::string& file : args.corpus.files) {
    const std::string text = read_text_file(file);
    const std::string_view view(text);
    const std::vector<Range> docs = split_documents(view, args.corpus.document_separator);
    const size_t cut = validation_cut(view, docs, args.val_fraction);
    for (const Range& d : docs) {
      // A document straddling the cut becomes two, each with its own end-of-text token.
      if (d.begin < cut) train.add_document(view.substr(d.begin, std::min(d.end, cut) - d.begin));
      if (d.end > cut) {
        const size_t b = std::max(d.begin, cut);
        val.add_document(view.substr(b, d.end - b));
      }
    }
  }
  train.finish();
  val.finish();
  OCTET_CHECK(train.total() > 0, "prepare_text_shards: the text files (", args.corpus.files[0],
              ", ...) hold no training text");

  Json manifest = {{"inputs", inputs}, {"train", train.list()}, {"val", val.list()}};
  io::write_text_file_atomic((fs::path(args.out_dir) / kManifestName).string(),
                             manifest.dump(2) + "\n");
  PreparedText p;
  for (const std::string& f : train.files())
    p.shards.train.push_back((fs::path(args.out_dir) / f).string());
  for (const std::string& f : val.files())
    p.shards.val.push_back((fs::path(args.out_dir) / f).string());
  p.train_tokens = train.total();
  p.val_tokens = val.total();
  return p;
}

// ---------------------------------------------------------------------------------------------
// Data sources.

namespace {

// A path with glob characters is a pattern unless a file or directory of exactly that name
// exists ("notes [v2].txt" is a file name, not a character class).
bool is_glob_pattern(const std::string& s) {
  std::error_code ec;
  return s.find_first_of("*?[") != std::string::npos && !fs::exists(s, ec);
}
bool is_bin(const std::string& path) {
  return fs::path(path).extension() == ".bin";
}

// Regular files of `dir` with the extension `ext` whose names contain `part`, sorted.
std::vector<std::string> files_in(const std::string& dir, const std::string& ext,
                                  const std::string& part) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && e.path().extension() == ext &&
        name.find(part) != std::string::npos) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> val_shards(const std::string& val_path) {
  std::error_code ec;
  if (!is_glob_pattern(val_path) && fs::is_directory(val_path, ec)) {
    std::vector<std::string> v = files_in(val_path, ".bin", "val");
    OCTET_CHECK(!v.empty(), val_path, ": no *val*.bin shards in the validation directory");
    return v;
  }
  if (is_glob_pattern(val_path)) return expand_glob(val_path);
  OCTET_CHECK(fs::is_regular_file(val_path, ec), val_path, ": validation shard not found");
  return {val_path};
}

void check_disjoint(const ShardSet& s) {
  for (const std::string& t : s.train) {
    const bool shared = std::find(s.val.begin(), s.val.end(), t) != s.val.end();
    OCTET_CHECK(!shared, t,
                ": is both a training and a validation shard; give a path or glob that "
                "matches the training shards only (e.g. dir/*train*.bin)");
  }
}

// Text prepared into a cache directory named after its sources and split, so that switching
// between corpora does not re-prepare each time.
ShardSet prepare_cached(TextCorpus corpus, const DataSourceArgs& args) {
  OCTET_CHECK(!args.cache_dir.empty(), "data: cache_dir is empty, but text (", corpus.files[0],
              ", ...) is prepared into token shards there");
  std::string key = corpus.document_separator + "\n" + std::to_string(args.val_fraction) + "\n";
  for (const std::string& f : corpus.files)
    key += fs::absolute(f).lexically_normal().string() + "\n";
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(fnv1a64(key.data(), key.size())));
  std::string stem = fs::absolute(corpus.files[0]).parent_path().filename().string();
  if (stem.empty()) stem = "text";
  PrepareTextArgs p;
  p.corpus = std::move(corpus);
  p.out_dir = (fs::path(args.cache_dir) / (stem + "-" + hex)).string();
  p.val_fraction = args.val_fraction;
  return prepare_text_shards(p).shards;
}

}  // namespace

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g = {};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      std::error_code ec;
      if (fs::is_regular_file(g.gl_pathv[i], ec)) out.emplace_back(g.gl_pathv[i]);
    }
  }
  ::globfree(&g);
  OCTET_CHECK(!out.empty(), pattern, ": no files match");
  // glob(3) sorts by the locale's collation; byte order is the same everywhere.
  std::sort(out.begin(), out.end());
  return out;
}

ShardSet find_shards(const std::string& dir) {
  std::error_code ec;
  OCTET_CHECK(fs::is_directory(dir, ec), dir, ": shard directory not found");
  ShardSet s{files_in(dir, ".bin", "train"), files_in(dir, ".bin", "val")};
  OCTET_CHECK(!s.train.empty(), dir, ": no *train*.bin token shards");
  check_disjoint(s);
  return s;
}

ShardSet resolve_data_source(const DataSourceArgs& args) {
  OCTET_CHECK(args.val_fraction >= 0 && args.val_fraction < 1,
              "data: val_fraction must be in [0, 1), got ", args.val_fraction);
  if (!args.megatron.empty()) {
    OCTET_CHECK(args.path.empty() && args.val_path.empty(), "data: a Megatron dataset (",
                args.megatron, ") excludes text and shards");
    for (const char* ext : {".idx", ".bin"})
      OCTET_CHECK(fs::is_regular_file(args.megatron + ext), args.megatron, ext,
                  ": not found (data.megatron names the prefix of a Megatron-LM dataset's "
                  ".bin and .idx, e.g. data/my-corpus_text_document)");
    ShardSet s;
    s.megatron = args.megatron;
    s.megatron_val_fraction = args.val_fraction;
    return s;
  }
  if (args.path.empty()) return prepare_cached(default_corpus(), args);
  const bool glob = is_glob_pattern(args.path);
  std::error_code ec;
  OCTET_CHECK(glob || fs::exists(args.path, ec), args.path, ": data path not found");

  std::vector<std::string> files;
  ShardSet shards;
  if (!glob && fs::is_directory(args.path, ec)) {
    if (!files_in(args.path, ".bin", "").empty()) {
      shards = find_shards(args.path);
    } else {
      files = files_in(args.path, ".txt", "");
      OCTET_CHECK(!files.empty(), args.path, ": no *.bin token shards and no *.txt text files");
    }
  } else {
    files = glob ? expand_glob(args.path) : std::vector<std::string>{args.path};
    const auto bins = std::count_if(files.begin(), files.end(), is_bin);
    OCTET_CHECK(bins == 0 || bins == static_cast<int64_t>(files.size()), args.path,
                ": matches both token shards (*.bin) and text files; give one kind");
    if (bins > 0) {
      shards.train = std::move(files);
      files.clear();
      const fs::path dir = fs::path(shards.train[0]).parent_path();
      shards.val = files_in(dir.empty() ? "." : dir.string(), ".bin", "val");
    }
  }
  if (files.empty()) {
    if (!args.val_path.empty()) shards.val = val_shards(args.val_path);
    check_disjoint(shards);
    return shards;
  }
  OCTET_CHECK(args.val_path.empty(), "data: val_path applies to token shards only; ", args.path,
              " is text, whose validation split is val_fraction");
  TextCorpus corpus;
  corpus.files = std::move(files);
  corpus.document_separator = args.document_separator;
  return prepare_cached(std::move(corpus), args);
}

// ---------------------------------------------------------------------------------------------
// Token streams.

namespace {

// Fills row `b` of a (B, T) batch from the T + 1 tokens at `start`.
void fill_row(const TokenStream& stream, int64_t start, int64_t T, int32_t* inputs,
              int32_t* targets) {
  stream.read(start, T, inputs);
  std::copy(inputs + 1, inputs + T, targets);
  stream.read(start + T, 1, targets + T - 1);
}

TokenBatch empty_batch(int64_t B, int64_t T) {
  return {Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
}

}  // namespace

struct TokenStream::Shards {
  std::vector<io::TokenShard> files;
};

TokenStream TokenStream::from_shards(std::vector<io::TokenShard> shards) {
  TokenStream s;
  auto owned = std::make_shared<Shards>();
  int64_t total = 0;
  for (io::TokenShard& shard : shards) {
    total += shard.size();
    s.offsets_.push_back(total);
    owned->files.push_back(std::move(shard));
  }
  s.shards_ = std::move(owned);
  return s;
}

TokenStream TokenStream::open(const std::vector<std::string>& paths, int64_t vocab_size) {
  OCTET_CHECK(!paths.empty(), "token stream: no shards given");
  TokenStream s;
  auto shards = std::make_shared<Shards>();
  int64_t total = 0;
  for (const std::string& p : paths) {
    shards->files.push_back(io::TokenShard::open(p, vocab_size));
    total += shards->files.back().size();
    s.offsets_.push_back(total);
  }
  s.shards_ = std::move(shards);
  return s;
}

std::string TokenStream::name() const {
  if (!shards_ || shards_->files.empty()) return "no shards";
  std::string name = shards_->files[0].path();
  if (shards_->files.size() > 1)
    name += " and " + std::to_string(shards_->files.size() - 1) + " more";
  return name;
}

void TokenStream::read(int64_t start, int64_t n, int32_t* out) const {
  OCTET_CHECK(start >= 0 && n >= 0 && start + n <= size(), "token stream (", name(), "): read of [",
              start, ", ", start + n, ") is outside its ", size(), " tokens");
  // The first shard whose end lies past `start`.
  size_t i = std::upper_bound(offsets_.begin(), offsets_.end(), start) - offsets_.begin();
  while (n > 0) {
    const int64_t shard_begin = i == 0 ? 0 : offsets_[i - 1];
    const int64_t take = std::min(n, offsets_[i] - start);
    shards_->files[i].read(start - shard_begin, take, out);
    out += take;
    start += take;
    n -= take;
    ++i;
  }
}

DataVocab data_vocab(const ShardSet& shards) {
  DataVocab v;
  if (shards.train.empty()) return v;
  const fs::path manifest = fs::path(shards.train[0]).parent_path() / kManifestName;
  std::ifstream in(manifest);
  if (!in) return v;
  Json m;
  try {
    m = Json::parse(in);
  } catch (const Json::exception& e) {
    OCTET_THROW(manifest.string(), ": not valid JSON: ", e.what());
  }
  v.manifest = manifest.string();
  if (m.contains("vocab_size") && m["vocab_size"].is_number_integer()) {
    v.vocab_size = m["vocab_size"].get<int64_t>();
    if (m.contains("tokenizer") && m["tokenizer"].is_object())
      v.tokenizer = m["tokenizer"].value("sha256", std::string());
  } else if (m.contains("inputs") && m["inputs"].value("tokenizer", "") == "bytes") {
    v.vocab_size = kByteVocabSize;
    v.tokenizer = "bytes";
  }
  return v;
}

namespace {

// The validation tail of a Megatron dataset starts at the first document start at or after the
// (1 - val_fraction) point of its tokens; without one there, nothing is held out.
DataStreams open_megatron(const ShardSet& shards, int64_t vocab_size) {
  const io::MegatronDataset m = io::MegatronDataset::open(shards.megatron, vocab_size);
  const auto target = static_cast<int64_t>(
      std::floor((1.0 - shards.megatron_val_fraction) * static_cast<double>(m.num_tokens())));
  int64_t cut = m.num_tokens();
  if (shards.megatron_val_fraction > 0) {
    for (int64_t d = 1; d < m.num_documents(); ++d) {
      if (m.document_start(d) >= target) {
        cut = m.document_start(d);
        break;
      }
    }
  }
  DataStreams out;
  out.train = TokenStream::from_shards({m.tokens(0, cut)});
  if (cut < m.num_tokens()) out.val = TokenStream::from_shards({m.tokens(cut, m.num_tokens())});
  return out;
}

}  // namespace

DataStreams open_data_streams(const ShardSet& shards, int64_t vocab_size) {
  if (!shards.megatron.empty()) return open_megatron(shards, vocab_size);
  const DataVocab v = data_vocab(shards);
  OCTET_CHECK(v.vocab_size <= vocab_size, "data: ", v.manifest,
              " says the data was tokenized with a vocabulary of ", v.vocab_size, " ids",
              v.tokenizer.empty() ? "" : " (tokenizer " + v.tokenizer + ")",
              ", but the model's vocab_size is ", vocab_size,
              "; set model.vocab_size = ", v.vocab_size, " (or more)");
  DataStreams d;
  d.train = TokenStream::open(shards.train, vocab_size);
  if (!shards.val.empty()) d.val = TokenStream::open(shards.val, vocab_size);
  return d;
}

// ---------------------------------------------------------------------------------------------
// Sampling.

namespace {

constexpr uint64_t kSamplerStream = stream_id("train.data.sampler");
// A balanced Feistel network of a good round function is a pseudorandom permutation after 4
// rounds (Luby and Rackoff 1988); 6 leave a margin at no measurable cost.
constexpr int kFeistelRounds = 6;

// A bijection of [0, 2^bits) (bits even) keyed by `key`.
uint64_t feistel(uint64_t x, int bits, uint64_t key) {
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t l = x >> half, r = x & mask;
  for (int round = 0; round < kFeistelRounds; ++round) {
    const uint64_t f = mix64(r ^ (key + 0x9E3779B97F4A7C15ull * (round + 1))) & mask;
    const uint64_t next_r = l ^ f;
    l = r;
    r = next_r;
  }
  return (l << half) | r;
}

}  // namespace

std::array<int64_t, SamplerState::kSize> SamplerState::to_array() const {
  return {seed, epoch, position, num_tokens, seq_len};
}

SamplerState SamplerState::from_array(std::span<const int64_t> v) {
  OCTET_CHECK(v.size() == kSize, "sampler state: expected ", kSize, " values, got ", v.size());
  return {v[0], v[1], v[2], v[3], v[4]};
}

BatchSampler::BatchSampler(TokenStream stream, const SamplerArgs& args)
    : stream_(std::move(stream)), args_(args) {
  OCTET_CHECK(args.batch_size >= 1, "sampler: batch_size must be >= 1, got ", args.batch_size);
  OCTET_CHECK(args.seq_len >= 1, "sampler: seq_len must be >= 1, got ", args.seq_len);
  OCTET_CHECK(args.world_size >= 1 && args.rank >= 0 && args.rank < args.world_size,
              "sampler: rank ", args.rank, " is not in [0, world_size = ", args.world_size, ")");
  OCTET_CHECK(stream_.size() >= args.seq_len + 1, "training data (", stream_.name(), ") has ",
              stream_.size(),
              " tokens, fewer than one sequence of seq_len + 1 = ", args.seq_len + 1);
  plan_ = plan_epoch(0);
}

BatchSampler::EpochPlan BatchSampler::plan_epoch(int64_t epoch) const {
  const int64_t N = stream_.size(), T = args_.seq_len;
  const PhiloxCounter w = Rng(args_.seed, kSamplerStream).block(static_cast<uint64_t>(epoch));
  EpochPlan p;
  // Offsets below N - T leave at least one whole window.
  const auto offsets = static_cast<uint64_t>(std::min(T, N - T));
  p.offset = static_cast<int64_t>(((uint64_t{w.w[0]} << 32) | w.w[3]) % offsets);
  p.windows = (N - 1 - p.offset) / T;
  p.key = (uint64_t{w.w[1]} << 32) | w.w[2];
  p.bits = 2;
  while ((uint64_t{1} << p.bits) < static_cast<uint64_t>(p.windows)) p.bits += 2;
  return p;
}

int64_t BatchSampler::window_start(int64_t position) const {
  // Cycle walking: the permutation of the larger domain, applied until it lands in range, is a
  // permutation of [0, windows) (Black and Rogaway 2002); the domain is under 4x the range, so
  // fewer than 4 steps are expected.
  auto x = static_cast<uint64_t>(position);
  do {
    x = feistel(x, plan_.bits, plan_.key);
  } while (x >= static_cast<uint64_t>(plan_.windows));
  return plan_.offset + static_cast<int64_t>(x) * args_.seq_len;
}

TokenBatch BatchSampler::next() {
  const int64_t B = args_.batch_size, T = args_.seq_len;
  TokenBatch batch = empty_batch(B, T);
  for (int64_t g = 0; g < B * args_.world_size; ++g) {
    if (g / B == args_.rank) {
      const int64_t b = g % B;
      fill_row(stream_, window_start(position_), T, batch.inputs.data_as<int32_t>() + b * T,
               batch.targets.data_as<int32_t>() + b * T);
    }
    if (++position_ == plan_.windows) {
      position_ = 0;
      plan_ = plan_epoch(++epoch_);
    }
  }
  return batch;
}

SamplerState BatchSampler::state() const {
  return {std::bit_cast<int64_t>(args_.seed), epoch_, position_, stream_.size(), args_.seq_len};
}

void BatchSampler::set_state(const SamplerState& s) {
  OCTET_CHECK(s.num_tokens == stream_.size(), "sampler state: taken on training data of ",
              s.num_tokens, " tokens, but ", stream_.name(), " has ", stream_.size(),
              " (the data changed since the checkpoint)");
  OCTET_CHECK(s.seq_len == args_.seq_len, "sampler state: taken with seq_len ", s.seq_len,
              ", but the sampler has seq_len ", args_.seq_len);
  OCTET_CHECK(s.epoch >= 0, "sampler state: negative epoch ", s.epoch);
  args_.seed = std::bit_cast<uint64_t>(s.seed);
  const EpochPlan plan = plan_epoch(s.epoch);
  OCTET_CHECK(s.position >= 0 && s.position < plan.windows, "sampler state: position ", s.position,
              " is outside epoch ", s.epoch, "'s ", plan.windows, " windows");
  epoch_ = s.epoch;
  position_ = s.position;
  plan_ = plan;
}

ValBatches::ValBatches(TokenStream stream, const ValBatchesArgs& args)
    : stream_(std::move(stream)), args_(args) {
  OCTET_CHECK(args.batch_size >= 1, "validation: batch_size must be >= 1, got ", args.batch_size);
  OCTET_CHECK(args.seq_len >= 1, "validation: seq_len must be >= 1, got ", args.seq_len);
  OCTET_CHECK(args.max_batches >= 0, "validation: max_batches must be >= 0, got ",
              args.max_batches);
  const int64_t windows = stream_.size() >= 1 ? (stream_.size() - 1) / args.seq_len : 0;
  num_batches_ = windows / args.batch_size;
  if (args.max_batches > 0) num_batches_ = std::min(num_batches_, args.max_batches);
  OCTET_CHECK(num_batches_ >= 1, "validation data (", stream_.name(), ") has ", stream_.size(),
              " tokens, fewer than one batch of ", args.batch_size,
              " sequences needs (batch_size * seq_len + 1 = ", args.batch_size * args.seq_len + 1,
              ")");
}

TokenBatch ValBatches::batch(int64_t i) const {
  OCTET_CHECK(i >= 0 && i < num_batches_, "validation: batch ", i, " is outside [0, ", num_batches_,
              ")");
  const int64_t B = args_.batch_size, T = args_.seq_len;
  TokenBatch batch = empty_batch(B, T);
  for (int64_t b = 0; b < B; ++b) {
    fill_row(stream_, (i * B + b) * T, T, batch.inputs.data_as<int32_t>() + b * T,
             batch.targets.data_as<int32_t>() + b * T);
  }
  return batch;
}

}  // namespace octet::train
