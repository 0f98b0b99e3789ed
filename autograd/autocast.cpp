// Autocast's per-thread state (autograd/autocast.h).
#include "autograd/autocast.h"

namespace ag {

namespace {
thread_local Precision g_precision = Precision::fp32;
}

Precision autocast_precision() { return g_precision; }
void set_autocast_precision(Precision p) { g_precision = p; }

}  // namespace ag
