// spmd/testing/main.cpp: the main() that spmd::testing brings to a test program. It is alone in its
// object file, so a program defining its own main() (which calls run_all_tests) keeps that one.
#include <spmd/testing/spmd_test.h>

int main(int argc, char** argv) {
  return spmd::testing::run_all_tests(argc, argv);
}
