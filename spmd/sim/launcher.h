// spmd/sim/launcher.h: the old path of <spmd/world/launcher.h>. The backend-neutral core (World,
// PerRank, LocalTensor, SPMD types, the backend registry) lived in spmd/sim/ until round 3, when it
// was named spmd/world/ ("sim" is the sim backend only). Deprecated: this header goes in the next
// release.
#pragma once

#pragma message("<spmd/sim/launcher.h> is deprecated: include <spmd/world/launcher.h>")
#include <spmd/world/launcher.h>
