# Regenerates the embedded shipped tuning tables and compares with the committed file.
execute_process(COMMAND ${CMAKE_COMMAND} -DOUT=${FRESH} -P ${EMBED} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tune/embed_defaults.cmake failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${FRESH} ${COMMITTED} RESULT_VARIABLE diff)
if(NOT diff EQUAL 0)
  message(FATAL_ERROR "tune/oscar_tune_defaults.inc is stale: a tune/default_sm*.txt changed since it was generated; "
                      "run `cmake -P tune/embed_defaults.cmake` and commit the result")
endif()
