"""PR hosts: the forge interface, GitHub (PyGithub), the local forge and its smart-HTTP router."""
