// oscar.h as a C++17 include (declarations only), -Wall -Wextra -Werror.
#include "oscar.h"

int oscar_test_uses_declarations_cxx();
int oscar_test_uses_declarations_cxx() {
    OSCAR__STRUCT(oscar_desc, desc);
    OSCAR__STRUCT(oscar_int2_pool_desc, pool);
    desc.backend = OSCAR_BACKEND_CPU;
    pool.head_dim = 128;
    return static_cast<int>(desc.backend) + pool.head_dim;
}
