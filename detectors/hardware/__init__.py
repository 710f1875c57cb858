"""Hardware: GPU health rules and state, links, NIC flaps."""
