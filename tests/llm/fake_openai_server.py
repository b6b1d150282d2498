"""A tiny OpenAI-compatible chat server (stdlib http.server on 127.0.0.1) that can misbehave on cue.

    with FakeOpenAIServer(script=["500", "429", "ok"]) as srv:   # then every later request: "ok"
        srv.base_url  -> "http://127.0.0.1:<port>/v1"
        srv.requests  -> every JSON body received, in order (failures included)

Behaviours: "ok"; "500" / "503" / "429" / "400" / "404" (status with a JSON error; 429 sends Retry-After
when ``retry_after`` is set); "hang:<s>" (sleep s seconds, then answer ok); "close" (drop the connection
without a reply); "garbage" (200 with a body that is not a chat completion). Answers are deterministic:
for an A.3 prompt with n questions, "i. yes|no" lines from a hash of the prompt; a prompt with "LOOP" in it, a list
of two questions repeated 30 times; otherwise three questions. A request with ``stream: true`` is answered as a
server-sent event stream, a chunk a word (``stream_delay_s`` apart), then the usage where ``stream_options`` asks;
``streams`` records (chunks sent, chunks in the reply) per stream, sent < all where the client closed it early;
"nostream" answers one JSON reply all the same, "cut" stops a stream halfway (no finish_reason, no [DONE]),
"streamerror" fails it halfway as vLLM's server does when its engine fails after the 200 (an ``error`` event, then [DONE]).
With ``max_model_len`` set it also answers like vLLM's ``GET /v1/models`` (the model's ``max_model_len``) and
``POST /tokenize`` (``count``: prompt characters / 4 + 10); without it both are 404, as on a server without them.
Also runnable as a script for subprocess tests: ``python fake_openai_server.py PORT_FILE LOG_FILE [DELAY_S]``.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def reply_for(prompt: str) -> str:
    if "\nQuestions:\n" in prompt:
        block = prompt.split("\nQuestions:\n", 1)[1].split("\n\n", 1)[0]
        n = sum(1 for line in block.splitlines() if re.match(r"\d+\. ", line))
        out = []
        for i in range(1, n + 1):
            bit = hashlib.sha256(f"{prompt}\x00{i}".encode()).digest()[0] & 1
            out.append(f"{i}. {'yes' if bit else 'no'}")
        return "\n".join(out) + "\n"
    if "LOOP" in prompt:
        return "\n".join(f"{i}. Is the text about {'a movie' if i % 2 else 'a comedy'}?" for i in range(1, 61)) + "\n"
    tag = hashlib.sha256(prompt.encode()).hexdigest()[:6]
    return "\n".join(f"{i}. Does the text mention topic {tag}-{i}?" for i in range(1, 4)) + "\n"


class FakeOpenAIServer:
    def __init__(self, script: list[str] | None = None, delay_s: float = 0.0, retry_after: str | None = None, log_path: str | None = None, port: int = 0,
                 max_model_len: int | None = None, stream_delay_s: float = 0.002):
        self.script = list(script or [])
        self.stream_delay_s = stream_delay_s
        self.streams: list[tuple[int, int]] = []
        self.max_model_len = max_model_len
        self.tokenize_calls = 0
        self.delay_s = delay_s
        self.retry_after = retry_after
        self.log_path = log_path
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.inflight = 0
        self.max_inflight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, obj, extra_headers: dict | None = None):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra_headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models" and server.max_model_len:
                    self._send(200, {"object": "list", "data": [{"id": "local", "object": "model", "max_model_len": server.max_model_len}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/tokenize":
                    if not server.max_model_len:
                        self._send(404, {"error": {"message": "not found"}})
                        return
                    server.tokenize_calls += 1
                    chars = sum(len(m["content"]) for m in body["messages"])
                    self._send(200, {"count": chars // 4 + 10, "max_model_len": server.max_model_len, "tokens": []})
                    return
                with server.lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    action = server.script.pop(0) if server.script else "ok"
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                    if server.log_path:
                        with open(server.log_path, "a") as f:
                            f.write(json.dumps({"action": action, "prompt": body["messages"][-1]["content"]}) + "\n")
                try:
                    server.act(self, action, body)
                finally:
                    with server.lock:
                        server.inflight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def act(self, h, action: str, body: dict) -> None:
        if action.startswith("hang:"):
            time.sleep(float(action.split(":", 1)[1]))
            action = "ok"
        if action == "close":
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if action == "garbage":
            h._send(200, {"unexpected": True})
            return
        if action.isdigit():
            extra = {"Retry-After": self.retry_after} if action == "429" and self.retry_after else None
            h._send(int(action), {"error": {"message": f"scripted {action}", "type": "test"}}, extra)
            return
        if self.delay_s:
            time.sleep(self.delay_s)
        prompt = body["messages"][-1]["content"]
        text = reply_for(prompt)
        if body.get("stream") and action != "nostream":
            self.stream(h, text, len(prompt) // 4, (body.get("stream_options") or {}).get("include_usage", False), cut=action == "cut",
                        error=action == "streamerror")
            return
        h._send(
            200,
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4, "total_tokens": len(prompt) // 4 + len(text) // 4},
            },
        )

    def stream(self, h, text: str, prompt_tokens: int, usage: bool, cut: bool = False, error: bool = False) -> None:
        """``text`` as chat completion chunks, a word each (the last with finish_reason stop), then the usage chunk
        (where asked) and [DONE]; a client that closes the stream early ends it (recorded in ``streams``); ``cut``:
        the first half of the chunks only; ``error``: the first half, then vLLM's error event (its words, from vLLM
        0.32 with its engine core killed mid-stream) and [DONE]."""
        pieces = re.findall(r"\S+\s*|\s+", text)
        events = [{"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
        events[-1]["choices"][0]["finish_reason"] = "stop"
        if cut or error:
            events = events[: len(events) // 2]
        if error:
            events.append({"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                                     "type": "InternalServerError", "param": None, "code": 500}})
        if usage and not (cut or error):
            events.append({"object": "chat.completion.chunk", "choices": [],
                           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(pieces), "total_tokens": prompt_tokens + len(pieces)}})
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        sent = 0
        try:
            for e in [*(json.dumps(e) for e in events), *([] if cut else ["[DONE]"])]:
                h.wfile.write(f"data: {e}\n\n".encode())
                h.wfile.flush()
                sent += 1
                time.sleep(self.stream_delay_s)
        except OSError:  # the client closed the stream
            pass
        with self.lock:
            self.streams.append((min(sent, len(pieces)), len(pieces)))

    def __enter__(self) -> "FakeOpenAIServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    port_file, log_file = sys.argv[1], sys.argv[2]
    delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    with FakeOpenAIServer(delay_s=delay, log_path=log_file) as srv:
        with open(port_file + ".tmp", "w") as f:
            f.write(str(srv.port))
        import os

        os.replace(port_file + ".tmp", port_file)
        while True:
            time.sleep(3600)
