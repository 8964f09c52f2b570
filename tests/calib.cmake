# calibration tests (owned by the calibration work)
