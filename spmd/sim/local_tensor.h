// spmd/sim/local_tensor.h: the old path of <spmd/world/local_tensor.h>. The backend-neutral core
// (World, PerRank, LocalTensor, SPMD types, the backend registry) lived in spmd/sim/ until round 3,
// when it was named spmd/world/ ("sim" is the sim backend only). Deprecated: this header goes in
// the next release.
#pragma once

#pragma message("<spmd/sim/local_tensor.h> is deprecated: include <spmd/world/local_tensor.h>")
#include <spmd/world/local_tensor.h>
