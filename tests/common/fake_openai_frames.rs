//! The fake server's streamed replies: the SSE frames of a reply as
//! OpenAI cuts them (and as Ollama does), and the body that writes them
//! one at a time, then ends, hangs or breaks the connection.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::{Value, json};

use super::{Flight, Reply};

fn pieces(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

/// The SSE frames of a reply: a role chunk, text fragments or tool-call
/// fragments (ids and names first, then the arguments of all calls
/// interleaved round-robin by index), the finish chunk, the usage chunk,
/// `[DONE]`. With `split`, each frame is cut in two writes mid-way.
pub fn stream_frames(
    reply: &Reply,
    model: &str,
    usage: Option<(u64, u64)>,
    fragment: usize,
    split: bool,
) -> Vec<Bytes> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
               "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    let finish = match reply {
        Reply::Text(t) => {
            for p in pieces(t, fragment) {
                events.push(chunk(json!({"content": p}), Value::Null));
            }
            "stop"
        }
        Reply::Calls(calls) => {
            for (i, (name, _)) in calls.iter().enumerate() {
                events.push(chunk(
                    json!({"tool_calls": [{"index": i, "id": format!("call_{i}"), "type": "function",
                                           "function": {"name": name, "arguments": ""}}]}),
                    Value::Null,
                ));
            }
            let frags: Vec<Vec<String>> = calls.iter().map(|(_, a)| pieces(a, fragment)).collect();
            let rounds = frags.iter().map(Vec::len).max().unwrap_or(0);
            for r in 0..rounds {
                for (i, f) in frags.iter().enumerate() {
                    if let Some(p) = f.get(r) {
                        events.push(chunk(
                            json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}),
                            Value::Null,
                        ));
                    }
                }
            }
            "tool_calls"
        }
        other => panic!("not a model reply: {other:?}"),
    };
    events.push(chunk(json!({}), Value::String(finish.into())));
    if let Some((p, c)) = usage {
        events.push(
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
            "model": model, "choices": [],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}),
        );
    }
    let mut frames: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    frames.push("data: [DONE]\n\n".to_owned());
    let mut out = Vec::new();
    for f in frames {
        let bytes = f.into_bytes();
        if split && bytes.len() > 1 {
            // Mid-way in bytes: may cut a UTF-8 character, as TCP may.
            let (a, b) = bytes.split_at(bytes.len() / 2);
            out.push(Bytes::copy_from_slice(a));
            out.push(Bytes::copy_from_slice(b));
        } else {
            out.push(Bytes::from(bytes));
        }
    }
    out
}

/// Ollama's stream of a tool-call reply: a role chunk, every call whole
/// (id, name and all its arguments) in one delta, then finish reason
/// "stop", usage and `[DONE]`.
pub(super) fn ollama_frames(calls: &[(String, String)], model: &str) -> Vec<Bytes> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-ollama", "object": "chat.completion.chunk", "created": 0,
               "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let whole: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{}", 100 + i), "index": i, "type": "function",
                   "function": {"name": name, "arguments": args}})
        })
        .collect();
    let events = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(
            json!({"role": "assistant", "content": "", "tool_calls": whole}),
            Value::Null,
        ),
        chunk(json!({"role": "assistant", "content": ""}), json!("stop")),
    ];
    let mut frames: Vec<Bytes> = events
        .iter()
        .map(|e| Bytes::from(format!("data: {e}\n\n")))
        .collect();
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames
}

/// How an SSE body ends after its frames.
pub(super) enum Tail {
    End,
    Hang,
    Break,
}

/// Streams `frames` one write at a time (yielding between them so each is
/// flushed on its own), then ends, hangs or breaks the connection. `flight`
/// lives in the body: it is dropped when the body ends or the client goes
/// away.
pub(super) fn sse_response(frames: Vec<Bytes>, flight: Flight, tail: Tail) -> Response {
    struct St {
        frames: std::vec::IntoIter<Bytes>,
        flight: Flight,
        tail: Tail,
    }
    let st = St {
        frames: frames.into_iter(),
        flight,
        tail,
    };
    let body = futures::stream::unfold(Some(st), |st| async move {
        let mut st = st?;
        tokio::task::yield_now().await;
        match st.frames.next() {
            Some(frame) => Some((Ok::<Bytes, std::io::Error>(frame), Some(st))),
            None => match st.tail {
                Tail::End => {
                    st.flight.done = true;
                    None
                }
                Tail::Hang => {
                    // Keep-alive comments until the client goes away: a
                    // write to a closed connection ends the body (and drops
                    // `flight`) even where the peer's close is not noticed.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Some((Ok(Bytes::from_static(b": ping\n\n")), Some(st)))
                }
                Tail::Break => Some((
                    Err(std::io::Error::other("fake server breaks the connection")),
                    None,
                )),
            },
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(body))
        .unwrap()
}
