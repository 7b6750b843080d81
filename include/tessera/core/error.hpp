#pragma once
//! \file tessera::error and the TESSERA_ check macros.
//!
//! Every failure the library reports is a tessera::error whose what() starts
//! with "tessera:" and names the failed call, its code, the library's own
//! message and the source location. The CUDA, NCCL and MPI macros expand to
//! calls of functions that the backend / comm headers define, so this header
//! never includes a CUDA, NCCL or MPI header itself.

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tessera {

#if defined(__cpp_lib_source_location)
using source_location = std::source_location;
#else
//! Where std::source_location is missing (clang 14 with libstdc++, used for
//! the fuzz target): file and line from the builtins every compiler has.
struct source_location {
  static constexpr source_location current(const char* file = __builtin_FILE(), int line = __builtin_LINE()) noexcept {
    source_location s;
    s.file_ = file;
    s.line_ = line;
    return s;
  }
  [[nodiscard]] constexpr const char* file_name() const noexcept { return file_; }
  [[nodiscard]] constexpr unsigned line() const noexcept { return unsigned(line_); }

private:
  const char* file_ = "";
  int line_ = 0;
};
#endif

//! The one exception type of the library.
class error : public std::runtime_error {
public:
  error(std::string message, std::string call = {}, long long code = 0,
        ::tessera::source_location where = ::tessera::source_location::current())
      : std::runtime_error(format(message, call, code, where)),
        message_(std::move(message)), call_(std::move(call)), code_(code),
        where_(where) {}

  //! The message without location, e.g. "shape mismatch for 'w1'".
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  //! The failed library call as written in the source, empty for a check.
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  //! The library's return code (cudaError_t, ncclResult_t, MPI error class), 0 for a check.
  [[nodiscard]] long long code() const noexcept { return code_; }
  [[nodiscard]] const ::tessera::source_location& where() const noexcept { return where_; }

private:
  static std::string format(const std::string& message, const std::string& call, long long code,
                            const ::tessera::source_location& where) {
    std::ostringstream os;
    os << "tessera: " << message;
    if (!call.empty()) os << " [" << call << " returned " << code << "]";
    os << " (" << where.file_name() << ":" << where.line() << ")";
    return os.str();
  }
  std::string message_, call_;
  long long code_;
  ::tessera::source_location where_;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] inline void fail(std::string message,
                              ::tessera::source_location where = ::tessera::source_location::current()) {
  throw error(std::move(message), {}, 0, where);
}
}  // namespace detail

}  // namespace tessera

//! Throws tessera::error with the streamed-together message when cond is false.
#define TESSERA_CHECK(cond, ...)                                                  \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::tessera::detail::fail(::tessera::detail::concat(__VA_ARGS__),             \
                              ::tessera::source_location::current());                  \
  } while (0)

//! Wraps an MPI call; comm/mpi.hpp defines the handler. Needs MPI_ERRORS_RETURN
//! on the communicator (tessera sets it on every communicator it owns).
#define TESSERA_MPI(call)                                                         \
  do {                                                                            \
    int tessera_rc_ = (call);                                                     \
    if (tessera_rc_ != 0) [[unlikely]]                                            \
      ::tessera::detail::throw_mpi_error(tessera_rc_, #call,                      \
                                         ::tessera::source_location::current());       \
  } while (0)

//! Wraps a CUDA runtime call; backend/cuda/error.hpp defines the handler.
#define TESSERA_CUDA(call)                                                        \
  do {                                                                            \
    auto tessera_rc_ = (call);                                                    \
    if (tessera_rc_ != 0) [[unlikely]]                                            \
      ::tessera::detail::throw_cuda_error(tessera_rc_, #call,                     \
                                          ::tessera::source_location::current());      \
  } while (0)

//! Wraps an NCCL call; comm/nccl.hpp defines the handler.
#define TESSERA_NCCL(comm, call)                                                  \
  do {                                                                            \
    auto tessera_rc_ = (call);                                                    \
    if (tessera_rc_ != 0) [[unlikely]]                                            \
      ::tessera::detail::throw_nccl_error(comm, tessera_rc_, #call,               \
                                          ::tessera::source_location::current());      \
  } while (0)

