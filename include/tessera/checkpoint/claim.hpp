#pragma once
//! \file A job's claim on its checkpoint directory, held for the job's whole
//! life: save() locks the root for one save (root_lock, io.hpp), which lets
//! two jobs whose saves do not overlap in time replace each other's
//! checkpoints or mix their steps in one directory. With a claim, the second
//! job fails at its start, naming the holder.
#include <algorithm>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "tessera/checkpoint/io.hpp"
#include "tessera/comm/staged.hpp"

namespace tessera::checkpoint {

namespace detail {
// Roots this process claimed (canonical paths): save() holds no second lock
// on them (flock refuses a second descriptor even in the same process).
struct claim_registry {
  std::mutex mu;
  std::set<std::string> roots;
};
inline claim_registry& claims() {
  static claim_registry r;
  return r;
}
inline std::string claim_key(const fs::path& root) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(root, ec);
  return (ec ? root : p).lexically_normal().string();
}
}  // namespace detail

//! Whether this process holds a claim on root.
[[nodiscard]] inline bool claimed_here(const fs::path& root) {
  auto& r = detail::claims();
  std::lock_guard lock(r.mu);
  return r.roots.count(detail::claim_key(root)) > 0;
}

//! Removes what killed saves left under root (.tmp-step-*, .retired-step-*,
//! .old-step-*). Only the holder of root's lock calls it: then no save of
//! any job is writing them.
inline void remove_leftovers(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    for (std::string_view prefix : {".tmp-step-", ".retired-step-", ".old-step-"})
      if (n.starts_with(prefix)) {
        std::error_code rm;
        fs::remove_all(e.path(), rm);
      }
  }
}

//! The claim: rank 0's lock on the root, released when the last copy goes.
class root_claim {
public:
  root_claim() = default;
  [[nodiscard]] bool held() const noexcept { return state_ != nullptr; }

private:
  struct state {
    root_lock lock;
    std::string key;
    explicit state(const fs::path& root) : lock(root), key(detail::claim_key(root)) {
      auto& r = detail::claims();
      std::lock_guard g(r.mu);
      r.roots.insert(key);
    }
    ~state() {
      auto& r = detail::claims();
      std::lock_guard g(r.mu);
      r.roots.erase(key);
    }
  };
  std::shared_ptr<state> state_;
  template <class C> friend root_claim claim_root(C&, const fs::path&);
};

//! Claims root (creating it) for as long as the returned object lives
//! (collective over c): rank 0 takes the lock save() would take per save and
//! removes what killed saves left there. Where another job holds it, every
//! rank throws "checkpoint: '<root>' is being saved to by another process
//! (pid P on H)". Claim once at start-up, before training, and keep it.
template <class C>
[[nodiscard]] root_claim claim_root(C& c, const fs::path& root) {
  root_claim out;
  std::exception_ptr err;
  if (c.rank() == 0) try {
      std::error_code ec;
      fs::create_directories(root, ec);
      if (ec) io_fail("cannot create", root.string(), ec.value());
      out.state_ = std::make_shared<root_claim::state>(root);
      remove_leftovers(root);
    } catch (...) {
      err = std::current_exception();
    }
  comm::agree_or_throw(c, err, "checkpoint::claim_root");
  return out;
}

}  // namespace tessera::checkpoint
