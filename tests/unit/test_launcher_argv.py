"""What the launcher execs once fhmon serves: virtiofsd's own argv with the handle flags."""

from __future__ import annotations

from monitor.launcher import Options, served_argv

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
