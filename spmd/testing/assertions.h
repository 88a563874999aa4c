// spmd/testing/assertions.h: GoogleTest assertions that read like the domain.
//
//   EXPECT_DTENSOR_EQ(y, want);              // full tensors equal (DTensor or Tensor on each side)
//   EXPECT_DTENSOR_NEAR(y, want, 1e-5);      // |y - want| <= 1e-5 elementwise
//   EXPECT_PLACEMENTS(y, "S(0),R");          // y's placements, as parse_placements reads them
//   EXPECT_REPLICATED(x.grad().to_local(), mesh, "tp");   // the shards along "tp" are identical
//   spmd::testing::expect_throws<MeshError>([&] { mesh["ep"]; }, {"unknown dim 'ep'"});
//
// Each failure says what differs and where. The DTensor comparisons compare full tensors (same
// shape and dtype; NaN equals NaN at the same index) and report how many elements differ, the
// first differing index with both values, which ranks hold that element, and both sides'
// placements and meshes:
//
//   The full tensors of y and off differ at 1 of 32 elements; the first is index [5, 2]:
//     y   = 22    DTensor [8, 4] f32, S(0) on DeviceMesh((tp=4), stride=(1,)); index [5, 2] is on
//     rank 2
//     off = 22.5  Tensor [8, 4] f32
//
// (one line per side, wrapped here).
//
// They work under every backend, and gather what they compare with collectives: full_tensor()
// (the same full tensor the test's own code would get), and for EXPECT_REPLICATED, outside sim,
// all_gathers along the mesh dim. So every rank of the mesh must reach the assertion, as with any
// collective, and its collectives are in the trace. Every rank then reaches the same verdict: under
// threads and mpi the lowest rank concerned prints the failure in full and the others one line,
// "[rank 3] the same failure as rank 0: the full tensors of y and off differ". Nothing they do
// is recorded by autograd.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>

#include <spmd/core/error.h>
#include <spmd/dtensor/dtensor.h>
#include <spmd/mesh/device_mesh.h>
#include <spmd/ops/placement.h>
#include <spmd/tensor/tensor.h>
#include <spmd/world/local_tensor.h>

namespace spmd::testing {

// The predicate formatters behind the macros (GoogleTest's EXPECT_PRED_FORMATn): the expressions'
// text, then the values. A Tensor on either side is a full tensor already (the same on every
// rank, e.g. the reference computed on full tensors).
::testing::AssertionResult dtensor_eq(const char* a_expr, const char* b_expr, const DTensor& a,
                                      const DTensor& b);
::testing::AssertionResult dtensor_eq(const char* a_expr, const char* b_expr, const DTensor& a,
                                      const Tensor& b);
::testing::AssertionResult dtensor_eq(const char* a_expr, const char* b_expr, const Tensor& a,
                                      const DTensor& b);
::testing::AssertionResult dtensor_eq(const char* a_expr, const char* b_expr, const Tensor& a,
                                      const Tensor& b);
::testing::AssertionResult dtensor_near(const char* a_expr, const char* b_expr,
                                        const char* atol_expr, const DTensor& a, const DTensor& b,
                                        double atol);
::testing::AssertionResult dtensor_near(const char* a_expr, const char* b_expr,
                                        const char* atol_expr, const DTensor& a, const Tensor& b,
                                        double atol);
::testing::AssertionResult dtensor_near(const char* a_expr, const char* b_expr,
                                        const char* atol_expr, const Tensor& a, const DTensor& b,
                                        double atol);
::testing::AssertionResult dtensor_near(const char* a_expr, const char* b_expr,
                                        const char* atol_expr, const Tensor& a, const Tensor& b,
                                        double atol);
// `expected` as parse_placements reads it ("S(0),R", "P(sum),S(1)"), or Placements; negative Shard
// dims count from the end of d's dims.
::testing::AssertionResult placements_are(const char* d_expr, const char* expected_expr,
                                          const DTensor& d, std::string_view expected);
::testing::AssertionResult placements_are(const char* d_expr, const char* expected_expr,
                                          const DTensor& d, const Placements& expected);
// The shards of `local` are identical (shape, dtype and every element, NaN equal to NaN) within
// every group of `mesh` along `dim` that the world holds a rank of. Under sim each group's shards
// are compared with its first, with no collective; elsewhere each rank gathers its group's shards
// (two all_gathers along `dim`: the shapes, then the data). A failure names the group, the two
// ranks and the first differing index with both values.
::testing::AssertionResult replicated(const char* local_expr, const char* mesh_expr,
                                      const char* dim_expr, const LocalTensor& local,
                                      const DeviceMesh& mesh, const MeshDim& dim);

// "spmd::MeshError": the demangled name of a type, for messages.
std::string type_name(const std::type_info& type);

// "MeshError: message" for an spmd::Error, "std::out_of_range: message" for another
// std::exception, "an exception that is not a std::exception" otherwise.
std::string describe_exception(const std::exception_ptr& error);

// Runs `body`, which must throw E (or a subclass of E) with a message containing every one of
// `fragments`; a failure names what was thrown instead ("got CommError: ..."). Returns the
// message, so a test can check more.
template <class E, class Body>
std::string expect_throws(Body&& body, std::initializer_list<std::string> fragments = {}) {
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  if (!error) {
    ADD_FAILURE() << "expected " << type_name(typeid(E)) << ", but nothing was thrown";
    return {};
  }
  try {
    std::rethrow_exception(error);
  } catch (const E& e) {
    std::string message;
    if constexpr (std::is_base_of_v<std::exception, E>) message = e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "the " << type_name(typeid(E)) << "'s message lacks \"" << fragment
          << "\": " << message;
    }
    return message;
  } catch (...) {
    ADD_FAILURE() << "expected " << type_name(typeid(E)) << ", got "
                  << describe_exception(std::current_exception());
  }
  return {};
}

}  // namespace spmd::testing

#define EXPECT_DTENSOR_EQ(a, b) EXPECT_PRED_FORMAT2(::spmd::testing::dtensor_eq, a, b)
#define ASSERT_DTENSOR_EQ(a, b) ASSERT_PRED_FORMAT2(::spmd::testing::dtensor_eq, a, b)
#define EXPECT_DTENSOR_NEAR(a, b, atol) \
  EXPECT_PRED_FORMAT3(::spmd::testing::dtensor_near, a, b, atol)
#define ASSERT_DTENSOR_NEAR(a, b, atol) \
  ASSERT_PRED_FORMAT3(::spmd::testing::dtensor_near, a, b, atol)
#define EXPECT_PLACEMENTS(d, placements) \
  EXPECT_PRED_FORMAT2(::spmd::testing::placements_are, d, placements)
#define ASSERT_PLACEMENTS(d, placements) \
  ASSERT_PRED_FORMAT2(::spmd::testing::placements_are, d, placements)
#define EXPECT_REPLICATED(local, mesh, dim) \
  EXPECT_PRED_FORMAT3(::spmd::testing::replicated, local, mesh, dim)
#define ASSERT_REPLICATED(local, mesh, dim) \
  ASSERT_PRED_FORMAT3(::spmd::testing::replicated, local, mesh, dim)
