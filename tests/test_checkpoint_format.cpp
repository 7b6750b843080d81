// The checkpoint file formats on their own: checksums, safetensors headers and
// checkpoint indexes, including hostile inputs (each a tessera::error naming
// what is wrong; the fuzz target covers what these examples do not).
#define BOOST_TEST_MODULE tessera_checkpoint_format
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"

#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>
#include <functional>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "tessera/checkpoint/consolidate.hpp"
#include "tessera/checkpoint/directory.hpp"
#include "tessera/checkpoint/index.hpp"
#include "tessera/checkpoint/io.hpp"
#include "tessera/checkpoint/pipeline.hpp"
#include "tessera/checkpoint/safetensors.hpp"
#include "tessera/core/checksum.hpp"
#include "tessera/core/hash.hpp"

using namespace tessera;
using namespace tessera::checkpoint;
using tessera_test::expect_error;

namespace {
std::vector<unsigned char> file_of(const std::string& json, std::size_t data_bytes) {
  std::vector<unsigned char> f(8 + json.size() + data_bytes, 0);
  std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) f[std::size_t(i)] = (n >> (8 * i)) & 0xff;
  std::memcpy(f.data() + 8, json.data(), json.size());
  return f;
}
const char* good_index = R"({"format":"tessera-checkpoint","version":1,"step":4,"strategy":"optim","wrapper":"fsdp","world":2,
 "optimizer":"sgd","optimizer_steps":4,"optimizer_skipped":0,"states":["main","momentum_buffer"],
 "files":[{"name":"r0","bytes":100,"checksum":"0123456789abcdef"},{"name":"r1","bytes":100,"checksum":"0123456789abcdef"}],
 "tensors":{"u.w":{"shape":[2,3],"dtype":"F32","pieces":[
   {"file":0,"begin":0,"count":4,"ranges":[{"key":"u.w/main","offset":40,"bytes":16,"checksum":"00000000000000ff"},
                                           {"key":"u.w/momentum_buffer","offset":56,"bytes":16,"checksum":"00000000000000ff"}]},
   {"file":1,"begin":4,"count":2,"ranges":[{"key":"u.w/main","offset":40,"bytes":8,"checksum":"00000000000000ff"},
                                           {"key":"u.w/momentum_buffer","offset":48,"bytes":8,"checksum":"00000000000000ff"}]}]}},
 "extra":{"next_step":4}})";
std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  BOOST_REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}
// The index text with its index_checksum, as a saver writes it: readers refuse an index without one,
// so a test of the structure checks signs what it edits.
std::string signed_text(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  j.erase("index_checksum");
  j["index_checksum"] = checksum64::to_hex(index_checksum(j));
  return j.dump();
}
}  // namespace

BOOST_AUTO_TEST_CASE(checksum_ignores_how_bytes_are_split_and_sees_one_flipped_bit) {
  std::vector<unsigned char> b(1003);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(splitmix64(i));
  const auto whole = checksum64::of(b.data(), b.size());
  for (std::size_t cut : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(8), std::size_t(500), b.size()}) {
    checksum64 c;
    c.update(b.data(), cut);
    c.update(b.data() + cut, b.size() - cut);
    BOOST_TEST(c.digest() == whole);
  }
  b[321] ^= 0x04;
  BOOST_TEST(checksum64::of(b.data(), b.size()) != whole);
  BOOST_TEST(checksum64::of(b.data(), b.size() - 1) != checksum64::of(b.data(), b.size()));
}

BOOST_AUTO_TEST_CASE(safetensors_header_round_trip) {
  const std::vector<st_entry> e{{"a", "F32", {2, 3}, 0, 24}, {"b", "F64", {1}, 24, 32}};
  const std::string h = make_safetensors_header(e, {{"k", "v"}});
  BOOST_TEST(h.size() % 8 == 0u);
  std::vector<unsigned char> f(h.begin(), h.end());
  f.resize(f.size() + 32);
  const auto got = parse_safetensors_header(f, f.size(), "t");
  BOOST_TEST(got.data_start == h.size());
  BOOST_TEST(got.metadata.at("k") == "v");
  BOOST_REQUIRE(got.find("b") != nullptr);
  BOOST_TEST(got.find("b")->begin == 24u);
  BOOST_TEST((got.find("a")->shape == std::vector<std::int64_t>{2, 3}));
}

BOOST_AUTO_TEST_CASE(hostile_safetensors_headers_are_rejected) {
  const std::string t = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::pair<std::string, std::string> cases[] = {
      {"[1,2]", "not a JSON object"},
      {"{" + t + ",", "not valid JSON"},
      {R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", "unknown dtype"},
      {R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "negative"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,9]}})", "outside"},
      {R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "8 bytes for 3"},
      {R"({"t":{"dtype":"F32","shape":[65536,65536,65536,65536],"data_offsets":[0,8]}})", "overflows"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "outside"},
      {R"({"t":{"dtype":"F32","shape":[2]}})", "lacks dtype, shape or data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "overlap"},
      {R"({"__metadata__":{"k":1}})", "is not a string"},
      {std::string(100, '[') + std::string(100, ']'), "nested deeper"},
  };
  for (const auto& [json, why] : cases) {
    auto f = file_of(json, 8);
    BOOST_TEST_CONTEXT(json) { expect_error([&] { (void)parse_safetensors_header(f, f.size(), "f"); }, why); }
  }
  auto f = file_of("{" + t + "}", 8);
  expect_error([&] { (void)parse_safetensors_header(std::span(f).first(5), 5, "f"); }, "shorter than");
  f[7] = 0x7f;  // a header length beyond any file
  expect_error([&] { (void)parse_safetensors_header(f, f.size(), "f"); }, "over the limit");
  f[7] = 0;
  f[0] = 0xff;  // past the end of this file
  expect_error([&] { (void)parse_safetensors_header(f, f.size(), "f"); }, "runs past the end");
}

BOOST_AUTO_TEST_CASE(index_round_trip_and_hostile_indexes) {
  const index_info x = parse_index(signed_text(good_index), "i");
  BOOST_TEST(x.world == 2);
  BOOST_TEST(x.tensors.at("u.w").pieces.size() == 2u);
  const index_info y = parse_index(signed_text(to_json(x).dump()), "i");
  BOOST_TEST(to_json(y).dump() == to_json(x).dump());
  const std::pair<std::pair<std::string, std::string>, std::string> cases[] = {
      {{"\"version\":1", "\"version\":7"}, "index version 7"},
      {{"tessera-checkpoint", "other"}, "not a tessera checkpoint index"},
      {{"\"name\":\"r1\"", "\"name\":\"../r1\""}, "not a plain name"},
      {{"\"world\":2", "\"world\":3"}, "one file per rank"},
      {{"\"begin\":4", "\"begin\":3"}, "overlap"},
      {{"\"count\":2", "\"count\":1"}, "does not match its element count"},
      {{"\"offset\":48", "\"offset\":95"}, "outside file"},
      {{"\"checksum\":\"0123456789abcdef\"", "\"checksum\":\"xyz\""}, "16 hex digits"},
      {{"\"dtype\":\"F32\"", "\"dtype\":\"F99\""}, "is not a floating-point type"},
      {{"\"dtype\":\"F32\"", "\"dtype\":\"I32\""}, "is not a floating-point type"},
      {{"\"key\":\"u.w/main\"", "\"key\":\"v.w/main\""}, "a piece's key is 'v.w/main', expected 'u.w/main'"},
      {{"\"key\":\"u.w/main\"", "\"key\":\"u.w/\\u0001x\""}, "a piece's key is 'u.w/?x'"},
      {{"\"step\":4", "\"step\":-4"}, "'step' missing or not an unsigned integer"},
  };
  for (const auto& [edit, why] : cases) {
    const std::string text = signed_text(replaced(good_index, edit.first, edit.second));
    BOOST_TEST_CONTEXT(edit.second) { expect_error([&] { (void)parse_index(text, "i"); }, why); }
  }
  // Without its checksum an index is refused, whatever else it holds: an edit
  // that keeps the structure valid could not be told from the saved index.
  expect_error([&] { (void)parse_index(good_index, "i"); }, "the index has no index_checksum");
  expect_error([&] { (void)parse_index(replaced(good_index, "\"shape\":[2,3]", "\"shape\":[3,2]"), "i"); },
               "the index has no index_checksum");
  // The version is checked before the checksum: a version-2 index whose
  // checksum this build cannot verify is named as a version, not as damage.
  auto signed_index = to_json(x);
  signed_index["index_checksum"] = "0123456789abcdef";
  signed_index["version"] = 2;
  expect_error([&] { (void)parse_index(signed_index.dump(), "i"); }, "index version 2, this build reads 1");
}

// A FIFO in place of a checkpoint file must not block the reader forever.
BOOST_AUTO_TEST_CASE(a_fifo_is_refused_not_waited_on) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-fifo-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto fifo = dir / "rank-00000.safetensors";
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  expect_error([&] { in_file f(fifo.string()); }, "is not a regular file");
  expect_error([&] { (void)read_small_file(fifo, 1024); }, "is not a regular file");
  std::filesystem::remove_all(dir);
}

// Two savers on one root: the second is told who holds it.
BOOST_AUTO_TEST_CASE(one_saver_per_checkpoint_root) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-lock-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    root_lock first(dir);
    expect_error([&] { root_lock second(dir); }, "is being saved to by another process (pid " + std::to_string(::getpid()));
  }
  root_lock again(dir);  // released with the first
  std::filesystem::remove_all(dir);
}

// The whole index, the trainer's fields included, is under one checksum.
BOOST_AUTO_TEST_CASE(index_checksum_covers_every_field) {
  const index_info x = parse_index(signed_text(good_index), "i");
  const std::string text = index_text(x);
  BOOST_TEST(text.find("index_checksum") != std::string::npos);
  BOOST_TEST(parse_index(text, "i").extra["next_step"] == 4);
  const std::function<void(nlohmann::json&)> edits[] = {
      [](nlohmann::json& j) { j["extra"]["next_step"] = 5; },  // the trainer's own field
      [](nlohmann::json& j) { j["step"] = 3; },
      [](nlohmann::json& j) { j["tensors"]["u.w"]["shape"] = {3, 2}; },  // transposed: same element count
  };
  for (const auto& edit : edits) {
    nlohmann::json j = nlohmann::json::parse(text);
    edit(j);
    expect_error([&] { (void)parse_index(j.dump(1), "i"); }, "does not match its checksum");
  }
}

// A checkpoint's lineage (the run it belongs to) is in the index, under its
// checksum, and keep's view of a root (lineage_checkpoints) holds only that
// lineage's steps: another run's in the same root, an index without a
// lineage and a damaged index are never counted as this run's.
BOOST_AUTO_TEST_CASE(lineage_is_recorded_and_keep_sees_only_its_own) {
  index_info x = parse_index(signed_text(good_index), "i");
  BOOST_TEST(x.lineage.empty());
  BOOST_TEST(index_text(x).find("lineage") == std::string::npos);  // none given: the index as before
  x.lineage = "0123456789abcdef";
  const std::string text = index_text(x);
  BOOST_TEST(parse_index(text, "i").lineage == "0123456789abcdef");
  nlohmann::json j = nlohmann::json::parse(text);
  j["lineage"] = "fedcba9876543210";
  expect_error([&] { (void)parse_index(j.dump(1), "i"); }, "does not match its checksum");

  const auto root = std::filesystem::temp_directory_path() / ("tessera-lineage-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  const auto put = [&](long step, const std::string& lineage, bool damaged = false) {
    index_info y = parse_index(signed_text(good_index), "i");
    y.step = step, y.lineage = lineage;
    char name[32];
    std::snprintf(name, sizeof name, "step-%09ld", step);
    std::filesystem::create_directories(root / name);
    std::string t = index_text(y);
    if (damaged) t[t.find("\"step\"") + 8] = '9';
    write_file_atomic(root / name / index_name, t);
  };
  put(1, "aaaaaaaaaaaaaaaa"), put(2, "bbbbbbbbbbbbbbbb"), put(3, "aaaaaaaaaaaaaaaa"), put(4, ""), put(5, "aaaaaaaaaaaaaaaa", true);
  std::vector<long> mine;
  for (const auto& [step, dir] : lineage_checkpoints(root, "aaaaaaaaaaaaaaaa")) mine.push_back(step);
  BOOST_TEST(mine == (std::vector<long>{1, 3}), boost::test_tools::per_element());
  BOOST_TEST(lineage_checkpoints(root, "").size() == 5u);  // no lineage: every complete checkpoint, as before
  BOOST_TEST(lineage_of(root / "step-000000002").value() == "bbbbbbbbbbbbbbbb");
  BOOST_TEST(lineage_of(root / "step-000000004").value().empty());
  BOOST_TEST(!lineage_of(root / "step-000000005").has_value());
  std::filesystem::remove_all(root);
}

// A safetensors file that fails mid-write (a full disk, a failed gather)
// leaves neither the file nor its .tmp behind, and the error stands.
BOOST_AUTO_TEST_CASE(a_failed_safetensors_write_leaves_nothing) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-st-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "w.safetensors";
  const std::vector<tensor_out> t = {{"a", "F32", {4}}, {"b", "F32", {2}}};
  expect_error([&] {
    write_safetensors(path, t, [](std::size_t i, std::vector<unsigned char>&) {
      if (i == 1) throw tessera::error("the disk is full");
    });
  }, "the disk is full");
  BOOST_TEST(!std::filesystem::exists(path));
  BOOST_TEST(!std::filesystem::exists(path.string() + ".tmp"));
  std::filesystem::remove_all(dir);
}

// The save's writer thread: buffers land in the file in order, past several
// write-behind windows, and a failed write (a full disk) is the caller's error.
BOOST_AUTO_TEST_CASE(background_writer_keeps_order_and_reports_a_full_disk) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-writer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "f.bin";
  // 3 windows and a bit, in uneven buffers of random bytes; two buffers take turns as in save().
  const std::size_t total = 3 * out_file::window + 12345, piece = out_file::window / 3 + 7;
  std::vector<unsigned char> want(total);
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (auto& c : want) c = static_cast<unsigned char>((x = splitmix64(x)) >> 56);
  {
    out_file f(path.string());
    background_writer w(f);
    std::vector<unsigned char> buf[2];
    std::uint64_t ticket[2] = {0, 0};
    int b = 0;
    for (std::size_t at = 0; at < total; at += piece, b ^= 1) {
      if (ticket[b]) w.wait(ticket[b]);
      buf[b].assign(want.begin() + std::ptrdiff_t(at), want.begin() + std::ptrdiff_t(std::min(total, at + piece)));
      ticket[b] = w.write(buf[b].data(), buf[b].size());
    }
    w.finish();
    f.sync_and_close();
    BOOST_TEST(f.written() == total);
  }
  in_file back(path.string());
  std::vector<unsigned char> got(total);
  back.read(0, got.data(), total);
  BOOST_TEST((got == want));
  std::filesystem::remove_all(dir);

  if (::access("/dev/full", W_OK) == 0) {
    out_file full("/dev/full");
    background_writer w(full);
    const std::uint64_t t = w.write(want.data(), 1 << 20);
    (void)w.write(want.data(), 1 << 20);  // dropped after the first fails
    expect_error([&] { w.wait(t); }, "cannot write (disk full?) '/dev/full'");
    expect_error([&] { w.finish(); }, "disk full");
  }
}

// The load's readers: every task runs once; after one fails no new one
// starts, and its error is the caller's.
BOOST_AUTO_TEST_CASE(read_tasks_run_once_each_and_stop_at_an_error) {
  std::vector<std::atomic<int>> runs(1000);
  run_tasks(runs.size(), 8, [&](std::size_t i) { ++runs[i]; });
  for (const auto& r : runs) BOOST_TEST(r.load() == 1);
  std::atomic<int> started{0};
  expect_error([&] {
    run_tasks(100000, 4, [&](std::size_t i) {
      ++started;
      if (i == 10) tessera::detail::fail("checkpoint: task 10 failed");
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // all of them: over a second
    });
  }, "task 10 failed");
  BOOST_TEST(started.load() < 100000);
  run_tasks(0, 8, [](std::size_t) { BOOST_FAIL("no task"); });
}
