// `octet prepare`: text (files, directories, JSON lines) -> token shards with a real tokenizer.
//
// The tokenizing is scripts/prepare_tokens.py's, with the Hugging Face `tokenizers` library from
// the project's venv (scripts/setup.sh installs it): it loads a tokenizer.json or trains a
// byte-level BPE on the inputs, and streams each document's ids back through a pipe (its docstring
// has the protocol). The shards and the manifest are written here (train/prepare.h), so their
// format has one owner.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "core/check.h"
#include "train/prepare.h"

extern char** environ;

namespace octet::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr uint32_t kFrameEnd = 0xFFFFFFFF;
constexpr uint32_t kFrameError = 0xFFFFFFFE;
constexpr uint32_t kMaxDocument = 0xFFFFFFF0;

// <repo>/<rel>, the binary being built in <repo>/<build dir> (as cmd_compare finds its script).
fs::path find_in_repo(const std::string& rel, const std::string& what) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  OCTET_CHECK(!ec, "cannot locate the octet executable (/proc/self/exe): ", ec.message());
  for (const char* up : {"..", "../.."}) {
    fs::path p = (exe.parent_path() / up / rel).lexically_normal();
    if (fs::exists(p, ec)) return p;
  }
  OCTET_THROW("cannot find ", rel, " next to ", exe.parent_path().string(), "/.. (", what, ")");
}

// The child's stdout, read through a FILE for buffering; the child is waited for on close.
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  std::string python;

  ~Child() { wait(); }
  int wait() {
    if (out) std::fclose(out);
    out = nullptr;
    int status = 0;
    if (pid > 0)
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    pid = -1;
    return status;
  }
  void read_exact(void* dst, size_t n, const char* what) {
    OCTET_CHECK(std::fread(dst, 1, n, out) == n, "the tokenizer script (", python,
                " scripts/prepare_tokens.py) stopped in the middle of ", what,
                "; its error is printed above");
  }
};

void spawn(Child& c, std::vector<std::string> args) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  OCTET_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "cannot create a pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  const int err = posix_spawn(&c.pid, args[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (err != 0) {
    ::close(fds[0]);
    c.pid = -1;
    OCTET_THROW("cannot run ", args[0], ": ", std::strerror(err));
  }
  c.out = ::fdopen(fds[0], "rb");
  OCTET_CHECK(c.out != nullptr, "fdopen: ", std::strerror(errno));
}

// An earlier preparation in `out` is replaced only with --force, and then only its own files.
void clear_output(const fs::path& out, ExistingOutput policy) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  OCTET_CHECK(fs::is_directory(out, ec), out.string(), ": exists and is not a directory");
  std::vector<fs::path> ours;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string n = e.path().filename().string();
    const bool shard = (n.starts_with("train_") || n.starts_with("val_")) && n.ends_with(".bin");
    if (shard || n == "manifest.json" || n == "tokenizer.json") ours.push_back(e.path());
  }
  if (ours.empty()) return;
  OCTET_CHECK(policy == ExistingOutput::kReplace, out.string(), " holds a preparation (",
              ours[0].filename().string(), ", ...); pass --force to replace it");
  for (const fs::path& p : ours) fs::remove(p, ec);
}

double parse_fraction(const std::string& s) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  OCTET_CHECK(used == s.size() && v >= 0 && v < 1,
              "--val-fraction must be a number in [0, 1), got ", s);
  return v;
}

int run_prepare(const std::vector<std::string>& argv) {
  const Args args(argv,
                  {"out", "tokenizer", "train-tokenizer", "separator", "text-field", "eot",
                   "val-fraction", "shard-tokens", "python"},
                  {"force"});
  args.expect_positional(1, 1 << 20,
                         "octet prepare INPUT... --out DIR (--tokenizer FILE | "
                         "--train-tokenizer VOCAB) (see --help)");
  OCTET_CHECK(args.has("out"), "octet prepare needs --out DIR");
  OCTET_CHECK(args.has("tokenizer") != args.has("train-tokenizer"),
              "octet prepare: give exactly one of --tokenizer FILE and --train-tokenizer VOCAB");
  const int64_t train_vocab = args.get_int("train-tokenizer", 0);
  OCTET_CHECK(!args.has("train-tokenizer") || (train_vocab >= 257 && train_vocab <= (1 << 24)),
              "--train-tokenizer VOCAB must be in [257, 16777216] (256 byte tokens and the "
              "end-of-text token at least), got ",
              train_vocab);
  if (const auto t = args.get("tokenizer"))
    OCTET_CHECK(fs::is_regular_file(*t), *t, ": tokenizer file not found");
  const fs::path out = *args.get("out");
  clear_output(out, existing_output(args));
  std::error_code ec;
  fs::create_directories(out, ec);
  OCTET_CHECK(!ec, out.string(), ": cannot create the output directory: ", ec.message());

  Child child;
  child.python = args.has("python")
                     ? *args.get("python")
                     : find_in_repo(".venv/bin/python",
                                    "the venv that scripts/setup.sh makes: run scripts/setup.sh")
                           .string();
  const fs::path script =
      find_in_repo("scripts/prepare_tokens.py", "it ships with the source tree");
  std::vector<std::string> cmd = {child.python, script.string(), "--save-tokenizer",
                                  (out / "tokenizer.json").string()};
  if (const auto t = args.get("tokenizer")) cmd.insert(cmd.end(), {"--tokenizer", *t});
  if (args.has("train-tokenizer"))
    cmd.insert(cmd.end(), {"--train-tokenizer", std::to_string(train_vocab)});
  for (const char* f : {"separator", "text-field", "eot"})
    if (const auto v = args.get(f)) cmd.insert(cmd.end(), {std::string("--") + f, *v});
  cmd.emplace_back("--");
  cmd.insert(cmd.end(), args.positional().begin(), args.positional().end());
  spawn(child, cmd);

  std::string header_line;
  for (int ch; (ch = std::fgetc(child.out)) != EOF && ch != '\n';)
    header_line.push_back(static_cast<char>(ch));
  OCTET_CHECK(!header_line.empty(), "the tokenizer script (", child.python, " ", script.string(),
              ") failed before it started; its error is printed above");
  const Json header = Json::parse(header_line);
  OCTET_CHECK(!header.contains("error"), header.value("error", std::string()));

  TokenizedDataArgs wa;
  wa.out_dir = out.string();
  wa.vocab_size = header.at("vocab_size").get<int64_t>();
  wa.eot_id = header.at("eot_id").get<int64_t>();
  wa.val_fraction = parse_fraction(args.get_or("val-fraction", "0.05"));
  wa.shard_tokens = args.get_int("shard-tokens", wa.shard_tokens);
  TokenizedDataWriter writer(wa);
  std::vector<uint32_t> doc;
  for (;;) {
    uint32_t n = 0;
    child.read_exact(&n, sizeof n, "the token stream");
    if (n == kFrameEnd) break;
    if (n == kFrameError) {
      uint32_t len = 0;
      child.read_exact(&len, sizeof len, "an error message");
      std::string msg(len, '\0');
      child.read_exact(msg.data(), len, "an error message");
      OCTET_THROW(msg);
    }
    OCTET_CHECK(n < kMaxDocument, "the tokenizer script sent a malformed frame (", n, ")");
    doc.resize(n);
    child.read_exact(doc.data(), n * sizeof(uint32_t), "a document");
    writer.add_document(doc);
  }
  const int status = child.wait();
  OCTET_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the tokenizer script exited with an error after its last document");

  const std::string sha = header.at("sha256").get<std::string>();
  const bool trained = header.at("trained").get<bool>();
  const Json extra = {{"tokenizer",
                       {{"file", "tokenizer.json"},
                        {"sha256", sha},
                        {"vocab_size", wa.vocab_size},
                        {"eot", header.at("eot")},
                        {"eot_id", wa.eot_id},
                        {"trained", trained}}},
                      {"sources", header.at("sources")}};
  const TokenizedDataSummary s = writer.finish(extra.dump());
  std::printf("tokenizer: %s (%s, %lld ids, end-of-text %s = %lld, sha256 %.12s)\n",
              (out / "tokenizer.json").c_str(),
              trained ? "byte-level BPE trained on the input" : "as given",
              static_cast<long long>(wa.vocab_size), header.at("eot").get<std::string>().c_str(),
              static_cast<long long>(wa.eot_id), sha.c_str());
  std::printf("train: %lld documents, %lld tokens in %zu shard(s) (%s)\n",
              static_cast<long long>(s.train_documents), static_cast<long long>(s.train_tokens),
              s.train.size(), io::shard_tokens_name(s.token_type));
  std::printf("val: %lld documents, %lld tokens in %zu shard(s)\n",
              static_cast<long long>(s.val_documents), static_cast<long long>(s.val_tokens),
              s.val.size());
  std::printf(
      "wrote %s\ntrain on it: octet train --set data.shards=%s --set model.vocab_size=%lld\n",
      s.manifest.c_str(), out.c_str(), static_cast<long long>(wa.vocab_size));
  return 0;
}

}  // namespace

Command prepare_command() {
  return {"prepare", "tokenize text into token shards with a tokenizer.json (or train one)",
          "usage: octet prepare INPUT... --out DIR (--tokenizer FILE | --train-tokenizer VOCAB)\n"
          "  INPUT              text files (one document each, or see --separator), directories\n"
          "                     (their *.txt, *.md, *.jsonl, *.json files, recursively) and JSON\n"
          "                     lines files (*.jsonl, *.json: one document per line)\n"
          "  --out DIR          where the shards, tokenizer.json and manifest.json go\n"
          "  --tokenizer FILE   a Hugging Face tokenizer.json (GPT-2, Llama 3, DeepSeek-V3, ...)\n"
          "  --train-tokenizer VOCAB  train a byte-level BPE of VOCAB ids on the inputs first\n"
          "  --separator LINE   a line equal to LINE ends a document in text files (e.g. %)\n"
          "  --text-field NAME  the document's field in JSON lines (default text)\n"
          "  --eot TOKEN        the end-of-text token (default: <|endoftext|>, <|end_of_text|>,\n"
          "                     DeepSeek-V3's end of sentence, </s> or <eos>, the first found)\n"
          "  --val-fraction F   share of the tokens held out as whole documents (default 0.05)\n"
          "  --shard-tokens N   tokens per shard file (default 100000000)\n"
          "  --python PATH      the Python with `tokenizers` (default <repo>/.venv/bin/python)\n"
          "  --force            replace an earlier preparation in DIR\n"
          "Each document is stored after the tokenizer's end-of-text id, in llm.c shards (uint16\n"
          "ids when the vocabulary fits, else uint32); train on them with data.shards = DIR and\n"
          "model.vocab_size at least the tokenizer's. Progress is printed on long inputs.\n",
          run_prepare};
}

}  // namespace octet::cli
