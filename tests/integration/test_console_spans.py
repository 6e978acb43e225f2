"""Console telemetry of a real failed OpenCL build: the multi-line build log stays on its span's
line, next to the ids and the error status."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def test_failed_build_keeps_one_line_per_span(tmp_path: Path) -> None:
    code = """
        import sys
        from netcl.core import telemetry
        from netcl.core.device import default_queue
        from netcl.runtime.cache import ProgramCache
        telemetry.configure(console=True)
        queue = default_queue()
        bad = "__kernel void k(__global float *a) {\\n  a[0] = undefined_name;\\n  }\\n"
        try:
            ProgramCache(cache_dir=sys.argv[1]).get_program(queue.context, bad, queue.device)
        except Exception as exc:
            print("raised", type(exc).__name__)
        telemetry.shutdown()
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0 and "raised" in proc.stdout, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    # the build log's lines exist only inside span lines (the OpenCL compiler itself may print a
    # summary such as "1 error generated." on stderr)
    logged = [ln for ln in lines if "undeclared identifier" in ln or "failed to build" in ln]
    assert logged and all(ln.startswith("span ") for ln in logged), proc.stderr
    (compile_line,) = [ln for ln in lines if ln.startswith("span netcl.cache.compile ")]
    (lookup_line,) = [ln for ln in lines if ln.startswith("span netcl.cache.get_program ")]
    assert " status=ERROR " in compile_line and 'netcl.compile.log="' in compile_line
    assert "undefined_name" in compile_line and "\\n" in compile_line
    lookup_id = lookup_line.split(" span_id=")[1].split()[0]
    assert f" parent_id={lookup_id} " in compile_line
