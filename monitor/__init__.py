"""fhmon: a seccomp-notify monitor that performs file-handle syscalls for unprivileged targets."""

__version__ = "0.1.0"
