// Compiles against core's include root alone (the control for core_upward.cpp).
#include "core/tensor.h"
