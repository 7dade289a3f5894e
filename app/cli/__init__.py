"""The `autopilot` command: `main` assembles the command modules; `common` is their shared leaf."""
