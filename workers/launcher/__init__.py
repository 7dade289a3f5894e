"""The safe experiment launcher: project venvs, the preflight guard, runtime dirs, the runner.

docs/design.md, "Lessons the runtime embodies": launch through the non-resolved
`<venv>/bin/python`, budget Unix
socket paths on the final path, and keep preparation off the GPU's demand path.
"""
