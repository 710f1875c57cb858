"""The long-running services: each a thin loop that decodes, verifies, calls a pure
core and publishes (``stepguard <service>``)."""
