/* calib/oscar_calib_api.h -- public declarations of calibration and rotation
   files (included by oscar.h inside its extern "C" block). */
