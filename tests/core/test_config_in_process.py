"""``netcl config``, the ``NETCL_PROFILE`` setting and ``PYOPENCL_CTX`` in this process (the CLI
tests run the command in a subprocess, where the mutation run cannot see them): every package's
settings with their source, an invalid value flagged with its full message, each spelling of the
modes, a context variable matching no device answered with every device there is, the help
that names the exit codes and every command, and how ``main`` ends: no device, a reader gone
away, Ctrl-C."""

from __future__ import annotations

import json

import pyopencl as cl
import pytest

from netcl.core import _settings, cli, device

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
        "netcl-cache", "2G", "environment", None)  # fmt: skip
    assert cli.main(["config"]) == 1
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["SETTING"] == ["SETTING", "VALUE", "SOURCE", "PACKAGE"]
    assert rows["NETCL_PROFILE"] == ["NETCL_PROFILE", "sometimes", "environment", "(INVALID)",
                                     "netcl-core"]  # fmt: skip
    assert rows["NETCL_CACHE_MAX_BYTES"] == ["NETCL_CACHE_MAX_BYTES", "2G", "environment",
                                             "netcl-cache"]  # fmt: skip


@pytest.mark.parametrize("value", ["commands", " Commands ", "summary", "SUMMARY"])
def test_each_spelling_of_a_profiling_mode_turns_profiling_on(
    value: str, ctx: cl.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETCL_PROFILE", value)
    if value.strip().lower() == "commands":
        assert device.default_queue(ctx) is device.default_queue(ctx, profiling=True)
    else:  # summary: read as such (what the default queue then is: test_profiling's tests)
        assert _settings.PROFILE.value() == "summary"


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
    for argv, said in ((["config", "--help"], "Exit codes: 0 all valid, 1 a set value is invalid, "
                        "2 usage."),
                       (["--help"], "the OpenCL program cache: stats, list, clear, zero, prune")
                       ):  # fmt: skip
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


@pytest.mark.parametrize(("tty", "said"), [(False, "netcl: interrupted\n"),
                                            (True, "\nnetcl: interrupted\n")])  # fmt: skip
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
