# `oscar kernels cubin`: writes an instantiation's NVRTC cubin (an ELF file) under OUT, no GPU.
# cmake -DCLI=<oscar> -DOUT=<dir> -P check_kernels_cubin.cmake
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
execute_process(COMMAND "${CLI}" kernels cubin --out "${OUT}" --sm 90 "merge_states_kernel<128, 4>"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "oscar kernels cubin failed (${rc}): ${out}${err}")
endif()
set(cubin "${OUT}/oscar_merge_states_kernel_128_4.sm90.cubin")
if(NOT EXISTS "${cubin}")
  message(FATAL_ERROR "no ${cubin}; the tool said: ${out}")
endif()
file(READ "${cubin}" head LIMIT 4 HEX)
if(NOT head STREQUAL "7f454c46")
  message(FATAL_ERROR "${cubin} is not an ELF file (starts ${head})")
endif()
# a usage error without --out
execute_process(COMMAND "${CLI}" kernels cubin --sm 90 "merge_states_kernel<128, 4>" RESULT_VARIABLE rc2 OUTPUT_QUIET ERROR_QUIET)
if(NOT rc2 EQUAL 2)
  message(FATAL_ERROR "oscar kernels cubin without --out returned ${rc2}, expected 2 (usage)")
endif()
message(STATUS "${cubin}: ELF, ${out}")
