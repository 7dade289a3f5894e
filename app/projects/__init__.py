"""Research projects: their repositories, API tokens and the autopilot.toml they declare."""
