"""Example policy plugins for dsh-tools.

Three entry points, configured and disabled independently:

* ``rate-limit`` (:mod:`dsh_example_policy.rate_limit`): a ``dsh_pre_execute``
  listener allowing at most ``max_calls`` calls per tool in any ``window_s``
  seconds.
* ``no-writes-outside-workspace`` (:mod:`dsh_example_policy.workspace`): a
  guard refusing calls whose path-like arguments resolve outside the workspace.
* ``tidy-paths`` (:mod:`dsh_example_policy.tidy_paths`): a ``dsh_pre_execute``
  listener that answers ``Rewrite`` to drop ``./`` segments and repeated
  slashes from path arguments that look like file-system paths (not URLs or
  code), so every policy re-decides on the tidy path. It takes the workspace
  guard's ``tools`` and ``path_keys`` settings.
"""
