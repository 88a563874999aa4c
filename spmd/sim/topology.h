// spmd/sim/topology.h: the old path of <spmd/world/topology.h>. The backend-neutral core (World,
// PerRank, LocalTensor, SPMD types, the backend registry) lived in spmd/sim/ until round 3, when it
// was named spmd/world/ ("sim" is the sim backend only). Deprecated: this header goes in the next
// release.
#pragma once

#pragma message("<spmd/sim/topology.h> is deprecated: include <spmd/world/topology.h>")
#include <spmd/world/topology.h>
