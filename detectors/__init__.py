"""stepguard detectors: pure, service-free detection logic."""
