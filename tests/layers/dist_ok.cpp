// Compiles against dist's include roots (dist, backend, numerics, core): the control for
// dist_upward.cpp.
#include "backend/backend.h"
#include "dist/comm.h"
#include "numerics/fp8.h"
