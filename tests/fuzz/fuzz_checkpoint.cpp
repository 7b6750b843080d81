// libFuzzer target: the checkpoint parsers on untrusted bytes. The first byte
// picks the parser (safetensors header, checkpoint index); the rest is the
// input. Either parser may reject its input with a tessera::error; anything
// else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "tessera/checkpoint/index.hpp"
#include "tessera/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const unsigned char> in(data + 1, size - 1);
  try {
    if (data[0] & 1) {
      const auto h = tessera::checkpoint::parse_safetensors_header(in, in.size(), "fuzz input");
      for (const auto& e : h.entries)  // what the parser promises about a valid header
        if (e.end > in.size() - h.data_start || e.begin > e.end) __builtin_trap();
    } else {
      (void)tessera::checkpoint::parse_index(std::string_view(reinterpret_cast<const char*>(in.data()), in.size()), "fuzz input",
                                             /*require_checksum=*/false);  // reach the structure checks too
    }
  } catch (const tessera::error&) {
  }
  return 0;
}
