// spmd/sim/per_rank.h: the old path of <spmd/world/per_rank.h>. The backend-neutral core (World,
// PerRank, LocalTensor, SPMD types, the backend registry) lived in spmd/sim/ until round 3, when it
// was named spmd/world/ ("sim" is the sim backend only). Deprecated: this header goes in the next
// release.
#pragma once

#pragma message("<spmd/sim/per_rank.h> is deprecated: include <spmd/world/per_rank.h>")
#include <spmd/world/per_rank.h>
