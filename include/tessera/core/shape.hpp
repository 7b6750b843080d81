#pragma once
//! \file Tensor shapes: a short list of non-negative extents.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera {

//! A tensor's global shape. Extents are non-negative; a rank-0 shape holds one element.
class shape {
public:
  shape() = default;
  shape(std::initializer_list<std::int64_t> e) : extents_(e) { validate(); }
  explicit shape(std::vector<std::int64_t> e) : extents_(std::move(e)) { validate(); }

  [[nodiscard]] std::size_t rank() const noexcept { return extents_.size(); }
  [[nodiscard]] std::int64_t operator[](std::size_t i) const { return extents_.at(i); }
  [[nodiscard]] const std::vector<std::int64_t>& extents() const noexcept { return extents_; }
  [[nodiscard]] std::size_t numel() const noexcept {
    std::size_t n = 1;
    for (auto e : extents_) n *= std::size_t(e);
    return n;
  }
  [[nodiscard]] std::string str() const {
    std::string s = "[";
    for (std::size_t i = 0; i < extents_.size(); ++i) s += (i ? ", " : "") + std::to_string(extents_[i]);
    return s + "]";
  }
  friend bool operator==(const shape&, const shape&) = default;

private:
  void validate() const {
    for (auto e : extents_) TESSERA_CHECK(e >= 0, "negative extent in shape ", str());
  }
  std::vector<std::int64_t> extents_;
};

}  // namespace tessera
