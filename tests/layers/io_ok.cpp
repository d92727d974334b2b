// Compiles against io's include roots (io and the layers below it).
#include "io/safetensors.h"
#include "ops/quantize/quantize.h"
