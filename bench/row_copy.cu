// tessera-bench-rows: what fsdp2's row layout adds to a unit's collectives, on
// one GPU. The copy-out after an all-gather (shard order -> compute layout,
// compute dtype) and the copy-in before a reduce-scatter (compute layout ->
// shard order, converted to the wire dtype and scaled), timed on fresh random
// data beside a plain device copy of the same bytes (cudaMemcpyAsync: the
// ceiling) and, for the copy-in, beside the conversion fsdp runs anyway
// (scale_convert, no reordering). Units: the trainer's MLP block (W1 4d x d,
// b1 4d, W2 d x 4d, b2 d) and a transformer block (12 h^2 + 13 h elements in
// ten tensors), split over N = 2, 4, 8 ranks. Each copy is checked against a
// host reference on a small unit first.
//   tessera-bench-rows [--d 4096] [--iters 20] [--json FILE]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common.cuh"
#include "tessera/backend/convert.hpp"
#include "tessera/backend/cuda/ops.cuh"
#include "tessera/shard/row_copy.hpp"

using namespace tessera;
using namespace tessera_bench;
using ops = backend_ops<backend::cuda>;

namespace {

std::vector<tensor_spec> mlp_block(std::int64_t d) {
  return {{"w1", shape({4 * d, d})}, {"b1", shape({4 * d}), false}, {"w2", shape({d, 4 * d})}, {"b2", shape({d}), false}};
}
std::vector<tensor_spec> transformer_block(std::int64_t h) {
  return {{"ln1", shape({h}), false}, {"qkv", shape({3 * h, h})},      {"qkv_b", shape({3 * h}), false},
          {"proj", shape({h, h})},    {"proj_b", shape({h}), false},   {"ln2", shape({h}), false},
          {"fc1", shape({4 * h, h})}, {"fc1_b", shape({4 * h}), false}, {"fc2", shape({h, 4 * h})},
          {"fc2_b", shape({h}), false}};
}

template <class T> std::vector<T> to_host(const dbuf<T>& b) {
  std::vector<T> h(b.size());
  ops::copy_to_host(std::span<T>(h), std::span<const T>(b.span()));
  return h;
}

// The copies exactly as the wrapper runs them (its row_copies), for one unit.
struct unit_copies {
  unit_layout L;
  row_copies<backend::cuda> copies;
  explicit unit_copies(unit_layout l) : L(std::move(l)) { copies.prepare({L}); }
};

// Both copies on a small awkward unit against a host loop over piece_of (one
// rank copies nothing: its layouts coincide; the host core test covers it).
int check(int world) {
  const unit_copies u(unit_layout("u", {{"a", shape({7, 5})}, {"s", shape({})}, {"v", shape({13})}, {"few", shape({2, 3, 2})}},
                                  world, 8, layout_kind::rows));
  const unit_layout& L = u.L;
  auto wire = random_buffer<bf16>(L.padded_numel(), 1), compute = random_buffer<bf16>(L.padded_numel(), 2);
  dbuf<float> grads = random_buffer<float>(L.padded_numel(), 3);
  dbuf<bf16> packed(L.padded_numel());
  u.copies.copy_out(0, L, wire.data(), compute.data());
  u.copies.copy_in(0, L, grads.data(), packed.data(), 0.5f);
  const auto w = to_host(wire), c = to_host(compute), p = to_host(packed);
  const auto g = to_host(grads);
  int wrong = 0;
  for (std::size_t t = 0; t < L.tensors().size(); ++t)
    for (int r = 0; r < world; ++r) {
      const piece q = L.piece_of(t, r);
      for (std::size_t k = 0; k < q.count; ++k) {
        const std::size_t ci = L.tensors()[t].offset + q.tensor_begin + k, wi = L.shard_begin(r) + q.shard_begin + k;
        wrong += float(c[ci]) != float(w[wi]);
        wrong += float(p[wi]) != float(bf16(g[ci] * 0.5f));
      }
    }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  int d = 4096, iters = 20;
  std::string json;
  CLI::App app{"tessera-bench-rows: fsdp2's copy-out and copy-in beside a device copy"};
  app.add_option("--d", d, "model width (the MLP block is 8 d^2 + 5 d elements)")->check(CLI::Range(8, 1 << 16));
  app.add_option("--iters", iters)->check(CLI::Range(1, 1000));
  app.add_option("--json", json);
  CLI11_PARSE(app, argc, argv);

  int wrong = 0;
  for (int world : {2, 3, 4, 8}) wrong += check(world);
  std::printf("# tessera-bench-rows: copies checked against the host at 2-8 ranks: %d wrong\n", wrong);
  std::printf("%-12s %3s %10s | %10s %10s %7s | %10s %10s %10s %7s\n", "unit", "N", "MiB(bf16)", "copy-out", "memcpy",
              "ratio", "copy-in", "convert", "memcpy", "ratio");
  nlohmann::json rows = nlohmann::json::array();
  std::int64_t h = 1;
  while (12 * (h + 1) * (h + 1) + 13 * (h + 1) <= 8 * std::int64_t(d) * d + 5 * d) ++h;  // same size as the MLP block
  for (const auto& [name, specs] : {std::pair{std::string("mlp-block"), mlp_block(d)},
                                    std::pair{std::string("transformer"), transformer_block(h)}})
    for (int world : {2, 4, 8}) {
      const unit_copies u(unit_layout(name, specs, world, 64, layout_kind::rows));
      const unit_layout& L = u.L;
      const std::size_t n = L.padded_numel();
      auto wire = random_buffer<bf16>(n, 11), out = random_buffer<bf16>(n, 12);
      auto grads = random_buffer<float>(n, 13);
      auto sent = random_buffer<bf16>(n, 14);
      const double out_ms = time_ms([&] { u.copies.copy_out(0, L, wire.data(), out.data()); }, 3, iters);
      const double copy16_ms = time_ms([&] { ops::copy(out.span(), std::span<const bf16>(wire.span())); }, 3, iters);
      const double in_ms = time_ms([&] { u.copies.copy_in(0, L, grads.data(), sent.data(), 0.5f); }, 3, iters);
      const double conv_ms = time_ms([&] {
        ops::for_each(n, scale_convert<bf16, float>{grads.data(), sent.data(), 0.5});
      }, 3, iters);
      // The ceiling for the copy-in: the same bytes moved (4 read + 2 written per element).
      dbuf<unsigned char> a(n * 3), b(n * 3);
      const double copy_in_bytes_ms = time_ms([&] { ops::copy(b.span(), std::span<const unsigned char>(a.span())); }, 3, iters);
      std::printf("%-12s %3d %10.1f | %8.3f ms %7.3f ms %7.3f | %8.3f ms %7.3f ms %7.3f ms %7.3f\n", name.c_str(), world,
                  double(n * 2) / (1 << 20), out_ms, copy16_ms, copy16_ms / out_ms, in_ms, conv_ms, copy_in_bytes_ms,
                  copy_in_bytes_ms / in_ms);
      rows.push_back({{"unit", name}, {"world", world}, {"elements", n}, {"copy_out_ms", out_ms},
                      {"memcpy_bf16_ms", copy16_ms}, {"copy_in_ms", in_ms}, {"convert_ms", conv_ms},
                      {"memcpy_same_bytes_ms", copy_in_bytes_ms}});
    }
  std::printf("# ratio = memcpy / copy (1.0: at the device's copy speed); convert = fsdp's fp32->bf16 pass, which the\n"
              "# copy-in replaces (so the copy-in's extra cost is copy-in - convert)\n");
  if (!json.empty()) std::ofstream(json) << nlohmann::json{{"d", d}, {"wrong", wrong}, {"rows", rows}}.dump(2) << "\n";
  return wrong == 0 ? 0 : 1;
}
