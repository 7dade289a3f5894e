"""The safe experiment launcher: project venvs, the preflight guard, runtime dirs, the runner.

DESIGN.md "Lessons" 1-3: launch through the non-resolved `<venv>/bin/python`, budget Unix
socket paths on the final path, and keep preparation off the GPU's demand path.
"""
