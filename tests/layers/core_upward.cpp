// Must not compile against core's include root: core sits below numerics.
#include "core/tensor.h"
#include "numerics/scale.h"
