"""``netcl config``, the ``NETCL_PROFILE`` setting and ``PYOPENCL_CTX`` in this process (the CLI
tests run the command in a subprocess, where the mutation run cannot see them): every package's
settings with their source, an invalid value flagged with its full message, each spelling of the
modes, a context variable matching no device answered with every device there is, the help
that names the exit codes and every command, and how ``main`` ends: no device, a reader gone
away, Ctrl-C."""

from __future__ import annotations

import json
from pathlib import Path

import pyopencl as cl
import pytest

from netcl.core import cli, device, settings

PROFILE_ERROR = (
    "NETCL_PROFILE='sometimes': expected 1 to turn profiling on for the default queue with "
    "every command's device time (or commands, the same), summary for one device time per "
    "replay, graph node and plan, or 0 for off (true/false, yes/no and on/off work too)"
)


def test_config_lists_every_package_and_flags_an_invalid_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NETCL_PROFILE", "sometimes")
    monkeypatch.setenv("NETCL_CACHE_MAX_BYTES", "2G")
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["config", "--json"]) == 1
    out = capsys.readouterr()
    docs = {d["name"]: d for d in json.loads(out.out)["settings"]}
    assert out.err == f"netcl config: {PROFILE_ERROR}\n"
    assert docs["NETCL_PROFILE"]["package"] == "netcl-core"
    assert docs["NETCL_PROFILE"]["error"] == PROFILE_ERROR
    cap = docs["NETCL_CACHE_MAX_BYTES"]
    assert (cap["package"], cap["value"], cap["source"], cap["error"]) == (
        "netcl-cache",
        "2G",
        "environment",
        None,
    )
    assert cli.main(["config"]) == 1
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["SETTING"] == ["SETTING", "VALUE", "SOURCE", "PACKAGE"]
    assert rows["NETCL_PROFILE"] == [
        "NETCL_PROFILE",
        "sometimes",
        "environment",
        "(INVALID)",
        "netcl-core",
    ]
    assert rows["NETCL_CACHE_MAX_BYTES"] == [
        "NETCL_CACHE_MAX_BYTES",
        "2G",
        "environment",
        "netcl-cache",
    ]


@pytest.mark.parametrize("value", ["commands", " Commands ", "summary", "SUMMARY"])
def test_each_spelling_of_a_profiling_mode_turns_profiling_on(
    value: str, ctx: cl.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETCL_PROFILE", value)
    if value.strip().lower() == "commands":
        assert device.default_queue(ctx) is device.default_queue(ctx, profiling=True)
    else:  # summary: read as such (what the default queue then is: test_profiling's tests)
        assert settings.PROFILE.value() == "summary"


def test_an_invalid_profile_value_is_refused_with_the_whole_message(
    ctx: cl.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETCL_PROFILE", "sometimes")
    with pytest.raises(ValueError) as info:
        device.default_queue(ctx)
    assert str(info.value) == PROFILE_ERROR


def test_a_context_variable_that_matches_nothing_lists_every_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYOPENCL_CTX", "99")
    listed = "; ".join(
        f"[{i}] {p.name.strip()}: "
        + ", ".join(f"[{i}:{j}] {d.name.strip()}" for j, d in enumerate(p.get_devices()))
        for i, p in enumerate(cl.get_platforms())
    )
    with pytest.raises(device.NoDeviceError) as info:
        device.pick_device()
    text = str(info.value)
    assert text.startswith("PYOPENCL_CTX='99' matches no OpenCL device (pyopencl: ")
    assert text.endswith(
        f"; OpenCL platforms and devices: {' '.join(listed.split())}; set PYOPENCL_CTX to a "
        "platform or platform:device index listed here (e.g. PYOPENCL_CTX=0), or unset it to "
        "let netcl choose"
    )


def test_help_names_the_exit_codes_and_every_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # one line per paragraph
    for argv, said in (
        (["config", "--help"], "Exit codes: 0 all valid, 1 a set value is invalid, 2 usage."),
        (["--help"], "the OpenCL program cache: stats, list, clear, zero, prune"),
    ):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 0
        assert said in " ".join(capsys.readouterr().out.split()), argv


def test_info_without_a_device_says_so_in_one_line_after_the_rest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PYOPENCL_CTX", "99")
    assert cli.main(["info"]) == 1
    out, err = capsys.readouterr()
    assert "default device: none\ncache dir: " in out
    assert err.startswith("netcl info: PYOPENCL_CTX='99' matches no OpenCL device")
    assert err.count("\n") == 1


class _Stream:
    """A stdout whose reader went away (every write and flush: BrokenPipeError, no descriptor),
    or a stderr that may be a terminal and keeps what it is given."""

    def __init__(self, *, broken: bool = False, tty: bool = False) -> None:
        self.broken, self.tty, self.text = broken, tty, ""

    def write(self, text: str) -> int:
        if self.broken:
            raise BrokenPipeError
        self.text += text
        return len(text)

    def flush(self) -> None:
        if self.broken:
            raise BrokenPipeError

    def isatty(self) -> bool:
        return self.tty


def test_a_reader_that_went_away_ends_the_command_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdout", _Stream(broken=True))
    err = _Stream()
    monkeypatch.setattr("sys.stderr", err)
    assert cli.main(["info"]) == 1
    assert err.text == ""


@pytest.mark.parametrize(
    ("tty", "said"), [(False, "netcl: interrupted\n"), (True, "\nnetcl: interrupted\n")]
)
def test_ctrl_c_is_one_line_and_exit_code_130(
    monkeypatch: pytest.MonkeyPatch, tty: bool, said: str
) -> None:
    def interrupted(argv: list[str]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", interrupted)
    err = _Stream(tty=tty)
    monkeypatch.setattr("sys.stderr", err)
    assert cli.main(["info"]) == 130
    assert err.text == said
    monkeypatch.setattr("sys.stdout", _Stream(broken=True))  # and with the reader gone too
    err.text = ""
    assert cli.main(["info"]) == 130
    assert err.text == said


def test_help_lists_each_command_with_what_it_does_and_a_missing_command_is_usage(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--version installed netcl distributions" in text
    assert "info OpenCL platforms and devices, netcl packages, cache location" in text
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err


def test_config_shows_a_secret_url_without_its_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NETCL_CACHE_REMOTE", "redis://:hunter2@cache.internal:6379/0")
    cli.main(["config", "--json"])
    docs = {d["name"]: d for d in json.loads(capsys.readouterr().out)["settings"]}
    assert docs["NETCL_CACHE_REMOTE"]["value"] == "redis://***@cache.internal:6379/0"


def _all_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment where every setting is unset or valid (the cache folder given)."""
    for setting in settings.SETTINGS:
        monkeypatch.delenv(setting.name, raising=False)
    monkeypatch.setenv("NETCL_CACHE_DIR", "/tmp/netcl-config-test")
    monkeypatch.setenv("NETCL_POOL_LIMIT", "50%")
    monkeypatch.setenv("COLUMNS", "300")


_TRACE_FILE_DOC = {
    "package": "netcl-core",
    "name": "NETCL_TRACE_FILE",
    "description": "file the chrome_trace span exporter writes (a Chrome/Perfetto timeline)",
    "default": "netcl-trace.json",
    "error": None,
    "value": "netcl-trace.json",
    "source": "default",
}


def test_config_with_every_value_valid_exits_0_with_the_whole_json_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``netcl config --json`` with nothing invalid: exit code 0, nothing on stderr, one JSON
    document indented by 2 whose core entries read name, value, source, default, package."""
    _all_valid(monkeypatch)
    assert cli.main(["config", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    document = json.loads(out)
    assert out == json.dumps(document, indent=2) + "\n"
    docs = {d["name"]: d for d in document["settings"]}
    assert list(docs)[:6] == [s.name for s in settings.SETTINGS]  # core's first, in order
    assert docs["NETCL_TRACE_FILE"] == _TRACE_FILE_DOC
    assert {k: docs["NETCL_POOL_LIMIT"][k] for k in ("value", "source", "default", "error")} == {
        "value": "50%",
        "source": "environment",
        "default": "0 (no limit)",
        "error": None,
    }
    assert docs["NETCL_CACHE_DIR"]["value"] == "/tmp/netcl-config-test"
    assert docs["NETCL_CACHE_MAX_BYTES"]["package"] == "netcl-cache"


def test_config_table_with_every_value_valid_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``netcl config`` with nothing invalid: exit code 0, a header, one aligned row per
    setting (no ``(INVALID)``), nothing on stderr."""
    _all_valid(monkeypatch)
    assert cli.main(["config"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert out.endswith("\n") and "(INVALID)" not in out
    column = lines[0].index("VALUE")
    assert lines[0].split() == ["SETTING", "VALUE", "SOURCE", "PACKAGE"]
    row = next(line for line in lines if line.startswith("NETCL_TRACE_FILE "))
    assert row[column:].split() == ["netcl-trace.json", "default", "netcl-core"]
    row = next(line for line in lines if line.startswith("NETCL_POOL_LIMIT "))
    assert row[column:].split() == ["50%", "environment", "netcl-core"]


def test_config_never_shows_a_secret_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A secret setting (the remote cache's signing key) shows as ``<hidden>`` in the JSON and
    the table; its value appears nowhere in the output."""
    _all_valid(monkeypatch)
    monkeypatch.setenv("NETCL_CACHE_REMOTE_KEY", "s3cr3t-signing-key")
    assert cli.main(["config", "--json"]) == 0
    out = capsys.readouterr().out
    docs = {d["name"]: d for d in json.loads(out)["settings"]}
    assert (docs["NETCL_CACHE_REMOTE_KEY"]["value"], docs["NETCL_CACHE_REMOTE_KEY"]["source"]) == (
        "<hidden>",
        "environment",
    )
    assert cli.main(["config"]) == 0
    out += capsys.readouterr().out
    assert "s3cr3t" not in out
    assert "NETCL_CACHE_REMOTE_KEY  " in out and " <hidden> " in out


def test_describe_gives_value_source_default_and_error_of_each_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ``netcl config`` shows of one setting: the default (text or computed) when unset or
    blank, the value as set otherwise, the parser's whole message when invalid, ``<hidden>``
    for a secret, and the display form of a value shown redacted."""
    check = settings.flag("NETCL_TEST_FLAG", "to test")
    plain = settings.Setting("NETCL_TEST_FLAG", "0", "a test flag", check)
    base = {"name": "NETCL_TEST_FLAG", "description": "a test flag", "default": "0"}
    monkeypatch.delenv("NETCL_TEST_FLAG", raising=False)
    assert settings.describe(plain) == {**base, "error": None, "value": "0", "source": "default"}
    monkeypatch.setenv("NETCL_TEST_FLAG", "  ")
    assert settings.describe(plain) == {**base, "error": None, "value": "0", "source": "default"}
    monkeypatch.setenv("NETCL_TEST_FLAG", "yes")
    assert settings.describe(plain) == {
        **base,
        "error": None,
        "value": "yes",
        "source": "environment",
    }
    monkeypatch.setenv("NETCL_TEST_FLAG", "maybe")
    assert settings.describe(plain) == {
        **base,
        "value": "maybe",
        "source": "environment",
        "error": "NETCL_TEST_FLAG='maybe': expected 1 to test or 0 for off (true/false, yes/no "
        "and on/off work too)",
    }
    computed = settings.Setting("NETCL_TEST_FLAG", lambda: "computed", "a test flag")
    monkeypatch.delenv("NETCL_TEST_FLAG")
    assert settings.describe(computed) == {
        **base,
        "default": "computed",
        "error": None,
        "value": "computed",
        "source": "default",
    }
    secret = settings.Setting("NETCL_TEST_FLAG", "(none)", "a test flag", secret=True)
    monkeypatch.setenv("NETCL_TEST_FLAG", "hunter2")
    assert settings.describe(secret) == {
        **base,
        "default": "(none)",
        "error": None,
        "value": "<hidden>",
        "source": "environment",
    }
    shown = settings.Setting("NETCL_TEST_FLAG", "0", "a test flag", shown=lambda raw: raw[:2])
    assert settings.describe(shown)["value"] == "hu"


class _ClosedStream:
    """A stream closed under the command: every write, flush and fileno raises ValueError
    (``I/O operation on closed file``; with ``error``, that instead), or, with ``fd``, fileno
    gives that descriptor."""

    def __init__(self, fd: int | None = None, error: Exception | None = None) -> None:
        self.fd, self.error = fd, error or ValueError("I/O operation on closed file")

    def write(self, text: str) -> int:
        raise self.error

    def flush(self) -> None:
        raise self.error

    def fileno(self) -> int:
        if self.fd is None:
            raise ValueError("I/O operation on closed file")
        return self.fd


@pytest.mark.parametrize("error", [ValueError("I/O operation on closed file"), BrokenPipeError()])
def test_ctrl_c_with_unusable_streams_still_exits_130(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    """Ctrl-C while stdout and stderr are closed, or their readers gone, ends with exit code
    130, not a traceback."""

    def interrupted(argv: list[str]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", interrupted)
    monkeypatch.setattr("sys.stdout", _ClosedStream(error=error))
    monkeypatch.setattr("sys.stderr", _ClosedStream(error=error))
    assert cli.main(["info"]) == 130


@pytest.mark.parametrize("fd", [None, -1])  # closed; a descriptor that cannot be reused
def test_a_reader_gone_with_an_unusable_stdout_still_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, fd: int | None
) -> None:
    """When the reader went away and stdout's descriptor cannot be pointed elsewhere, the
    command still ends with exit code 1 and nothing on stderr."""

    def gone(argv: list[str]) -> int:
        raise BrokenPipeError

    monkeypatch.setattr(cli, "_main", gone)
    monkeypatch.setattr("sys.stdout", _ClosedStream(fd))
    err = _Stream()
    monkeypatch.setattr("sys.stderr", err)
    assert cli.main(["info"]) == 1
    assert err.text == ""


def test_version_lists_the_netcl_distributions_or_says_none(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``netcl --version``: ``name version`` of each installed netcl distribution, one a line,
    exit code 0; with none installed (a source tree), ``netcl: none``."""
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == sorted(lines) and "netcl-core" in [line.split()[0] for line in lines]
    assert all(len(line.split()) == 2 and line.startswith("netcl-") for line in lines)
    monkeypatch.setattr(cli, "distributions", lambda: [])
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == "netcl: none\n"


@pytest.mark.parametrize("name", ["info", "config"])
def test_a_plugin_cannot_replace_a_built_in_command(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An installed ``netcl.cli`` entry point named like a built-in command is not loaded:
    the built-in runs, and nothing is reported about the plugin."""
    from importlib.metadata import EntryPoint, entry_points

    plugin = EntryPoint(name=name, value="netcl.core.no_such_module:register", group="netcl.cli")
    installed = [*entry_points(group="netcl.cli"), plugin]
    monkeypatch.setattr(cli, "entry_points", lambda group: installed)
    _all_valid(monkeypatch)
    with pytest.raises(SystemExit) as info:
        cli.main(["config", "--help"])
    assert info.value.code == 0
    assert "netcl: the" not in capsys.readouterr().err


_PLUGIN = """
from netcl.core.settings import Setting

SETTINGS = (Setting("NETCL_TEST_PLUGIN_LEVEL", "3", "how loud the test plugin is"),)


def register(sub):
    sub.add_parser("test-plugin", help="a plugin installed as a bare module")
"""


def test_config_lists_every_plugin_after_one_that_fails_to_load_in_name_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin whose module fails to load is reported on stderr, and the settings of every
    plugin after it (by entry-point name) are still listed; a plugin without distribution
    metadata is listed under its entry point's name."""
    from importlib.metadata import EntryPoint, entry_points

    (tmp_path / "netcl_test_plugin.py").write_text(_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    group = "netcl.cli"
    plugin = EntryPoint(name="zzz-plugin", value="netcl_test_plugin:register", group=group)
    broken = EntryPoint(name="aaa-broken", value="netcl_test_no_such_module:register", group=group)
    installed = [plugin, *entry_points(group=group), broken]  # not in name order
    monkeypatch.setattr(cli, "entry_points", lambda group: installed)
    _all_valid(monkeypatch)
    assert cli.main(["config", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "netcl: the 'aaa-broken' command failed to load: No module named "
        "'netcl_test_no_such_module'",
        "netcl config: the 'aaa-broken' settings failed to load: No module named "
        "'netcl_test_no_such_module'",
    ]
    docs = json.loads(out)["settings"]
    packages = list(dict.fromkeys(d["package"] for d in docs))  # in the order listed
    assert packages[0] == "netcl-core" and "netcl-cache" in packages
    assert packages[-1] == "zzz-plugin" and len(packages) == len({*packages})
    assert [d["package"] for d in docs] == sorted((d["package"] for d in docs), key=packages.index)
    assert docs[-1] == {
        "package": "zzz-plugin",
        "name": "NETCL_TEST_PLUGIN_LEVEL",
        "description": "how loud the test plugin is",
        "default": "3",
        "error": None,
        "value": "3",
        "source": "default",
    }
