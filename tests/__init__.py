"""The test suite: unit/ (fast, no server), integration/ (real servers, trainers, the Hub stand-in), robustness/ (bad input, faults, kills)."""
