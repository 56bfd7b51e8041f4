"""First-party dsh-tools plugins, each discovered through the ``dsh`` entry-point group like any third-party one."""
