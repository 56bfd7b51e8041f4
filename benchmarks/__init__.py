"""dsh-tools benchmarks: pipeline cost against the physical limit and against peer frameworks.

Run ``python -m benchmarks`` (or ``nox -s bench``); ``--smoke`` for the CI
run, ``--only GROUP,...`` for a subset, ``--json FILE`` for every repeat,
``--profile`` for the hot-path profile. Groups, in run order, are listed in
:data:`GROUPS`; each is one module here with a ``cases(smoke)`` function.
"""

GROUPS = ("limit", "pipeline", "peers", "schemas", "scheduling", "scale", "code_mode")
"""Every benchmark group, in the order they run and are printed."""
