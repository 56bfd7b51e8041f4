"""Suite-wide fixtures. pytest-trio's trio_mode is on (pyproject), so async tests need no marker.

The slow gate applies to every file: a ``@pytest.mark.slow`` test runs only when
``-m`` selects it, so ``pytest tests/test_x.py`` stays short too.
"""

from conftest_reliability import slow_gate

__all__ = ["slow_gate"]
