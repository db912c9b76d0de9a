//! The control API's client, for the CLI: HTTP/1.1 over the run's Unix
//! socket (reqwest's Unix-socket connector), typed errors for every way a
//! call can fail, and the SSE event stream read line by line.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use serde_json::Value;

use super::server::SOCKET_NAME;
use crate::error::{Code, ErrorClass, HasCode};

/// Why a control call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ControlError {
    pub code: &'static str,
    pub message: String,
}

impl ControlError {
    fn new(code: &'static str, message: impl Into<String>) -> ControlError {
        ControlError {
            code,
            message: message.into(),
        }
    }
}

impl HasCode for ControlError {
    fn code(&self) -> Code {
        Code {
            class: ErrorClass::Control,
            name: self.code,
        }
    }
}

/// The control socket of the run whose id starts with `run` under
/// `runs_dir` (ids are long: a prefix that picks one run will do).
pub fn find_socket(runs_dir: &Path, run: &str) -> Result<(String, PathBuf), ControlError> {
    let (id, dir) = find_run(runs_dir, run)?;
    let socket = dir.join(SOCKET_NAME);
    if socket.exists() {
        Ok((id, socket))
    } else {
        Err(ControlError::new(
            "NotServing",
            format!("run {id} is not running (no {SOCKET_NAME} in its folder)"),
        ))
    }
}

/// The folder of the run whose id starts with `run` under `runs_dir`.
pub fn find_run(runs_dir: &Path, run: &str) -> Result<(String, PathBuf), ControlError> {
    let entries = std::fs::read_dir(runs_dir).map_err(|e| {
        ControlError::new(
            "RunNotFound",
            format!("cannot read the runs folder {}: {e}", runs_dir.display()),
        )
    })?;
    let mut found: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(run).then(|| (name, e.path()))
        })
        .collect();
    found.sort();
    match found.len() {
        0 => Err(ControlError::new(
            "RunNotFound",
            format!("no run {run} in {}", runs_dir.display()),
        )),
        1 => Ok(found.remove(0)),
        n => Err(ControlError::new(
            "AmbiguousRun",
            format!("{n} runs start with {run}: give more of the id"),
        )),
    }
}

/// Percent-encodes one path segment: a proposal id holds `/` and `#`.
pub fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A client of one control socket.
#[derive(Debug, Clone)]
pub struct ControlClient {
    http: reqwest::Client,
    socket: PathBuf,
}

impl ControlClient {
    pub fn new(socket: &Path) -> Result<ControlClient, ControlError> {
        let http = reqwest::Client::builder()
            .unix_socket(socket.to_owned())
            .build()
            .map_err(|e| ControlError::new("ClientFailed", e.to_string()))?;
        Ok(ControlClient {
            http,
            socket: socket.to_owned(),
        })
    }

    fn url(path: &str) -> String {
        format!("http://troupe{path}")
    }

    fn unreachable(&self, e: &reqwest::Error) -> ControlError {
        ControlError::new(
            "Unreachable",
            format!(
                "cannot reach {} ({e}); is the run still running?",
                self.socket.display()
            ),
        )
    }

    /// Turns a response into its JSON, or the server's typed error.
    async fn json(&self, response: reqwest::Response) -> Result<Value, ControlError> {
        let ok = response.status().is_success();
        let body: Value = response.json().await.map_err(|e| {
            ControlError::new("BadReply", format!("the server's reply is not JSON: {e}"))
        })?;
        if ok {
            return Ok(body);
        }
        let code = body["error"]["code"].as_str().unwrap_or("Control/Failed");
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("the server refused");
        // The server's code is one of ours; keep its name.
        let name = match code.strip_prefix("Control/") {
            Some("RunNotFound") => "RunNotFound",
            Some("NotPending") => "NotPending",
            Some("NoRemoteAnswers") => "NoRemoteAnswers",
            Some("RunEnded") => "RunEnded",
            Some("BadBody") => "BadBody",
            Some("NotAsked") => "NotAsked",
            Some("AnswerInvalid") => "AnswerInvalid",
            _ => "Refused",
        };
        Err(ControlError::new(name, message.to_owned()))
    }

    async fn get(&self, path: &str) -> Result<Value, ControlError> {
        let r = self
            .http
            .get(Self::url(path))
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.json(r).await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, ControlError> {
        let r = self
            .http
            .post(Self::url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.json(r).await
    }

    pub async fn describe(&self, run: &str) -> Result<Value, ControlError> {
        self.get(&format!("/v1/runs/{run}")).await
    }

    pub async fn pending(&self, run: &str) -> Result<Vec<Value>, ControlError> {
        let v = self.get(&format!("/v1/runs/{run}/pending")).await?;
        Ok(v["pending"].as_array().cloned().unwrap_or_default())
    }

    pub async fn answer(
        &self,
        run: &str,
        proposal: &str,
        answer: &str,
        client: &str,
    ) -> Result<Value, ControlError> {
        let body = serde_json::json!({"answer": answer, "client": client});
        self.post(
            &format!("/v1/runs/{run}/pending/{}", encode_segment(proposal)),
            &body,
        )
        .await
    }

    pub async fn questions(&self, run: &str) -> Result<Vec<Value>, ControlError> {
        let v = self.get(&format!("/v1/runs/{run}/questions")).await?;
        Ok(v["questions"].as_array().cloned().unwrap_or_default())
    }

    pub async fn answer_question(
        &self,
        run: &str,
        execution: &str,
        content: &Value,
        client: &str,
    ) -> Result<Value, ControlError> {
        self.post(
            &format!(
                "/v1/runs/{run}/questions/{}?client={}",
                encode_segment(execution),
                encode_segment(client)
            ),
            content,
        )
        .await
    }

    pub async fn cancel(&self, run: &str) -> Result<Value, ControlError> {
        self.post(&format!("/v1/runs/{run}/cancel"), &Value::Null)
            .await
    }

    /// Streams the run's events after `from` to `each` (an audit line),
    /// until the run's `WorkflowExit` or the server goes away; `settled`
    /// is called after each batch that arrived together (flush there).
    pub async fn events(
        &self,
        run: &str,
        from: u64,
        mut each: impl FnMut(&str),
        mut settled: impl FnMut(),
    ) -> Result<(), ControlError> {
        let r = self
            .http
            .get(Self::url(&format!("/v1/runs/{run}/events?from={from}")))
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if !r.status().is_success() {
            return self.json(r).await.map(|_| ());
        }
        let mut body = r.bytes_stream();
        let mut buf = String::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.unreachable(&e))?;
            buf.push_str(&String::from_utf8_lossy(&chunk));
            // One SSE event per blank line; `data:` holds the audit line.
            // A cursor, then one drain per chunk (not one per event).
            let mut start = 0;
            while let Some(len) = buf[start..].find("\n\n") {
                for line in buf[start..start + len].lines() {
                    if let Some(data) = line.strip_prefix("data:") {
                        each(data.trim_start());
                    }
                }
                start += len + 2;
            }
            buf.drain(..start);
            settled();
        }
        Ok(())
    }
}
