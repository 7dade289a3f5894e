"""The event stream reaches a real Unix socket server, as the GPU worker's runner listens."""

import json
import shutil
import socket
import tempfile
import threading
from pathlib import Path

from tests.integration.harness.harness_projects import (
    project_env,
    run_project,
    validate,
    write_spec,
)


class Listener:
    """Accepts one connection and collects its bytes until the client closes."""

    def __init__(self, path):
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.server.settimeout(60)
        self.data = bytearray()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.server.accept()
        with conn:
            while chunk := conn.recv(65536):
                self.data.extend(chunk)

    def events(self, deadline_s=30):
        self.thread.join(deadline_s)
        assert not self.thread.is_alive(), "the experiment never closed its event stream"
        return [json.loads(line) for line in self.data.decode().splitlines()]


def test_events_reach_a_unix_socket_server(tmp_path):
    # a short directory: sun_path holds 107 bytes and pytest's tmp_path can be long
    short = Path(tempfile.mkdtemp(prefix="ev", dir="/tmp"))
    try:
        listener = Listener(short / "e.sock")
        spec = write_spec(tmp_path / "spec.json", "complex_contraction", "contraction")
        out = tmp_path / "result.json"
        env = project_env(
            AUTOPILOT_EVENTS=str(short / "e.sock"),
            AUTOPILOT_SPEC=str(spec),
            AUTOPILOT_RESULT=str(out),
        )
        done = run_project("complex_contraction", env=env)
        assert done.returncode == 0, done.stderr
        events = listener.events()
        listener.server.close()
    finally:
        shutil.rmtree(short)
    validate(json.loads(out.read_text()))
    assert events[0]["type"] == "started"
    assert events[-1] == {"type": "result", "status": "ok", "path": str(out)}
    progress = [e for e in events if e["type"] == "progress" and e["stage"] == "timing"]
    assert [(e["done"], e["total"]) for e in progress] == [(i, 5) for i in range(1, 6)]
    samples = [e for e in events if e["type"] == "sample"]
    assert samples[0]["variant"] == "gauss_3mult"
    assert len(samples[0]["a_ns"]) == 5
    assert any(e["type"] == "log" for e in events)
