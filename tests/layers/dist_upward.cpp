// Must not compile against dist's include roots: dist sits below ops (and model, which uses it).
#include "dist/comm.h"
#include "ops/gemm/gemm.h"
