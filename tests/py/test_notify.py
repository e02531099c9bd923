"""`jobkit notify`: real apprise, posting JSON to a real HTTP receiver on 127.0.0.1."""

import os

import pytest
from click.testing import CliRunner
from webhook import Receiver

from jobkit.cli import main
from jobkit.core.errors import EXIT_ACTION_FAILED, EXIT_SETTINGS
from jobkit.ops import notify


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv(notify.ENV_URLS, raising=False)
    monkeypatch.delenv(notify.ENV_CONFIG, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def run(*args):
    return CliRunner().invoke(main, ["notify", *args])


def test_url_option_delivers_title_and_text(clean_env):
    with Receiver() as hook:
        result = run("job 42 finished", "--title", "tiny 2N", "--url", hook.url, "--level", "failure")
        posts = hook.wait(1)
    assert result.exit_code == 0, result.output
    assert "sent to 1 target(s) from --url" in result.output
    assert posts[0]["title"] == "tiny 2N"
    assert posts[0]["message"] == "job 42 finished"
    assert posts[0]["type"] == "failure"


def test_config_file_at_the_xdg_path_is_used_and_comments_skipped(clean_env):
    with Receiver() as hook, Receiver() as other:
        conf = clean_env / "config" / "jobkit" / "notify.conf"
        conf.parent.mkdir(parents=True)
        conf.write_text(f"# my targets\n{hook.url}\n\n  {other.url}  \n")
        conf.chmod(0o600)
        result = run("hello")
        assert result.exit_code == 0, result.output
        assert hook.wait(1)[0]["message"] == "hello"
        assert other.wait(1)[0]["message"] == "hello"
    assert f"sent to 2 target(s) from {conf}" in result.output


def test_env_urls_win_over_the_config_file(clean_env, monkeypatch):
    with Receiver() as hook, Receiver() as from_file:
        conf = clean_env / "notify.conf"
        conf.write_text(from_file.url + "\n")
        conf.chmod(0o600)
        monkeypatch.setenv(notify.ENV_CONFIG, str(conf))
        monkeypatch.setenv(notify.ENV_URLS, f"{hook.url}, ")
        result = run("via env")
        assert result.exit_code == 0, result.output
        assert hook.wait(1)[0]["message"] == "via env"
        assert from_file.posts == []


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o606])
def test_config_readable_by_others_is_refused_and_nothing_sent(clean_env, monkeypatch, mode):
    with Receiver() as hook:
        conf = clean_env / "notify.conf"
        conf.write_text(hook.url + "\n")
        conf.chmod(mode)
        monkeypatch.setenv(notify.ENV_CONFIG, str(conf))
        result = run("secret")
        assert hook.posts == []
    assert result.exit_code == EXIT_SETTINGS
    assert f"{conf} is readable or writable by others (mode {mode:03o})" in result.output
    assert f"chmod 600 {conf}" in result.output
    assert oct(os.stat(conf).st_mode & 0o777) == oct(mode)  # reported, never changed behind the user's back


def test_no_targets_names_every_place_to_put_them(clean_env):
    result = run("hi")
    assert result.exit_code == EXIT_SETTINGS
    assert str(clean_env / "config" / "jobkit" / "notify.conf") in result.output
    assert "$JOBKIT_NOTIFY_URLS" in result.output and "--url" in result.output


@pytest.mark.parametrize("content", [b"\xfc\x00\x13 binary", b"json://127.0.0.1:9/x\x00\n"])
def test_a_binary_config_file_is_one_line(clean_env, content):
    conf = clean_env / "config" / "jobkit" / "notify.conf"
    conf.parent.mkdir(parents=True)
    conf.write_bytes(content)
    conf.chmod(0o600)
    result = run("hi")
    assert result.exit_code == EXIT_SETTINGS
    assert result.output == (
        f"jobkit notify: {conf} is not a text file of apprise URLs; put one URL per line in it (or move it away)\n"
    )


def test_a_directory_where_the_config_file_goes_is_called_a_directory(clean_env):
    conf = clean_env / "config" / "jobkit" / "notify.conf"
    conf.mkdir(parents=True)
    result = run("hi")
    assert result.exit_code == EXIT_SETTINGS
    assert result.output == (
        f"jobkit notify: {conf} is a directory, not a file of apprise URLs; move it away and put the URLs in a "
        "file of that name (chmod 600), or set $JOBKIT_NOTIFY_CONFIG\n"
    )


def test_malformed_url_is_a_config_error(clean_env):
    result = run("hi", "--url", "not a url")
    assert result.exit_code == EXIT_SETTINGS
    assert "not a URL apprise knows" in result.output


def test_unreachable_and_failing_targets_each_get_one_line(clean_env):
    with Receiver(status=500) as broken, Receiver() as good:
        # A port nobody listens on: Receiver's port after it closed is the cheapest such port.
        with Receiver() as gone:
            dead = gone.url
        result = run("hi", "--url", dead, "--url", broken.url, "--url", good.url)
        assert good.wait(1)[0]["message"] == "hi"
    assert result.exit_code == EXIT_ACTION_FAILED
    lines = [line for line in result.output.splitlines() if "not delivered" in line]
    assert len(lines) == 2, result.output
    assert "Connection error" in lines[0]
    assert "500" in lines[1]


def test_secrets_in_urls_never_reach_the_messages(clean_env):
    result = run("hi", "--url", "json://user:s3cret@127.0.0.1:9/token123")
    assert result.exit_code == EXIT_ACTION_FAILED
    assert "s3cret" not in result.output and "token123" not in result.output
    assert "json:// #1: not delivered" in result.output
    assert "127.0.0.1" not in result.output  # the host is no business of the message either


def test_apprises_log_records_never_reach_the_processs_other_handlers(clean_env):
    """A root handler (absl's, a test runner's) would print apprise's records, whose text can hold the URL."""
    import io
    import logging

    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        result = run("hi", "--url", "json://user:s3cret@127.0.0.1:9/token123")
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    assert result.exit_code == EXIT_ACTION_FAILED
    assert "s3cret" not in seen.getvalue() and "token123" not in seen.getvalue(), seen.getvalue()


@pytest.mark.parametrize(
    "url",
    [
        "tgram://123456789:FAKEtgbot0000SECRET5/4242",
        "pbul://FAKEpushbullet0000SECRET24/",
        "join://FAKEjoinapikey0000SECRET25/group.all",
        "slack://T1FAKE0000SECRET26/B1FAKE/XXFAKE/#ops",
        "json://user:pw@127.0.0.1:9/FAKEpath0000SECRET",
    ],
)
def test_redact_names_the_scheme_and_position_only(url):
    # For tgram, pbul, join and slack the host is the token (audit row S6: the old redact kept the host).
    assert notify.redact(url, 2) == f"{url.split('://')[0]}:// #2"
    assert notify.redact("not a url", 1) == "<not a URL> #1"


def test_apprises_reason_loses_every_part_of_the_url():
    url = "tgram://123456789:FAKEtgbot0000SECRET5/4242"
    said = "Failed to send Telegram notification to 123456789:FAKEtgbot0000SECRET5: error 401"
    assert "0000SECRET" not in notify.scrub(said, url)
    assert notify.scrub(said, url).endswith("error 401")


def test_default_timeouts_are_added_only_where_missing():
    assert notify.with_timeouts("json://h/x") == "json://h/x?cto=4&rto=4"
    assert notify.with_timeouts("json://h/x?rto=30") == "json://h/x?rto=30&cto=4"
    assert notify.with_timeouts("json://h/x?cto=1&rto=2") == "json://h/x?cto=1&rto=2"
