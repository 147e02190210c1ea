"""The server half of each task: the initial model, the central evaluation and the run's summary.

:mod:`bouquet.serving.task` holds the :class:`~bouquet.serving.task.ServerTask` protocol and the work both
tasks share; :mod:`bouquet.serving.water` and :mod:`bouquet.serving.vision` are the two tasks' server halves.
The client halves are in :mod:`bouquet.tasks`.
"""
