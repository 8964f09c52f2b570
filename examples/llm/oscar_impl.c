/* oscar_impl.c — the one translation unit of the example that compiles oscar.h's
   implementation (the header-only library's usual arrangement). */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
