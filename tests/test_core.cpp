// core/, policy/ and shard/layout: dtypes against reference roundings,
// shapes, errors, the concepts both ways, and layout properties.
#define BOOST_TEST_MODULE tessera_core
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tessera/tessera.hpp"

using namespace tessera;
using tessera_test::uniform;

namespace {
float f_of(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
std::uint32_t u_of(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; }

// Reference bf16 rounding: pick the nearer of the two neighbours in double, ties to even.
std::uint16_t bf16_reference(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const std::uint32_t u = u_of(f);
  const std::uint16_t lo = std::uint16_t(u >> 16);
  if ((u & 0xffffu) == 0) return lo;
  const std::uint16_t hi = std::uint16_t(lo + 1);
  // Past the largest finite bf16 the upper neighbour is infinity; IEEE rounds
  // as if it were 2^128 (the next value with an unbounded exponent).
  auto value = [](std::uint16_t b) {
    const double v = double(f_of(std::uint32_t(b) << 16));
    return std::isinf(v) ? std::copysign(0x1p128, v) : v;
  };
  const double dlo = std::abs(value(lo) - f), dhi = std::abs(value(hi) - f);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(dtypes)

BOOST_AUTO_TEST_CASE(bf16_rounds_to_nearest_even) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f, 1.005859375f, 3.4e38f, -3.4e38f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                           f_of(0x3f808000u), f_of(0x3f818000u), f_of(0x7f7fffffu)};
  for (std::uint64_t i = 0; i < 2'000'000; ++i) xs.push_back(f_of(std::uint32_t(tessera_test::mix(i))));
  for (float x : xs) {
    if (std::isnan(x)) continue;
    BOOST_TEST_CONTEXT("x = " << x << " bits " << std::hex << u_of(x)) {
      BOOST_TEST(bf16(x).bits == bf16_reference(x));
    }
  }
  BOOST_TEST(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  BOOST_TEST(std::isnan(float(bf16(f_of(0x7f800001u)))));  // a signalling NaN stays NaN
  for (std::uint32_t b = 0; b < 0x10000; ++b) {  // every bf16 survives a round trip
    const float f = float(bf16::from_bits(std::uint16_t(b)));
    if (!std::isnan(f)) BOOST_TEST(bf16(f).bits == b);
  }
}

BOOST_AUTO_TEST_CASE(fp16_rounds_to_nearest_even) {
#if defined(__FLT16_MAX__)
  std::vector<float> xs = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 2.9802322e-8f, 5.9604645e-8f,
                           8.940697e-8f, 6.1035156e-5f, 6.1e-5f, 1.0009765625f, 1.00048828125f,
                           std::numeric_limits<float>::infinity()};
  for (std::uint64_t i = 0; i < 2'000'000; ++i) {
    const std::uint32_t u = std::uint32_t(tessera_test::mix(i));
    xs.push_back(f_of(u));
    xs.push_back(f_of((u & 0x80ffffffu) | (std::uint32_t(100 + (u >> 24) % 45) << 23)));  // fp16's range
  }
  for (float x : xs) {
    if (std::isnan(x)) continue;
    const _Float16 ref = static_cast<_Float16>(x);
    std::uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    BOOST_TEST_CONTEXT("x = " << x << " bits " << std::hex << u_of(x)) { BOOST_TEST(fp16(x).bits == rb); }
  }
#endif
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float f = float(fp16::from_bits(std::uint16_t(b)));
    if (std::isnan(f)) continue;
#if defined(__FLT16_MAX__)
    _Float16 h;
    const std::uint16_t b16 = std::uint16_t(b);
    std::memcpy(&h, &b16, 2);
    BOOST_TEST(f == float(h));
#endif
    BOOST_TEST(fp16(f).bits == b);
  }
  BOOST_TEST(std::isnan(float(fp16(std::numeric_limits<float>::quiet_NaN()))));
}

BOOST_AUTO_TEST_CASE(dtype_traits) {
  BOOST_TEST(size_of(dtype_of_v<bf16>) == 2u);
  BOOST_TEST(size_of(dtype_of_v<double>) == 8u);
  BOOST_TEST(name_of(dtype::bf16) == "BF16");
  BOOST_TEST(float(convert<bf16>(1.5)) == 1.5f);
  BOOST_TEST(convert<double>(fp16(0.25f)) == 0.25);
  static_assert(floating_element<bf16> && floating_element<double> && !floating_element<int>);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(errors_and_shapes)

BOOST_AUTO_TEST_CASE(error_names_message_call_and_location) {
  try {
    TESSERA_CHECK(1 + 1 == 3, "arithmetic is off by ", 1);
    BOOST_FAIL("no throw");
  } catch (const tessera::error& e) {
    const std::string w = e.what();
    BOOST_TEST(w.rfind("tessera: arithmetic is off by 1", 0) == 0);
    BOOST_TEST(w.find("test_core.cpp") != std::string::npos);
    BOOST_TEST(e.message() == "arithmetic is off by 1");
  }
  const tessera::error e("collective failed", "ncclAllGather(...)", 5);
  BOOST_TEST(std::string(e.what()).find("[ncclAllGather(...) returned 5]") != std::string::npos);
  BOOST_TEST(e.code() == 5);
}

BOOST_AUTO_TEST_CASE(shapes) {
  BOOST_TEST(shape({3, 4}).numel() == 12u);
  BOOST_TEST(shape({}).numel() == 1u);
  BOOST_TEST(shape({5, 0}).numel() == 0u);
  BOOST_TEST(shape({2, 3}).str() == "[2, 3]");
  BOOST_CHECK_THROW(shape({2, -1}), tessera::error);
}

BOOST_AUTO_TEST_SUITE_END()

// ---- concepts, both ways -------------------------------------------------------
struct not_a_policy {};
static_assert(sharding_strategy<no_shard> && sharding_strategy<optim_grads_params>);
static_assert(!sharding_strategy<not_a_policy> && !sharding_strategy<int> && !sharding_strategy<fsdp>);
static_assert(wrapper_policy<ddp> && wrapper_policy<fsdp> && !wrapper_policy<no_shard>);
static_assert(precision_policy<full_precision<float>> && precision_policy<mixed_precision<bf16, float>>);
static_assert(!precision_policy<float> && !precision_policy<not_a_policy>);
static_assert(averaging_policy<pre_divide> && !averaging_policy<no_shard>);
static_assert(backend_policy<backend::host> && backend_policy<backend::cuda> && !backend_policy<int>);
static_assert(comm::communicator<comm::mpi> && comm::communicator<comm::local<>>);
static_assert(!comm::communicator<int> && !comm::communicator<not_a_policy>);
static_assert(optimizer_algorithm<adamw> && optimizer_algorithm<sgd> && !optimizer_algorithm<no_shard>);
static_assert(config_type<config<optim>> && !config_type<optim>);
static_assert(std::is_same_v<data_parallel_t<config<optim, ddp>>, DistributedDataParallel<config<optim, ddp>>>);
static_assert(std::is_same_v<data_parallel_t<config<no_shard, fsdp>>, FullyShardedDataParallel<config<no_shard>>>);
static_assert(std::is_same_v<config<optim, fsdp, mixed_precision<bf16, float>>::grad_type, float>);
static_assert(std::is_same_v<config<optim, fsdp, mixed_precision<bf16, float, float, bf16>>::wire_type, bf16>);
// After the strategy and the wrapper, precision, averaging and backend come in
// any order, each defaulted when left out.
using any_order = config<optim_grads_params, fsdp, backend::cuda, sum, mixed_precision<bf16, float>>;
static_assert(std::is_same_v<any_order::backend_type, backend::cuda> && std::is_same_v<any_order::averaging, sum> &&
              std::is_same_v<any_order::precision, mixed_precision<bf16, float>>);
using only_backend = config<optim, ddp, backend::cuda>;
static_assert(std::is_same_v<only_backend::backend_type, backend::cuda> &&
              std::is_same_v<only_backend::averaging, average_in_collective> &&
              std::is_same_v<only_backend::precision, full_precision<float>>);
using positional = config<optim, fsdp, full_precision<double>, post_divide, backend::host>;
static_assert(std::is_same_v<positional::main_type, double> && std::is_same_v<positional::averaging, post_divide>);
static_assert(config_type<any_order> && config_type<only_backend>);
static_assert(!wrapper_supports("ddp", "optim_grads_params") && wrapper_supports("fsdp", "optim_grads_params") &&
              wrapper_supports("ddp", "optim_grads") && !wrapper_supports_v<ddp, optim_grads_params>);

BOOST_AUTO_TEST_SUITE(layout)

// Every rank's shard tiles the padded buffer once; every tensor element is in
// exactly one rank's piece, at the place the flat offsets say.
BOOST_AUTO_TEST_CASE(pieces_tile_every_tensor_exactly_once) {
  int cases = 0;
  for (int world = 1; world <= 8; ++world)
    for (std::size_t align : {std::size_t(1), std::size_t(3), std::size_t(16)})
      for (int trial = 0; trial < 40; ++trial) {
        std::vector<tensor_spec> specs;
        const int nt = int((uniform(world, align, trial, 1) + 1) * 3.5);
        for (int t = 0; t < nt; ++t) {
          const auto a = std::int64_t((uniform(world, align, trial, t, 2) + 1) * 6);
          const auto b = std::int64_t((uniform(world, align, trial, t, 3) + 1) * 4);
          specs.push_back({"t" + std::to_string(t), shape({a, b}), t % 2 == 0});
        }
        const unit_layout L("u", specs, world, align);
        BOOST_TEST_CONTEXT("world " << world << " align " << align << " trial " << trial) {
          BOOST_TEST(L.padded_numel() % (std::size_t(world) * align) == 0u);
          BOOST_TEST(L.shard_numel() * std::size_t(world) == L.padded_numel());
          BOOST_TEST(L.padded_numel() >= L.numel());
          std::vector<int> flat(L.padded_numel(), 0);
          std::size_t prev_end = 0;
          for (std::size_t t = 0; t < L.tensors().size(); ++t) {
            const auto& s = L.tensors()[t];
            BOOST_TEST(s.offset % align == 0u);
            BOOST_TEST(s.offset >= prev_end);
            prev_end = s.offset + s.numel;
            std::vector<int> seen(s.numel, 0);
            for (int r = 0; r < world; ++r) {
              const piece p = L.piece_of(t, r);
              BOOST_TEST(p.shard_begin + p.count <= L.shard_numel());
              for (std::size_t i = 0; i < p.count; ++i) {
                seen[p.tensor_begin + i]++;
                BOOST_TEST(L.shard_begin(r) + p.shard_begin + i == s.offset + p.tensor_begin + i);
                flat[L.shard_begin(r) + p.shard_begin + i]++;
              }
            }
            for (int c : seen) BOOST_TEST(c == 1);
          }
          for (int c : flat) BOOST_TEST(c <= 1);
        }
        ++cases;
      }
  BOOST_TEST(cases == 8 * 3 * 40);
}

// fsdp2's rows layout: every tensor split on dim 0 into blocks of
// ceil(rows / world) rows, one per shard; pieces are whole rows, tile the
// tensor once, and the copies between shard order and the compute layout
// invert each other.
BOOST_AUTO_TEST_CASE(rows_layout_gives_whole_rows_and_copies_round_trip) {
  int cases = 0;
  for (int world = 1; world <= 8; ++world)
    for (std::size_t align : {std::size_t(1), std::size_t(3), std::size_t(16)})
      for (int trial = 0; trial < 30; ++trial) {
        std::vector<tensor_spec> specs;
        const int nt = int((uniform(world, align, trial, 1) + 1) * 3.5);
        for (int t = 0; t < nt; ++t) {
          const auto a = std::int64_t((uniform(world, align, trial, t, 2) + 1) * 6);  // 0..11 rows
          const auto b = std::int64_t((uniform(world, align, trial, t, 3) + 1) * 3);
          switch (t % 5) {
            case 0: specs.push_back({"t" + std::to_string(t), shape({a, b}), true}); break;
            case 1: specs.push_back({"t" + std::to_string(t), shape({a}), false}); break;
            case 2: specs.push_back({"t" + std::to_string(t), shape({}), false}); break;
            case 3: specs.push_back({"t" + std::to_string(t), shape({a, 2, b}), true}); break;
            default: specs.push_back({"t" + std::to_string(t), shape({a % 3, 0}), true}); break;
          }
        }
        const unit_layout L("u", specs, world, align, layout_kind::rows);
        BOOST_TEST_CONTEXT("world " << world << " align " << align << " trial " << trial) {
          BOOST_TEST(L.shard_numel() % align == 0u);
          BOOST_TEST(L.shard_numel() * std::size_t(world) == L.padded_numel());
          BOOST_TEST(L.padded_numel() >= L.numel());
          BOOST_TEST(L.permuted() == (world > 1));
          std::vector<int> in_shard(L.padded_numel(), 0);
          for (std::size_t t = 0; t < L.tensors().size(); ++t) {
            const auto& s = L.tensors()[t];
            BOOST_TEST(s.offset % align == 0u);
            BOOST_TEST(s.shard_offset % align == 0u);
            std::vector<int> seen(s.numel, 0);
            for (int r = 0; r < world; ++r) {
              const piece p = L.piece_of(t, r);
              if (p.empty()) continue;
              BOOST_TEST(p.tensor_begin == std::size_t(r) * s.rows_per_rank * s.row_numel);  // rank r's rows
              BOOST_TEST(p.tensor_begin % s.row_numel == 0u);
              BOOST_TEST(p.count % s.row_numel == 0u);  // whole rows
              BOOST_TEST(p.count <= s.rows_per_rank * s.row_numel);
              BOOST_TEST(p.shard_begin == s.shard_offset);
              for (std::size_t i = 0; i < p.count; ++i) {
                seen[p.tensor_begin + i]++;
                in_shard[L.shard_begin(r) + p.shard_begin + i]++;
              }
            }
            for (int c : seen) BOOST_TEST(c == 1);
          }
          for (int c : in_shard) BOOST_TEST(c <= 1);
          // copy_in (compute -> shard order) then copy_out gives the tensors back, padding zero.
          const auto seg = detail::row_segments(L);
          std::vector<double> compute(L.padded_numel(), 0.0), wire(L.padded_numel(), -1.0), back(L.padded_numel(), -1.0);
          for (const auto& s : L.tensors())
            for (std::size_t i = 0; i < s.numel; ++i) compute[s.offset + i] = uniform(world, trial, s.offset, i) + 2.0;
          backend_ops<backend::host>::for_each(
              L.padded_numel(), detail::copy_in<double, double>{compute.data(), wire.data(), seg.data(), int(seg.size()),
                                                                L.shard_numel(), 1.0f});
          for (int r = 0; r < world; ++r)  // the shard holds each piece where piece_of says
            for (std::size_t t = 0; t < L.tensors().size(); ++t) {
              const piece p = L.piece_of(t, r);
              for (std::size_t i = 0; i < p.count; ++i)
                BOOST_TEST(wire[L.shard_begin(r) + p.shard_begin + i] ==
                           float(compute[L.tensors()[t].offset + p.tensor_begin + i]));
            }
          for (std::size_t j = 0; j < wire.size(); ++j)
            if (!in_shard[j]) BOOST_TEST(wire[j] == 0.0);  // padding written as zero
          backend_ops<backend::host>::for_each(
              L.padded_numel(), detail::copy_out<double>{wire.data(), back.data(), seg.data(), int(seg.size()),
                                                         L.shard_numel()});
          for (std::size_t c = 0; c < back.size(); ++c) BOOST_TEST(back[c] == double(float(compute[c])));
          // The 8-wide chunk path the device takes (run<8>), against the element path above.
          std::vector<double> wire8(L.padded_numel(), -1.0), back8(L.padded_numel(), -1.0);
          const detail::copy_in<double, double> in{compute.data(), wire8.data(), seg.data(), int(seg.size()),
                                                   L.shard_numel(), 1.0f, true};
          const detail::copy_out<double> out{wire8.data(), back8.data(), seg.data(), int(seg.size()), L.shard_numel(), true};
          const std::size_t n = L.padded_numel(), whole = n / 8 * 8;
          for (std::size_t c = 0; c < whole; c += 8) in.run<8>(c);
          for (std::size_t c = whole; c < n; ++c) in(c);
          for (std::size_t c = 0; c < whole; c += 8) out.run<8>(c);
          for (std::size_t c = whole; c < n; ++c) out(c);
          BOOST_TEST(wire8 == wire);
          BOOST_TEST(back8 == back);
        }
        ++cases;
      }
  BOOST_TEST(cases == 8 * 3 * 30);
}

BOOST_AUTO_TEST_CASE(small_tensors_leave_empty_pieces) {
  const unit_layout L("u", {{"one", shape({1})}}, 5, 1);
  BOOST_TEST(L.padded_numel() == 5u);
  BOOST_TEST(L.piece_of(0, 0).count == 1u);
  for (int r = 1; r < 5; ++r) BOOST_TEST(L.piece_of(0, r).empty());
}

BOOST_AUTO_TEST_CASE(digest_tells_models_apart) {
  const std::vector<unit_layout> a{unit_layout("u", {{"w", shape({3, 4})}}, 2, 16)};
  const std::vector<unit_layout> b{unit_layout("u", {{"w", shape({4, 3})}}, 2, 16)};
  const std::vector<unit_layout> c{unit_layout("u", {{"w", shape({3, 4}), false}}, 2, 16)};
  BOOST_TEST(digest(a) != digest(b));
  BOOST_TEST(digest(a) != digest(c));
  BOOST_TEST(digest(a) == digest(std::vector<unit_layout>{unit_layout("u", {{"w", shape({3, 4})}}, 2, 16)}));
}

BOOST_AUTO_TEST_SUITE_END()
