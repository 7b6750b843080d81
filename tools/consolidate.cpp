// tessera-consolidate: one safetensors file of full tensors from a sharded
// Tessera checkpoint, without a GPU or MPI; memory is bounded by the largest
// tensor. CKPT is a checkpoint directory or a root holding step-* checkpoints
// (the newest complete one is taken).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "tessera/checkpoint/directory.hpp"
#include "tessera/checkpoint/consolidate.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tessera-consolidate: a sharded Tessera checkpoint as one safetensors file of full tensors"};
  std::string in, out;
  bool states = false;
  app.add_option("checkpoint", in, "checkpoint directory, or a root holding step-* checkpoints")->required();
  app.add_option("output", out, "the .safetensors file to write")->required();
  app.add_flag("--with-optimizer-state", states, "also write each optimizer state as 'tensor/state'");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    const auto ckpt = tessera::checkpoint::resolve(in);
    if (!ckpt) {
      std::fprintf(stderr, "tessera: no complete checkpoint at or under '%s'\n", in.c_str());
      return 1;
    }
    const std::size_t n = tessera::checkpoint::consolidate(*ckpt, out, states);
    std::printf("tessera-consolidate: %zu tensors from %s into %s\n", n, ckpt->c_str(), out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
