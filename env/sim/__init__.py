"""The simulated node: hardware model, app profiles, latency and interference model, load traces,
scenarios and the calibration against the papers' measurements."""
