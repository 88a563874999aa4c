// tests/support/test_support.h: what every test folder shares: spmd::testing (<spmd/testing.h>:
// SPMD_TEST, the test world, expect_throws and the DTensor assertions), which spmdsim's tests use
// as a user's would.
#pragma once

#include <gtest/gtest.h>

#include <spmd/testing.h>
