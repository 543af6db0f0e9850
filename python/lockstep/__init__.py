"""Lockstep's pure-Python helpers for programs run in exec mode (`command:` in a TrainingJob).

Standard library only, no compiled parts: the agent puts this directory on the program's
PYTHONPATH, so `import lockstep.progress` works in any Python 3 interpreter of the image.

    from lockstep import progress
    progress.report(step=120, samples=7680, loss=loss, total_steps=600)
"""
