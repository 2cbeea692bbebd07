import subprocess

from tests.support import FHMON


def test_demo_shows_a_handle_a_forgery_and_an_escape() -> None:
    out = subprocess.run([FHMON, "demo"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "running as uid 65534" in out.stdout
    assert "'hello from the share'" in out.stdout
    assert "one bit flipped)         -> ESTALE" in out.stdout
    assert "-> EACCES" in out.stdout
    assert '"reason":"bad or foreign MAC"' in out.stdout
