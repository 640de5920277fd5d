"""Closing the loop between the cost model and real runs: `validate` (predicted vs measured) and `calibrate`
(fit the cost model's factors from measured runs). docs/calibration.md."""
