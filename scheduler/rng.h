#pragma once
// The policies' random numbers: see util/rng.h.
#include "util/rng.h"
