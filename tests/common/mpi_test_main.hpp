#pragma once
// Boost.Test (header-only variant) main for suites that run under mpirun.
//
// Include this once per test executable, after defining BOOST_TEST_MODULE.
// A rank whose test case fails (a failed check, an exception, a timeout)
// prints which rank and case failed and calls MPI_Abort at the end of that
// case, so the other ranks never wait in a collective that will not come.
// Meson's per-test timeout is the backstop.
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/included/unit_test.hpp>

#include <cstdio>

#include "tessera/comm/mpi.hpp"

namespace tessera_test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

class abort_on_failure : public boost::unit_test::test_observer {
public:
  // Boost orders observers by priority and treats equal priorities as one; 0
  // belongs to the framework's own init observer. Run after the loggers.
  int priority() override { return 1000; }
  void test_unit_start(boost::unit_test::test_unit const&) override { failed_ = false; }
  void assertion_result(boost::unit_test::assertion_result r) override {
    if (r == boost::unit_test::AR_FAILED) failed_ = true;
  }
  void exception_caught(boost::execution_exception const&) override { failed_ = true; }
  void test_unit_aborted(boost::unit_test::test_unit const&) override { failed_ = true; }
  void test_unit_finish(boost::unit_test::test_unit const& tu, unsigned long) override {
    if (!failed_ || tu.p_type != boost::unit_test::TUT_CASE) return;
    std::fflush(stdout);
    std::fprintf(stderr, "tessera test: rank %d of %d failed in '%s'; aborting every rank\n", world_rank(),
                 world_size(), tu.full_name().c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }

private:
  bool failed_ = false;
};

inline bool init_unit_test() {
  static abort_on_failure observer;
  boost::unit_test::framework::register_observer(observer);
  // Only rank 0 reports progress; every rank still reports its own failures.
  if (world_rank() != 0) boost::unit_test::unit_test_log.set_threshold_level(boost::unit_test::log_warnings);
  return true;
}

}  // namespace tessera_test

int main(int argc, char** argv) {
  tessera::comm::mpi_session session(&argc, &argv);
  const int rc = boost::unit_test::unit_test_main(&tessera_test::init_unit_test, argc, argv);
  if (rc != 0 && tessera_test::world_size() > 1) MPI_Abort(MPI_COMM_WORLD, rc);
  return rc;
}
