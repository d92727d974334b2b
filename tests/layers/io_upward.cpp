// Must not compile against io's include roots: io sits below model.
#include "io/safetensors.h"
#include "model/config.h"
