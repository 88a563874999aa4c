// The consumer project's own tensor/tensor.h, which only the consumer's code may include: it
// defines CONSUMER_OWN_HEADERS around its include. Reached from a header of spmdsim (one that
// included "tensor/tensor.h" rather than <spmd/tensor/tensor.h>), it stops the build.
#pragma once

#ifndef CONSUMER_OWN_HEADERS
#error "spmdsim included the consumer's tensor/tensor.h: its headers must be included as <spmd/...>"
#endif

namespace consumer {

// A class named like spmd::Tensor.
struct Tensor {
  int elements = 0;
};

}  // namespace consumer
