"""Example policy plugins for dsh-tools.

Two entry points, configured and disabled independently:

* ``rate-limit`` (:mod:`dsh_example_policy.rate_limit`): a ``dsh_pre_execute``
  listener allowing at most ``max_calls`` calls per tool in any ``window_s``
  seconds.
* ``no-writes-outside-workspace`` (:mod:`dsh_example_policy.workspace`): a
  guard refusing calls whose path-like arguments resolve outside the workspace.
"""
