"""Suite-wide fixtures. pytest-trio's trio_mode is on (pyproject), so async tests need no marker."""
