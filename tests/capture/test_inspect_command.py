"""``netcl capture inspect FILE``: the whole text a person reads (fields, then the programs
and buffers tables, aligned) and the whole JSON document, for a saved capture of eleven
programs (one built from a binary, so saved without its source), a saved step, a program saved
without a binary, and a file that cannot be read."""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

from netcl.core.table import human
from netcl.core.tensor import Tensor
from netcl.runtime.capture import (
    CaptureFileError,
    KernelCapture,
    _cli,
    _format,
    _saved,
    capture_step,
)

N = 16
PROGRAMS = 10  # from source; one more from a binary: eleven, so "#" is two characters wide


def _netcl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``netcl capture inspect ARGV`` as the ``netcl`` command registers it."""
    parser = argparse.ArgumentParser(prog="netcl")
    _cli.register(parser.add_subparsers())
    args = parser.parse_args(["capture", "inspect", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def _expected_text(doc: dict[str, Any], holds: str, launches: str) -> str:
    """The text for ``doc``: field labels padded to the longest, then the programs table with
    "#" and "binary" right-aligned, then the buffers table with "count" and "bytes"
    right-aligned; columns two spaces apart, no trailing spaces."""
    programs = doc["programs"]
    sizes = [human(p["binary_bytes"]) for p in programs]
    wi = max(1, *(len(str(i)) for i in range(len(programs))))
    wb = max(len("binary"), *(len(s) for s in sizes))
    wk = max(len("kernels"), *(len(", ".join(p["kernels"])) for p in programs))
    lines = [
        f"file      {doc['file']} ({human(doc['bytes'])}, format {doc['format_version']})",
        f"holds     {holds}",
        f"device    {doc['device']}",
        f"commands  {doc['commands']} ({launches})",
        "",
        "programs:",
        f"{'#':>{wi}}  {'binary':>{wb}}  source  {'kernels':<{wk}}".rstrip(),
    ]
    lines += [
        f"{i:>{wi}}  {size:>{wb}}  {'yes' if p['source'] else 'no ':<6}  "
        f"{', '.join(p['kernels'])}".rstrip()
        for i, (p, size) in enumerate(zip(programs, sizes, strict=True))
    ]
    roles = sorted(doc["buffers"].items())
    wr = max(len("role"), *(len(r) for r, _ in roles))
    wc = max(len("count"), *(len(str(b["count"])) for _, b in roles))
    wy = max(len("bytes"), *(len(human(b["bytes"])) for _, b in roles))
    lines += ["", "buffers:", f"{'role':<{wr}}  {'count':>{wc}}  {'bytes':>{wy}}"]
    lines += [f"{r:<{wr}}  {b['count']:>{wc}}  {human(b['bytes']):>{wy}}" for r, b in roles]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def eleven_programs(
    ctx: cl.Context, queue: cl.CommandQueue, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A saved capture: a launch of each of ten programs built from source (the last with a
    second kernel, launched too), one of a program built from the first one's binary, on two
    buffers (x and z, read: constants), and a copy of x to y (scratch): thirteen commands,
    twelve launches."""
    programs = [
        cl.Program(
            ctx,
            f"__kernel void k{i}(__global float *x) "
            f"{{ x[get_global_id(0)] += {i}.0f; }}"
            + (
                "__kernel void more(__global float *x) { x[0] = 1.0f; }"
                if i == PROGRAMS - 1
                else ""
            ),
        ).build()
        for i in range(PROGRAMS)
    ]
    (binary,) = programs[0].get_info(cl.program_info.BINARIES)
    programs.append(cl.Program(ctx, ctx.devices, [binary]).build())
    x, z = (
        cl.Buffer(
            ctx,
            cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
            hostbuf=np.zeros(N, np.float32),
        )
        for _ in range(2)
    )
    y = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * N)
    with KernelCapture() as cap:
        for i, prg in enumerate(programs):
            cl.Kernel(prg, f"k{i % PROGRAMS}")(queue, (N,), None, z if i == 1 else x)
            if i == PROGRAMS - 1:
                cl.Kernel(prg, "more")(queue, (1,), None, x)
        cl.enqueue_copy(queue, y, x)
    path = tmp_path_factory.mktemp("inspect") / "eleven.ncap"
    cap.save(path)
    return path


def test_inspect_prints_every_field_and_both_tables_aligned(
    eleven_programs: Path,
    queue: cl.CommandQueue,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The text for a capture of eleven programs: the fields, the programs by index (two
    digits, right-aligned under "#") with their binary's size, whether they have a source and
    their kernels, and the buffers by role."""
    monkeypatch.delenv("COLUMNS", raising=False)  # output to a pipe is never cut
    code, text, err = _netcl(capsys, str(eleven_programs))
    assert (code, err) == (0, "")
    doc = _saved.inspect(eleven_programs)
    kernels = [sorted(p["kernels"]) for p in doc["programs"]]
    assert kernels == [[f"k{i}"] for i in range(PROGRAMS - 1)] + [["k9", "more"], ["k0"]]
    assert doc["buffers"] == {
        "constant": {"count": 2, "bytes": 8 * N},
        "scratch": {"count": 1, "bytes": 4 * N},
    }
    assert [p["source"] for p in doc["programs"]] == [True] * PROGRAMS + [False]
    assert all(p["binary_bytes"] > 0 for p in doc["programs"])
    assert (doc["kind"], doc["name"], doc["commands"], doc["launches"]) == ("capture", None, 13, 12)
    assert doc["device"] == queue.device.name and doc["file"] == str(eleven_programs)
    assert text == _expected_text(doc, "a KernelCapture", "12 launches")
    lines = text.splitlines()
    at = lines.index("programs:")
    assert lines[at + 1].startswith(" #  ") and lines[at + 2].startswith(" 0  ")
    assert lines[at + 12].startswith("10  ") and lines[at + 12].split()[3:] == ["no", "k0"]


def test_inspect_json_is_the_whole_document(
    eleven_programs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json`` prints exactly the inspect document, indented by two and with sorted keys."""
    code, out, err = _netcl(capsys, str(eleven_programs), "--json")
    assert (code, err) == (0, "")
    doc = _saved.inspect(eleven_programs)
    assert out == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert sorted(doc) == [
        "buffers",
        "bytes",
        "commands",
        "device",
        "device_identity",
        "file",
        "format_version",
        "kind",
        "launches",
        "name",
        "programs",
        "sections",
    ]
    assert doc["bytes"] == eleven_programs.stat().st_size


def test_inspect_a_step_of_one_launch(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A saved step holds "a step (its name)", and one launch is "1 launch"; its buffers are an
    input and an output."""
    monkeypatch.delenv("COLUMNS", raising=False)
    kernel = cl.Kernel(
        cl.Program(
            ctx,
            "__kernel void twice(__global float *y, __global "
            "const float *x) { int i = get_global_id(0); y[i] = 2.0f * "
            "x[i]; }",
        ).build(),
        "twice",
    )

    @capture_step(name="twice-step")
    def twice(x: Tensor) -> Tensor:
        out = Tensor.empty(x.shape, np.float32, queue)
        kernel(queue, (N,), None, out.buffer, x.buffer)
        return out

    for _ in range(2):  # the warm-up, then the recording
        twice(Tensor.from_numpy(np.ones(N, np.float32), queue))
    path = tmp_path / "twice.ncl"
    twice.save(path)
    code, text, _ = _netcl(capsys, str(path))
    doc = _saved.inspect(path)
    assert (doc["kind"], doc["name"], doc["commands"], doc["launches"]) == (
        "step",
        "twice-step",
        1,
        1,
    )
    assert doc["buffers"] == {
        "input": {"count": 1, "bytes": 4 * N},
        "output": {"count": 1, "bytes": 4 * N},
    }
    assert code == 0 and text == _expected_text(doc, "a step (twice-step)", "1 launch")


def _without_binary(data: bytes) -> bytes:
    """``data`` with its first program's binary left out of the manifest (source only)."""
    _, _, _, offset, length, _ = _format.HEADER.unpack(data[: _format.HEADER.size])
    manifest = json.loads(data[offset : offset + length])
    manifest["programs"][0]["binary"] = None
    text = json.dumps(manifest).encode()
    head = _format.HEADER.pack(b"NETCLCAP", 2, 0, offset, len(text), zlib.crc32(text))
    return head + data[len(head) : offset] + text


def test_a_program_saved_without_a_binary_shows_0_bytes(
    eleven_programs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program with a source and no binary (a device that gave none) is 0 bytes of binary."""
    monkeypatch.delenv("COLUMNS", raising=False)
    path = tmp_path / "source-only.ncap"
    path.write_bytes(_without_binary(eleven_programs.read_bytes()))
    doc = _saved.inspect(path)
    assert [p["binary_bytes"] == 0 for p in doc["programs"]] == [True] + [False] * PROGRAMS
    code, text, _ = _netcl(capsys, str(path))
    assert code == 0 and text == _expected_text(doc, "a KernelCapture", "12 launches")
    # the binary column is as wide as this device's largest binary: "0 B" right-aligned in it
    width = max(len("binary"), *(len(human(p["binary_bytes"])) for p in doc["programs"]))
    assert f" 0  {'0 B':>{width}}  yes     k0" in text.splitlines()


def test_a_file_that_cannot_be_read_is_exit_code_1_with_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing file: exit code 1, the error on stderr after the command's name; with
    ``--json`` also one JSON document naming the file, the error and the exit code."""
    path = str(tmp_path / "missing.ncl")
    with pytest.raises(CaptureFileError) as caught:
        _saved.inspect(path)
    error = str(caught.value)
    assert path in error
    assert _netcl(capsys, path) == (1, "", f"netcl capture inspect: {error}\n")
    out = json.dumps({"file": path, "error": error, "exit_code": 1}) + "\n"
    assert _netcl(capsys, path, "--json") == (1, out, f"netcl capture inspect: {error}\n")


def test_help_tells_the_action_the_exit_codes_and_the_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``netcl --help``, ``netcl capture --help`` and ``netcl capture inspect --help`` say what
    each does; ``netcl capture`` without an action is a usage error (exit code 2)."""
    monkeypatch.setenv("COLUMNS", "200")
    parser = argparse.ArgumentParser(prog="netcl")
    _cli.register(parser.add_subparsers(dest="command"))

    def help_of(*argv: str) -> str:
        with pytest.raises(SystemExit) as done:
            parser.parse_args([*argv, "--help"])
        assert done.value.code == 0
        return " ".join(capsys.readouterr().out.split())

    assert " capture saved captures and steps: inspect " in help_of() + " "
    text = help_of("capture")
    assert text.startswith("usage: netcl capture [-h] ACTION ...")
    assert " ACTION ... Exit codes: 0 done, 1 the file cannot be read, 2 usage. " in text
    assert " inspect what a saved capture or step holds " in text + " "
    text = help_of("capture", "inspect")
    assert text.startswith("usage: netcl capture inspect [-h] [--json] FILE")
    assert " FILE device, programs, kernels, buffers by role, sizes positional arguments:" in text
    assert " --json print exactly one JSON document on stdout (messages go to stderr)" in text
    assert text.endswith("(messages go to stderr)")
    args = parser.parse_args(["capture", "inspect", "some.ncl", "--json"])
    assert (args.capture_command, args.file, args.json) == ("inspect", "some.ncl", True)
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["capture"])
    assert done.value.code == 2
    assert "the following arguments are required: ACTION" in capsys.readouterr().err
