#pragma once
//! \file Labels: what the library is doing when it issues a collective
//! ("gather layer.3", "reduce_grads embed", "agree checkpoint::save"). Every
//! timeout and order error and the flight recorder (comm/trace.hpp) show it.
#include <array>
#include <cstdio>
#include <utility>

namespace tessera::comm {

namespace detail {
struct label_state {
  const char* what = nullptr;   // "gather", "reduce_grads", "grad_norm", ... (static strings)
  const char* name = nullptr;   // a unit's name, alive while the label is set
};
inline thread_local label_state current_label;
}  // namespace detail

//! Names the collectives issued on this thread while it lives, e.g.
//! label l("gather", unit_name). The recorder and every timeout or order
//! error show it. Nests: the innermost wins, the outer one comes back.
class label {
public:
  explicit label(const char* what, const char* name = nullptr) noexcept
      : saved_(std::exchange(detail::current_label, detail::label_state{what, name})) {}
  label(const label&) = delete;
  label& operator=(const label&) = delete;
  ~label() { detail::current_label = saved_; }

private:
  detail::label_state saved_;
};

namespace trace {

//! Formats the current label into dst ("gather layer.3").
inline void write_label(std::array<char, 72>& dst) noexcept {
  const auto& l = detail::current_label;
  if (!l.what) {
    dst[0] = 0;
    return;
  }
  std::snprintf(dst.data(), dst.size(), "%s%s%s", l.what, l.name ? " " : "", l.name ? l.name : "");
}

}  // namespace trace
}  // namespace tessera::comm
