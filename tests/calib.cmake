# calibration tests (owned by the calibration work): CPU suites run anywhere
# (fitting needs LAPACK at run time: liblapack3), the GPU suite skips without
# a device, the CLI suite drives tools/oscar_cli.c end to end.
oscar_add_suite(test_calib_cpu)
oscar_add_suite(test_calib_files)
oscar_add_suite(test_calib_quality)
oscar_add_suite(test_calib_gpu GPU)
# tools/ is added after tests/: OSCAR_BUILD_TOOLS may not be defined yet (its default is the main-project flag)
if(DEFINED OSCAR_BUILD_TOOLS)
  set(_oscar_calib_cli ${OSCAR_BUILD_TOOLS})
else()
  set(_oscar_calib_cli ${OSCAR_MAIN_PROJECT})
endif()
if(_oscar_calib_cli)
  oscar_add_suite(test_calib_cli)
  target_compile_definitions(test_calib_cli PRIVATE OSCAR_CLI_PATH="$<TARGET_FILE:oscar_cli>")
  add_dependencies(test_calib_cli oscar_cli)
endif()
