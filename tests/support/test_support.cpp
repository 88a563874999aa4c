// tests/support/test_support.cpp: out-of-line parts of the shared test helpers.
#include "tests/support/test_support.h"
