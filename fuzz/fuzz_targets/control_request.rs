//! Fuzzes the control API's request decoding: any method, path, query,
//! headers and body through the real router (a run's, and a server's with
//! a submitter). A refusal must be a typed JSON error; nothing panics.
#![no_main]

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;
use troupe::control::server::router;
use troupe::control::{Hosted, RunControl, Submission, Submitter};

struct Refusing;

impl Submitter for Refusing {
    fn submit(
        &self,
        _: Submission,
    ) -> futures::future::BoxFuture<'static, Result<String, (u16, serde_json::Value)>> {
        Box::pin(async { Err((422, serde_json::json!({"error": {"code": "Control/BadArgs", "message": "no"}}))) })
    }
    fn resume(
        &self,
        _: String,
        _: Submission,
    ) -> futures::future::BoxFuture<'static, Result<String, (u16, serde_json::Value)>> {
        self.submit(Submission { args: Vec::new(), cwd: None, client: String::new() })
    }
}

fn hosted() -> Arc<Hosted> {
    static HOSTED: OnceLock<Arc<Hosted>> = OnceLock::new();
    Arc::clone(HOSTED.get_or_init(|| {
        let hosted = Arc::new(Hosted::new(Some(Arc::new(Refusing))));
        hosted.add(Arc::new(RunControl::new(
            "r",
            "p",
            std::path::Path::new("/nonexistent/audit.jsonl"),
            None,
            Some(Arc::new(troupe::runtime::ask::QuestionDesk::default())),
        )));
        hosted
    }))
}

fuzz_target!(|input: (u8, String, Vec<(String, String)>, Vec<u8>)| {
    let (method, path, headers, body) = input;
    let method = ["GET", "POST", "PUT", "DELETE"][usize::from(method % 4)];
    let mut request = Request::builder().method(method).uri(&path);
    for (k, v) in &headers {
        request = request.header(k.as_str(), v.as_str());
    }
    let Ok(request) = request.body(Body::from(body)) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let response = router(hosted()).oneshot(request).await.unwrap();
        let status = response.status();
        let is_json = response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
        if status.is_client_error() || status.is_server_error() {
            assert!(is_json, "{status} without a typed error");
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert!(v["error"]["code"].as_str().unwrap().contains('/'));
        }
    });
});
