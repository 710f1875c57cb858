"""Step-time detectors: peers, ranks, slowdowns, long steps, first steps, temporal baselines."""
