#pragma once
//! \file POSIX file I/O for checkpoints: whole writes with fsync, positioned
//! reads, directory sync and rename. Every failure is a tessera::error with
//! the path and the system's reason.
//!
//! Large files are written behind (Linux): every `window` bytes the kernel is
//! told to start writing them out, and the window before is waited for and
//! dropped from the page cache. Without it a checkpoint of many GB sits dirty
//! in memory until the final fsync, which then waits for all of it at disk
//! speed after the writing is done; with it the disk writes while the
//! checkpoint is still being produced, and the fsync finds little left.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "tessera/core/error.hpp"

namespace tessera::checkpoint {

namespace fs = std::filesystem;

[[noreturn]] inline void io_fail(const std::string& what, const std::string& path, int err) {
  tessera::detail::fail("checkpoint: " + what + " '" + path + "': " + std::strerror(err));
}

//! A file being written: whole writes, then sync() (data on disk) and close.
class out_file {
public:
  explicit out_file(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) io_fail("cannot create", path_, errno);
  }
  out_file(const out_file&) = delete;
  out_file& operator=(const out_file&) = delete;
  ~out_file() {
    if (fd_ >= 0) ::close(fd_);
  }
  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        io_fail("cannot write (disk full?)", path_, errno);
      }
      p += w;
      n -= std::size_t(w);
      written_ += std::uint64_t(w);
    }
    write_behind();
  }
  //! Flushes to the device and closes; the file is durable afterwards.
  void sync_and_close() {
    if (::fsync(fd_) != 0) io_fail("cannot sync", path_, errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) io_fail("cannot close", path_, errno);
  }
  [[nodiscard]] std::uint64_t written() const noexcept { return written_; }

  static constexpr std::uint64_t window = std::uint64_t(64) << 20;

private:
  // Start writing out each full window as it fills; wait for the one before
  // (the disk is then at most two windows behind) and drop it from the page
  // cache. Advice only: a file system that refuses it is written as before.
  void write_behind() noexcept {
#ifdef __linux__
    while (written_ - started_ >= window) {
      ::sync_file_range(fd_, off_t(started_), off_t(window), SYNC_FILE_RANGE_WRITE);
      started_ += window;
      if (started_ - settled_ > window) {
        ::sync_file_range(fd_, off_t(settled_), off_t(window),
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
        ::posix_fadvise(fd_, off_t(settled_), off_t(window), POSIX_FADV_DONTNEED);
        settled_ += window;
      }
    }
#endif
  }
  std::string path_;
  int fd_ = -1;
  std::uint64_t written_ = 0, started_ = 0, settled_ = 0;
};

//! A file being read at arbitrary offsets.
class in_file {
public:
  explicit in_file(std::string path) : path_(std::move(path)) {
    // O_NONBLOCK: a FIFO (or a device) in place of a checkpoint file would
    // block open() forever; it is refused below, a regular file read normally.
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) io_fail("cannot open", path_, errno);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) io_fail("cannot stat", path_, errno);
    if (!S_ISREG(st.st_mode)) {
      ::close(std::exchange(fd_, -1));
      tessera::detail::fail("checkpoint: '" + path_ + "' is not a regular file");
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) != 0) io_fail("cannot read", path_, errno);
    size_ = std::uint64_t(st.st_size);
  }
  in_file(const in_file&) = delete;
  in_file& operator=(const in_file&) = delete;
  in_file(in_file&& o) noexcept : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}
  ~in_file() {
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  //! Reads exactly n bytes at offset; a range past the end is an error.
  void read(std::uint64_t offset, void* dst, std::size_t n) const {
    if (offset > size_ || n > size_ - offset)
      tessera::detail::fail("checkpoint: '" + path_ + "' is " + std::to_string(size_) + " bytes; bytes [" +
                            std::to_string(offset) + ", " + std::to_string(offset + n) + ") were expected (truncated?)");
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, n, off_t(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        io_fail("cannot read", path_, errno);
      }
      if (r == 0) tessera::detail::fail("checkpoint: '" + path_ + "' ended early (truncated while reading?)");
      p += r;
      n -= std::size_t(r);
      offset += std::uint64_t(r);
    }
  }

private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

//! Makes a directory's entries (creations, renames) durable.
inline void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail("cannot open directory", dir.string(), errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) io_fail("cannot sync directory", dir.string(), err);
}

//! Writes a small file durably: to `path.tmp`, synced, renamed over `path`.
inline void write_file_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  out_file f(tmp.string());
  f.write(text.data(), text.size());
  f.sync_and_close();
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) io_fail("cannot rename into place", path.string(), ec.value());
  sync_dir(path.parent_path());
}

inline std::string read_small_file(const fs::path& path, std::uint64_t limit) {
  in_file f(path.string());
  if (f.size() > limit)
    tessera::detail::fail("checkpoint: '" + path.string() + "' is " + std::to_string(f.size()) + " bytes, over the " +
                          std::to_string(limit) + "-byte limit for this file");
  std::string s(std::size_t(f.size()), '\0');
  f.read(0, s.data(), s.size());
  return s;
}

//! An exclusive lock on a checkpoint root while one process saves into it
//! (flock on <root>/.tessera-save.lock, which names the holder): two trainers
//! saving to one directory would overwrite each other's checkpoints.
class root_lock {
public:
  explicit root_lock(const fs::path& root) : path_((root / ".tessera-save.lock").string()) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) io_fail("cannot create the lock", path_, errno);
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char holder[128] = {};
      const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
      ::close(std::exchange(fd_, -1));
      if (err != EWOULDBLOCK) io_fail("cannot lock", path_, err);
      std::string who(holder, std::size_t(n > 0 ? n : 0));
      for (auto& c : who)
        if (c < 0x20 || c > 0x7e) c = ' ';
      tessera::detail::fail("checkpoint: '" + root.string() + "' is being saved to by another process (" +
                            (who.empty() ? std::string("holder unknown") : who) +
                            "); two jobs must not save to one checkpoint directory");
    }
    char host[64] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string me = "pid " + std::to_string(::getpid()) + " on " + host;
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
      // The lock holds without the note: only the message on contention is poorer.
    }
  }
  root_lock(const root_lock&) = delete;
  root_lock& operator=(const root_lock&) = delete;
  ~root_lock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
  }

private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace tessera::checkpoint
