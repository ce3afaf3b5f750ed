"""The GPU kit (issue 49): the wheels a borrowed GPU machine lacks, and one unattended run
of every GPU part, each under its own budget (``python -m benchmarks.gpu_kit --help``).

    __main__.py   build the kit here; run it there (or as a dry run here)
    wheels.py     the wheel set: derived from Ferry's requirements, pinned, installed
    parts.py      the parts and their budgets
    runner.py     one part under its budget, its process tree killed on overrun
    preflight.py  the first part: versions, imports, the carried wheels' needs, a server
"""
