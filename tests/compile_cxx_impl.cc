// oscar.h with OSCAR_IMPLEMENTATION in C++17, -Wall -Wextra -Werror.
#define OSCAR_IMPLEMENTATION
#include "oscar.h"

int oscar_test_uses_declarations_cxx();

int main() {
    oscar_desc desc = {};
    oscar_ctx *ctx = nullptr;
    desc.backend = OSCAR_BACKEND_CPU;
    if (oscar_setup(&desc, &ctx) != OSCAR_OK) return 1;
    oscar_shutdown(ctx);
    return oscar_test_uses_declarations_cxx() == OSCAR_BACKEND_CPU + 128 ? 0 : 2;
}
