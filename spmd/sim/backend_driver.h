// spmd/sim/backend_driver.h: the old path of <spmd/world/backend_driver.h>. The backend-neutral
// core (World, PerRank, LocalTensor, SPMD types, the backend registry) lived in spmd/sim/ until
// round 3, when it was named spmd/world/ ("sim" is the sim backend only). Deprecated: this header
// goes in the next release.
#pragma once

#pragma message("<spmd/sim/backend_driver.h> is deprecated: include <spmd/world/backend_driver.h>")
#include <spmd/world/backend_driver.h>
