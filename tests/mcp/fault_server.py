"""An MCP server over stdio for tests/mcp.rs, written against the protocol
itself (JSON-RPC 2.0, one message per line) so that each fault can be
produced exactly. It is strict the way real servers are: the first request
must be `initialize`, no request is served before
`notifications/initialized`, and every message must be a JSON-RPC 2.0
object (anything else ends it, as a broken peer would).

Usage: fault_server.py STATS_FILE [MODE...]
Modes change startup: exit-at-start, slow-start, garbage-init,
wrong-version, bad-schema, paged (the listing comes in two pages),
same-cursor (every page says the same next cursor), endless-pages (every
page names a new next cursor); and
linger (stay alive after the input closes, as a careless server would).
STATS_FILE receives one JSON line per event (start, call, cancelled, end),
so a test can see what the server saw.

Tools: echo {text}; env {name} (says the variable's value); slow {ms}; hang {}; crash {}; fail {}; big {bytes};
changed {} (then the listing gains `extra`); extra {}; wait_for {n}
(answers once n `hang` calls are in flight); connect {port} (tries a TCP
connection to 127.0.0.1:port and says whether it got through)."""

import json
import os
import sys
import threading
import time

STATS = sys.argv[1]
MODES = set(sys.argv[2:])
SUPPORTED = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]

out_lock = threading.Lock()
# Answers to the requests this server sends the client (elicitations).
replies = {}
replies_lock = threading.Condition()
state_lock = threading.Condition()
inflight = 0
hanging = 0
changed = False


def stat(**event):
    with open(STATS, "a") as f:
        f.write(json.dumps(event) + "\n")


def send(msg):
    with out_lock:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def tool(name, props=None, required=()):
    return {
        "name": name,
        "description": f"test tool {name}",
        "inputSchema": {
            "type": "object",
            "properties": props or {},
            "required": list(required),
            "additionalProperties": False,
        },
    }


def tools():
    listed = [
        tool("echo", {"text": {"type": "string"}}, ["text"]),
        tool("env", {"name": {"type": "string"}}, ["name"]),
        tool("slow", {"ms": {"type": "integer", "minimum": 0}}, ["ms"]),
        tool("hang"),
        tool("crash"),
        tool("fail"),
        tool("big", {"bytes": {"type": "integer", "minimum": 1}}, ["bytes"]),
        tool("changed"),
        tool("wait_for", {"n": {"type": "integer", "minimum": 1}}, ["n"]),
        tool("connect", {"port": {"type": "integer"}}, ["port"]),
        tool("elicit"),
        tool("mixed"),
        tool("tasky"),
    ]
    if changed:
        listed.append(tool("extra"))
    if "bad-schema" in MODES:
        listed.append({"name": "broken", "inputSchema": {"type": "string"}})
        # A name MCP allows but no model's function names do.
        listed.append(tool("has.dot"))
        # Entries the SDK's own types refuse (which refused the whole
        # listing with them): no schema, a schema that is no object, a
        # hint that is no boolean (this one is offered all the same).
        listed.append({"name": "noschema", "description": "no inputSchema"})
        listed.append({"name": "strschema", "inputSchema": "string"})
        badhint = tool("badhint")
        badhint["annotations"] = {"readOnlyHint": "yes"}
        listed.append(badhint)
    return listed


def text(t, is_error=False):
    result = {"content": [{"type": "text", "text": t}]}
    if is_error:
        result["isError"] = True
    return result


def call(req_id, name, args):
    global inflight, hanging, changed
    with state_lock:
        inflight += 1
        stat(event="call", tool=name, inflight=inflight)
    result = None
    if name == "echo":
        result = text(args["text"])
    elif name == "env":
        # What a careless server says: its environment, in its result.
        value = os.environ.get(args["name"], "")
        result = {"content": [{"type": "text", "text": f"{args['name']}={value}"}],
                  "structuredContent": {"value": value}}
    elif name == "slow":
        time.sleep(args["ms"] / 1000)
        result = text(f"slept {args['ms']}ms")
    elif name == "hang":
        with state_lock:
            hanging += 1
            state_lock.notify_all()
        threading.Event().wait()  # never answers
    elif name == "crash":
        stat(event="crash")
        os._exit(3)
    elif name == "fail":
        result = text("the tool failed on purpose", is_error=True)
    elif name == "tasky":
        # A task where the call's result should be.
        result = {"resultType": "task", "task": {"taskId": "t1", "status": "working"}}
    elif name == "mixed":
        # A content block of a kind newer than the client knows.
        result = {"content": [{"type": "text", "text": "known"}, {"type": "hologram", "data": "x"}]}
    elif name == "big":
        result = text("x" * args["bytes"])
    elif name == "changed":
        changed = True
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        result = text("changed")
    elif name == "extra":
        result = {"content": [], "structuredContent": {"extra": True}}
    elif name == "connect":
        import socket
        try:
            socket.create_connection(("127.0.0.1", args["port"]), timeout=5).close()
            result = text("CONNECTED")
        except OSError as e:
            result = text(f"refused: {e}")
    elif name == "elicit":
        ask = f"elicit-{req_id}"
        send({"jsonrpc": "2.0", "id": ask, "method": "elicitation/create", "params": {
            "mode": "form",
            "message": "Who is asking?",
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        }})
        with replies_lock:
            replies_lock.wait_for(lambda: ask in replies)
            reply = replies.pop(ask)
        r = reply.get("result") or {}
        if r.get("action") == "accept":
            result = text("got: " + json.dumps(r.get("content"), sort_keys=True))
        else:
            result = text(f"no answer: {r.get('action') or reply.get('error')}")
    elif name == "wait_for":
        with state_lock:
            state_lock.wait_for(lambda: hanging >= args["n"])
        result = text(f"{hanging} hanging")
    # Out of flight before the answer leaves: the client may send the
    # next call as soon as it reads it.
    with state_lock:
        inflight -= 1
    if result is None:
        send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32602, "message": f"unknown tool {name}"}})
    else:
        send({"jsonrpc": "2.0", "id": req_id, "result": result})


def fail(req_id, code, message):
    send({"jsonrpc": "2.0", "id": req_id, "error": {"code": code, "message": message}})


def main():
    stat(event="start", pid=os.getpid())
    if "exit-at-start" in MODES:
        print("fault_server: exiting at start on purpose", file=sys.stderr)
        sys.exit(1)
    if "slow-start" in MODES:
        time.sleep(30)
    if "brief-start" in MODES:
        time.sleep(2)
    initialized = False
    initialize_seen = False
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            print(f"fault_server: not JSON: {line!r}", file=sys.stderr)
            sys.exit(2)
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            print(f"fault_server: not JSON-RPC 2.0: {line!r}", file=sys.stderr)
            sys.exit(2)
        method = msg.get("method")
        req_id = msg.get("id")
        if method is None and req_id is not None and ("result" in msg or "error" in msg):
            with replies_lock:
                replies[req_id] = msg
                replies_lock.notify_all()
            continue
        if method == "initialize":
            initialize_seen = True
            if "garbage-init" in MODES:
                sys.stdout.write("this is not JSON-RPC\n")
                sys.stdout.flush()
                continue
            asked = msg["params"]["protocolVersion"]
            version = asked if asked in SUPPORTED else SUPPORTED[0]
            if "wrong-version" in MODES:
                version = "1999-01-01"
            send({
                "jsonrpc": "2.0",
                "id": req_id,
                "result": {
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": True}},
                    "serverInfo": {"name": "fault-server", "version": "1.0.0"},
                },
            })
        elif not initialize_seen:
            fail(req_id, -32002, "initialize first")
        elif method == "notifications/initialized":
            initialized = True
        elif method == "notifications/cancelled":
            stat(event="cancelled", request=msg["params"].get("requestId"))
        elif req_id is None:
            pass  # other notifications
        elif not initialized:
            fail(req_id, -32002, "not initialized")
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": req_id, "result": {}})
        elif method == "tools/list":
            listed = tools()
            cursor = (msg.get("params") or {}).get("cursor")
            if "same-cursor" in MODES:
                send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": listed[:1], "nextCursor": "again"}})
            elif "endless-pages" in MODES:
                page = int(cursor or "0") + 1
                send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": listed[:1], "nextCursor": str(page)}})
            elif "paged" in MODES and cursor is None:
                send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": listed[:3], "nextCursor": "page2"}})
            elif "paged" in MODES:
                send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": listed[3:]}})
            else:
                send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": listed}})
        elif method == "tools/call":
            params = msg.get("params") or {}
            threading.Thread(
                target=call,
                args=(req_id, params.get("name"), params.get("arguments") or {}),
                daemon=True,
            ).start()
        else:
            fail(req_id, -32601, f"method not found: {method}")
    stat(event="end")
    if "linger" in MODES:
        # A server that outlives its input: only a kill ends it.
        time.sleep(3600)


main()
