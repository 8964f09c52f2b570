# The register budget behind session 40's placement cliff (docs/decode.md "Session 40"), checked with
# `oscar kernels resources` (NVRTC + ptxas, no GPU): under PDL the INT2 grid is placed while decode_prep's CTAs
# still hold their SMs, so a one-wave grid of two INT2 CTAs per SM stays balanced only where two 4-warp INT2 CTAs
# fit beside one 8-warp prep CTA in an SM's 65536 registers (at 160 + 100 registers 60 SMs took three and 68 one:
# 32 x 8K at 64 / 8 heads +12% on the H200). Registers are allocated per warp in units of 256.
# cmake -DCLI=<oscar> -P check_prep_coresidency.cmake
set(prep "decode_prep_kernel<128, 128, 8>")
set(int2_kernels "decode_int2_kernel<128, 128, 16, 8, 1>" "decode_int2_kernel<128, 128, 16, 8, 2>"
                 "decode_int2_kernel<128, 128, 16, 4, 1>" "decode_int2_kernel<128, 128, 16, 4, 2>")
execute_process(COMMAND "${CLI}" kernels resources --sm 90 "${prep}" ${int2_kernels}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "oscar kernels resources failed (${rc}): ${out}${err}")
endif()
function(regs_of name var)
  string(REPLACE "<" "\\<" pat "${name}")
  string(REPLACE ">" "\\>" pat "${pat}")
  if(NOT out MATCHES " +([0-9]+) +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+  oscar::${pat}")
    message(FATAL_ERROR "no resources row for ${name} in:\n${out}")
  endif()
  set(${var} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()
# registers one CTA of `warps` warps holds
function(cta_regs regs warps var)
  math(EXPR per_warp "((${regs} * 32 + 255) / 256) * 256")
  math(EXPR total "${per_warp} * ${warps}")
  set(${var} ${total} PARENT_SCOPE)
endfunction()
regs_of("${prep}" prep_regs)
cta_regs(${prep_regs} 8 prep_cta)
foreach(k IN LISTS int2_kernels)
  regs_of("${k}" r)
  cta_regs(${r} 4 int2_cta)
  math(EXPR used "2 * ${int2_cta} + ${prep_cta}")
  if(used GREATER 65536)
    message(FATAL_ERROR "${k} takes ${r} registers and ${prep} ${prep_regs}: two INT2 CTAs and a prep CTA need "
                        "${used} of an SM's 65536 registers, so one-wave INT2 grids are placed 3 / 1 per SM "
                        "(docs/decode.md \"Session 40\")")
  endif()
  message(STATUS "${k}: ${r} registers; two beside ${prep} (${prep_regs}): ${used} of 65536")
endforeach()
