"""Git work (GitPython) and pull-request hosts: GitHub (PyGithub) and a local forge."""
