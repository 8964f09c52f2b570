# Installs oscar into a temporary prefix and builds a consumer against it
# with find_package(oscar CONFIG REQUIRED).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/consumer)
foreach(step
    "${CMAKE_COMMAND};-S;${SRC};-B;${WORK}/build;-DOSCAR_BUILD_TESTS=OFF;-DOSCAR_BUILD_BENCH=OFF;-DOSCAR_BUILD_EXAMPLES=OFF;-DOSCAR_INSTALL=ON;-DCMAKE_INSTALL_PREFIX=${WORK}/prefix"
    "${CMAKE_COMMAND};--install;${WORK}/build")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install step failed: ${step}")
  endif()
endforeach()
file(WRITE ${WORK}/consumer/CMakeLists.txt
"cmake_minimum_required(VERSION 3.20)\nproject(consumer C)\nfind_package(oscar CONFIG REQUIRED)\nadd_executable(consumer main.c)\ntarget_link_libraries(consumer PRIVATE oscar::oscar)\n")
file(WRITE ${WORK}/consumer/main.c
"#define OSCAR_IMPLEMENTATION\n#include <oscar.h>\nint main(void) {\n    oscar_desc d = {0};\n    oscar_ctx *ctx = 0;\n    d.backend = OSCAR_BACKEND_CPU;\n    if (oscar_setup(&d, &ctx) != OSCAR_OK) return 1;\n    oscar_shutdown(ctx);\n    return oscar_jit_instantiation_count() > 0 ? 0 : 2;\n}\n")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${WORK}/consumer -B ${WORK}/consumer/build -DCMAKE_PREFIX_PATH=${WORK}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer configure failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/consumer/build RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer build failed")
endif()
execute_process(COMMAND ${WORK}/consumer/build/consumer RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer run failed (${rc})")
endif()
