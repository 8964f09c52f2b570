/* oscar.h as a plain C11 include (declarations only), -Wall -Wextra -Werror. */
#include "oscar.h"

int oscar_test_uses_declarations(void);
int oscar_test_uses_declarations(void) {
    OSCAR__STRUCT(oscar_desc, desc);
    OSCAR__STRUCT(oscar_int2_pool_desc, pool);
    desc.backend = OSCAR_BACKEND_CPU;
    pool.head_dim = 128;
    return (int)desc.backend + pool.head_dim;
}
