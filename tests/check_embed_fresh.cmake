# Regenerates the embedded kernel sources and compares with the committed file.
execute_process(COMMAND ${CMAKE_COMMAND} -DOUT=${FRESH} -P ${EMBED} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "embed.cmake failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${FRESH} ${COMMITTED} RESULT_VARIABLE diff)
if(NOT diff EQUAL 0)
  message(FATAL_ERROR "oscar_kernels/oscar_kernels.inc is stale: a .cuh changed since it was generated; "
                      "run `cmake -P oscar_kernels/embed.cmake` and commit the result")
endif()
