"""The ``amux`` command line: its root (``cli``), Agent turns and Runtime workers
(``runtime_cli``), and ``doctor``. Each command is a composition root: it reads settings from
the environment and hands them down.
"""
