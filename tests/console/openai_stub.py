"""A stand-in for an OpenAI-compatible chat-completions API: the one mock of the console tests.

It listens on 127.0.0.1 (port 0), records every request (path, headers, JSON body) and answers
from a script: `reply(body) -> message` returns the assistant message ({"content", "tool_calls"}
in OpenAI's shape) for the conversation it was sent.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Stub:
    def __init__(self, reply):
        self.reply = reply
        self.requests = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                with stub.lock:
                    stub.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                if self.path.rstrip("/").endswith("/chat/completions") and isinstance(body, dict):
                    message = stub.reply(body)
                    if "_status" in message:
                        # The model's API failing: its status and error body as given.
                        return self.send(message["_status"], message["_body"])
                    answer = {
                        "id": f"chatcmpl-{len(stub.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "stub-model"),
                        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                    self.send(200, answer)
                else:
                    self.send(404, {"error": {"message": f"no route {self.path}"}})

            def send(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def chat_requests(self):
        with self.lock:
            return [r for r in self.requests if r["path"].rstrip("/").endswith("/chat/completions")]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def tool_call(call_id, name, arguments):
    """One tool call as OpenAI's API words it (arguments are a JSON string there)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
