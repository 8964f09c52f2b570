/* oscar.h with OSCAR_IMPLEMENTATION in C11, -Wall -Wextra -Werror -pedantic. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"

int oscar_test_uses_declarations(void);

int main(void) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    desc.backend = OSCAR_BACKEND_CPU;
    if (oscar_setup(&desc, &ctx) != OSCAR_OK) return 1;
    oscar_shutdown(ctx);
    return oscar_test_uses_declarations() == OSCAR_BACKEND_CPU + 128 ? 0 : 2;
}
