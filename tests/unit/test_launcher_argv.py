"""What the launcher execs once fhmon serves: virtiofsd's own argv with the handle flags.

Asked of the native launcher: its hidden `served-argv` command prints what it would exec."""

from __future__ import annotations

import subprocess

from monitor import launcher
from monitor.launcher import Options


def served_argv(argv: list[str], options: Options) -> list[str]:
    flags = []
    if options.virtiofsd_handles is not None:
        flags.append(f"--virtiofsd-handles={options.virtiofsd_handles}")
    if options.migration_by_handle:
        flags.append("--virtiofsd-migration=file-handles")
    out = subprocess.run([str(launcher.NATIVE_LAUNCHER), "served-argv", *flags, "--", *argv],
                         capture_output=True, check=True, timeout=30).stdout
    assert out.endswith(b"\0")
    return [arg.decode() for arg in out[:-1].split(b"\0")]


KUBEVIRT = ["/usr/libexec/virtiofsd", "--socket-path=/s.sock", "--shared-dir=/disk",
            "--cache=auto", "--sandbox=none", "--migration-mode=find-paths",
            "--migration-on-error=guest-error"]


def test_nothing_asked_nothing_changed() -> None:
    assert served_argv(KUBEVIRT, Options()) == KUBEVIRT


def test_handles_added_and_replacing_any_given() -> None:
    argv = [*KUBEVIRT, "--inode-file-handles=never", "--inode-file-handles", "never", "-x"]
    assert served_argv(argv, Options(virtiofsd_handles="prefer")) == [
        *KUBEVIRT, "-x", "--inode-file-handles=prefer"]


def test_handles_go_last_so_a_loader_keeps_its_own_options_first() -> None:
    argv = ["/lib/ld.so", "--library-path", "/lib", "/usr/libexec/virtiofsd", "--xattr"]
    assert served_argv(argv, Options(virtiofsd_handles="prefer")) == [
        *argv, "--inode-file-handles=prefer"]


def test_migration_by_handle_only_where_a_mode_was_given() -> None:
    options = Options(virtiofsd_handles="mandatory", migration_by_handle=True)
    assert served_argv(KUBEVIRT, options) == [
        *["--migration-mode=file-handles" if a.startswith("--migration-mode") else a
          for a in KUBEVIRT], "--inode-file-handles=mandatory"]
    assert served_argv([*KUBEVIRT[:5], "--migration-mode", "find-paths"], options)[-2:] == \
        ["--migration-mode=file-handles", "--inode-file-handles=mandatory"]
    assert "--migration-mode=file-handles" not in served_argv(KUBEVIRT[:5], options)


def test_arguments_after_a_double_dash_are_left_alone() -> None:
    argv = ["cmd", "--", "--inode-file-handles=never", "--migration-mode=x"]
    assert served_argv(argv, Options(virtiofsd_handles="prefer", migration_by_handle=True)) \
        == ["cmd", "--inode-file-handles=prefer", "--", "--inode-file-handles=never",
            "--migration-mode=x"]  # before the "--"
