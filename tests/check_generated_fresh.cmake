# Regenerates a committed generated file with its generator script (EMBED) and
# compares: the embedded kernel sources and the embedded shipped tuning tables.
# -DFRESH=<scratch output> -DCOMMITTED=<committed file> -DEMBED=<generator> -DINPUTS=<what it is made from>
execute_process(COMMAND ${CMAKE_COMMAND} -DOUT=${FRESH} -P ${EMBED} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EMBED} failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${FRESH} ${COMMITTED} RESULT_VARIABLE diff)
if(NOT diff EQUAL 0)
  message(FATAL_ERROR "${COMMITTED} is stale: ${INPUTS} changed since it was generated; "
                      "run `cmake -P ${EMBED}` and commit the result")
endif()
