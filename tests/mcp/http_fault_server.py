"""A Streamable HTTP MCP server for tests/mcp.rs that dies in the middle of
a call, written against the protocol itself so the death comes exactly
where a test wants it: after the call's SSE response has begun and sent
one event with an id (so a client may try to resume it), before its
answer.

It is as strict as the TypeScript SDK's servers: a POST must accept both
`application/json` and `text/event-stream` (406) and send JSON (415); the
first request of a session is `initialize`, and every later one carries
the `Mcp-Session-Id` it was given. An unknown or missing session is
answered 400, not 404, as `server-everything` does: the spec's 404 is the
signal a client's SDK re-initializes on, and real servers do not all send
it. A GET (the client's standalone stream, or its resumption of a cut
response) is 405 on a live session, 400 on an unknown one.

Usage: http_fault_server.py PORT STATS_FILE MODE
MODE `restart`: at the first `die` call the process re-executes itself
(same pid, every connection closed, every session forgotten) and serves
the same port again; the `die` calls after that answer. MODE `exit`: the
first `die` call ends the process. STATS_FILE receives one JSON line per
event (start, initialize, call, died, stale), so a test can see what the
server saw.

Tools: echo {text}; die {}."""

import http.server
import json
import os
import sys
import uuid

PORT = int(sys.argv[1])
STATS = sys.argv[2]
MODE = sys.argv[3]
SUPPORTED = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]
sessions = set()


def stat(**event):
    with open(STATS, "a") as f:
        f.write(json.dumps(event) + "\n")


def died_before():
    try:
        with open(STATS) as f:
            return any(json.loads(line)["event"] == "died" for line in f)
    except FileNotFoundError:
        return False


def tool(name, props):
    return {
        "name": name,
        "description": f"test tool {name}",
        "inputSchema": {"type": "object", "properties": props},
    }


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def plain(self, status, text=""):
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self, msg, session=None):
        body = json.dumps(msg).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if session:
            self.send_header("Mcp-Session-Id", session)
        self.end_headers()
        self.wfile.write(body)

    def known_session(self, method):
        session = self.headers.get("Mcp-Session-Id")
        if session in sessions:
            return True
        stat(event="stale", method=method)
        self.plain(400, "Bad Request: No valid session ID provided")
        return False

    def do_GET(self):
        if self.known_session("GET"):
            self.plain(405, "Method Not Allowed")

    def do_DELETE(self):
        if self.known_session("DELETE"):
            sessions.discard(self.headers.get("Mcp-Session-Id"))
            self.plain(200)

    def do_POST(self):
        accept = self.headers.get("Accept", "")
        if "application/json" not in accept or "text/event-stream" not in accept:
            return self.plain(406, "Not Acceptable: accept both application/json and text/event-stream")
        if not self.headers.get("Content-Type", "").startswith("application/json"):
            return self.plain(415, "Unsupported Media Type")
        length = int(self.headers.get("Content-Length", "0"))
        try:
            msg = json.loads(self.rfile.read(length))
        except ValueError:
            return self.plain(400, "Parse error")
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or "method" not in msg:
            if isinstance(msg, dict) and msg.get("jsonrpc") == "2.0" and "id" in msg:
                # A response to a request of ours: this server sends none.
                return self.plain(400, "unexpected response")
            return self.plain(400, "Invalid Request")
        method = msg["method"]
        if method == "initialize":
            if self.headers.get("Mcp-Session-Id"):
                return self.plain(400, "initialize carries no session")
            session = str(uuid.uuid4())
            sessions.add(session)
            asked = msg["params"]["protocolVersion"]
            stat(event="initialize", version=asked)
            return self.answer(
                {
                    "jsonrpc": "2.0",
                    "id": msg["id"],
                    "result": {
                        "protocolVersion": asked if asked in SUPPORTED else SUPPORTED[0],
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "http-fault", "version": "1"},
                    },
                },
                session,
            )
        if not self.known_session("POST"):
            return
        if "id" not in msg:
            # A notification (initialized, cancelled).
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if method == "ping":
            return self.answer({"jsonrpc": "2.0", "id": msg["id"], "result": {}})
        if method == "tools/list":
            tools = [tool("echo", {"text": {"type": "string"}}), tool("die", {})]
            return self.answer({"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": tools}})
        if method != "tools/call":
            return self.answer(
                {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "Method not found"}}
            )
        name = msg["params"]["name"]
        stat(event="call", tool=name)
        if name == "echo":
            text = msg["params"].get("arguments", {}).get("text", "")
        elif name == "die" and died_before():
            text = "survived"
        elif name == "die":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            note = {
                "jsonrpc": "2.0",
                "method": "notifications/message",
                "params": {"level": "info", "data": "about to die"},
            }
            self.wfile.write(f"id: e1\nevent: message\ndata: {json.dumps(note)}\n\n".encode())
            self.wfile.flush()
            stat(event="died")
            if MODE == "restart":
                # Every socket is close-on-exec: the connections end, and
                # the new image binds the port again.
                os.execv(sys.executable, [sys.executable] + sys.argv)
            os._exit(3)
        else:
            return self.answer(
                {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32602, "message": f"no tool {name}"}}
            )
        self.answer(
            {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "result": {"content": [{"type": "text", "text": text}], "isError": False},
            }
        )


class Server(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


stat(event="start", pid=os.getpid())
Server(("127.0.0.1", PORT), Handler).serve_forever()
