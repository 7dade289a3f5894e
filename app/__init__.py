"""Research Autopilot: the control plane and domain core (workers import it, never the reverse)."""
