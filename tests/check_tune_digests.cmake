# oscar_tune --digests (no GPU needed): the shipped table reads as all current,
# and the same table with every src= digest replaced reads as stale (exit 3).
# -DTOOL=<oscar_tune> -DTABLE=<shipped table> -DSTALE=<scratch copy to write>
execute_process(COMMAND ${TOOL} --digests --table ${TABLE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "decode +[0-9a-f]+\n" OR NOT out MATCHES "decode +[1-9][0-9]* current, 0 stale"
   OR out MATCHES "[1-9][0-9]* stale")
  message(FATAL_ERROR "oscar_tune --digests --table ${TABLE}: exit ${rc}, expected 0 and no stale entry:\n${out}${err}")
endif()
file(READ ${TABLE} text)
string(REGEX REPLACE "src=[0-9a-f]+" "src=0000000000000000" text "${text}")
file(WRITE ${STALE} "${text}")
execute_process(COMMAND ${TOOL} --digests --table ${STALE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 3 OR NOT out MATCHES "decode +0 current, [1-9][0-9]* stale")
  message(FATAL_ERROR "oscar_tune --digests --table ${STALE}: exit ${rc}, expected 3 and every entry stale:\n${out}${err}")
endif()
execute_process(COMMAND ${TOOL} --digests --table ${STALE}.missing RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "cannot read")
  message(FATAL_ERROR "oscar_tune --digests on a missing table: exit ${rc}, expected 1 and a reason:\n${out}${err}")
endif()
