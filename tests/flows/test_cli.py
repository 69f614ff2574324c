"""``specdec nightly run``: a malformed SPECDEC_NIGHTLY_* variable is a one-line error, exit 2."""

from typer.testing import CliRunner


def test_malformed_nightly_setting_is_a_clear_error(monkeypatch, tmp_path):
    from specdec.cli import app

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setenv("SPECDEC_NIGHTLY_BATCH_SIZE", "0")
    result = CliRunner().invoke(app, ["nightly", "run", "--pair", "x"])
    assert result.exit_code == 2
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "invalid nightly settings" in text and "batch_size" in text
    assert "Traceback" not in text
