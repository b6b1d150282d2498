"""The environment variables read as numbers, and $CQG_RAY_LOG: a bad value is one error line (exit 2), where each was
a traceback (CQG_RAY_PROGRESS_EVERY_S=abc in the middle of encode, after Ray had started)."""

import pytest

from cqg_ray.cli import main
from cqg_ray.config import ConfigError
from cqg_ray.env import env_seconds


def test_seconds_from_the_environment(monkeypatch):
    monkeypatch.delenv("CQG_RAY_X_S", raising=False)
    assert env_seconds("CQG_RAY_X_S", 25) == 25.0
    for raw, value in (("", 25.0), (" 2.5 ", 2.5), ("60", 60.0)):
        monkeypatch.setenv("CQG_RAY_X_S", raw)
        assert env_seconds("CQG_RAY_X_S", 25) == value
    for raw in ("abc", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("CQG_RAY_X_S", raw)
        with pytest.raises(ConfigError) as e:
            env_seconds("CQG_RAY_X_S", 25)
        assert str(e.value) == f"CQG_RAY_X_S={raw!r}: give a number of seconds above 0 (or unset it: 25)"


def test_the_lease_and_progress_read_theirs_checked(monkeypatch, tmp_path):
    from cqg_ray.lease import ttl_s
    from cqg_ray.progress import View

    monkeypatch.setenv("CQG_RAY_LEASE_TTL_S", "abc")
    with pytest.raises(ConfigError, match=r"^CQG_RAY_LEASE_TTL_S='abc': give a number of seconds above 0"):
        ttl_s()
    monkeypatch.setenv("CQG_RAY_PROGRESS_EVERY_S", "-1")
    with pytest.raises(ConfigError, match=r"^CQG_RAY_PROGRESS_EVERY_S='-1': give a number of seconds above 0"):
        View("encode", "text", 10, show=False)


def test_a_bad_log_level_in_the_environment_is_one_error_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("CQG_RAY_LOG", "verbose")
    assert main(["status", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: CQG_RAY_LOG='verbose': give one of DEBUG, INFO, WARNING, ERROR\n"
    monkeypatch.setenv("CQG_RAY_LOG", "warning")  # any case, as --log-level takes it
    assert main(["status", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.endswith(f"error: no run directory at {tmp_path / 'none'}\n")
    from cqg_ray.log import setup_logging

    setup_logging("INFO")  # the level the other tests in this process expect
