/* calib/oscar_calib.h -- part of the oscar.h implementation: calibration and
   rotation files. */
#ifndef OSCAR_CALIB_H_INCLUDED
#define OSCAR_CALIB_H_INCLUDED
OSCAR__PRIVATE void oscar__registry_build_calib(void) {}
#endif
