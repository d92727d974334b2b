// The token-shard reader (io/token_shard.h, llm.c's format) on arbitrary bytes, without and with a
// vocabulary bound: every input is either accepted or refused with octet::Error, and an accepted
// shard holds exactly the tokens after the header, each below the bound.
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "core/check.h"
#include "fuzz_util.h"
#include "io/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // TokenShard::open hands from_bytes a page-aligned mapping; a copy gives the same alignment.
  std::shared_ptr<uint64_t[]> buffer(new uint64_t[size / 8 + 1]);
  std::memcpy(buffer.get(), data, size);
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(buffer.get()), size);
  // 0: no bound; 257: octet's byte tokenizer; 50257: GPT-2's vocabulary (llm.c's shards).
  for (const int64_t vocab : {int64_t{0}, int64_t{257}, int64_t{50257}}) {
    octet::io::TokenShard s;
    try {
      s = octet::io::TokenShard::from_bytes("input.bin", buffer, bytes, vocab);
    } catch (const octet::Error&) {
      continue;
    }
    const int64_t width = octet::io::shard_token_bytes(s.token_type());
    if (static_cast<size_t>(s.size() * width) + octet::io::kShardHeaderBytes != size)
      octet::fuzz::fail("token count does not match the file size");
    const auto* after_header = reinterpret_cast<const std::byte*>(buffer.get()) + 1024;
    const void* first = s.token_type() == octet::io::ShardTokens::kU16
                            ? static_cast<const void*>(s.tokens().data())
                            : static_cast<const void*>(s.tokens32().data());
    if (first != after_header) octet::fuzz::fail("tokens do not start after the header");
    std::vector<int32_t> tokens(static_cast<size_t>(s.size()));
    s.read(0, s.size(), tokens.data());
    for (const int32_t t : tokens)
      if (t < 0 || (vocab > 0 && t >= vocab))
        octet::fuzz::fail("a token beyond the vocabulary was accepted");
  }
  return 0;
}
