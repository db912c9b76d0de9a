//! An OTLP/HTTP receiver for tests, on the protocol's own messages and as
//! strict as a collector: protobuf bodies only, on `/v1/traces`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Collector {
    Accepts,
    Refuses,
    Hangs,
    /// Answers its first N posts 503 with `Retry-After: 0`, as a
    /// collector restarting or shedding load does, then accepts.
    Busy(usize),
    /// Accepts every post, but says in `partial_success` that it refused
    /// one span of each.
    RefusesOneSpanEach,
}

/// An OTLP/HTTP receiver on a port of its own; the spans it accepted.
pub struct Receiver {
    pub addr: String,
    pub spans: Arc<Mutex<Vec<Span>>>,
    pub services: Arc<Mutex<Vec<String>>>,
    /// The `x-probe` header of each post, for tests of the headers sent.
    pub probes: Arc<Mutex<Vec<String>>>,
    _rt: tokio::runtime::Runtime,
}

pub fn receiver(mode: Collector) -> Receiver {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let services: Arc<Mutex<Vec<String>>> = Arc::default();
    let probes: Arc<Mutex<Vec<String>>> = Arc::default();
    let (kept, named, probed) = (
        Arc::clone(&spans),
        Arc::clone(&services),
        Arc::clone(&probes),
    );
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let posts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (kept, named) = (Arc::clone(&kept), Arc::clone(&named));
            let post = posts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Some(probe) = headers.get("x-probe").and_then(|v| v.to_str().ok()) {
                probed.lock().unwrap().push(probe.to_owned());
            }
            async move {
                match mode {
                    Collector::Refuses => {
                        return (StatusCode::INTERNAL_SERVER_ERROR, HeaderMap::new(), Vec::new());
                    }
                    Collector::Busy(n) if post < n => {
                        let mut busy = HeaderMap::new();
                        busy.insert("retry-after", "0".parse().unwrap());
                        return (StatusCode::SERVICE_UNAVAILABLE, busy, Vec::new());
                    }
                    Collector::Hangs => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    Collector::Accepts | Collector::Busy(_) | Collector::RefusesOneSpanEach => {}
                }
                if headers.get("content-type").map(|v| v.as_bytes())
                    != Some(b"application/x-protobuf")
                {
                    return (StatusCode::UNSUPPORTED_MEDIA_TYPE, HeaderMap::new(), Vec::new());
                }
                let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                    return (StatusCode::BAD_REQUEST, HeaderMap::new(), Vec::new());
                };
                for rs in request.resource_spans {
                    for attr in rs.resource.map(|r| r.attributes).unwrap_or_default() {
                        if attr.key == "service.name"
                            && let Some(any_value::Value::StringValue(s)) =
                                attr.value.and_then(|v| v.value)
                        {
                            named.lock().unwrap().push(s);
                        }
                    }
                    for ss in rs.scope_spans {
                        kept.lock().unwrap().extend(ss.spans);
                    }
                }
                let mut answer = ExportTraceServiceResponse::default();
                if mode == Collector::RefusesOneSpanEach {
                    answer.partial_success = Some(
                        opentelemetry_proto::tonic::collector::trace::v1::ExportTracePartialSuccess {
                            rejected_spans: 1,
                            error_message: "one span too many".to_owned(),
                        },
                    );
                }
                (StatusCode::OK, HeaderMap::new(), answer.encode_to_vec())
            }
        }),
    );
    rt.spawn(async move { axum::serve(listener, app).await });
    Receiver {
        addr,
        spans,
        services,
        probes,
        _rt: rt,
    }
}

/// A span attribute's value as text.
pub fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            any_value::Value::IntValue(i) => Some(i.to_string()),
            any_value::Value::BoolValue(b) => Some(b.to_string()),
            _ => None,
        }
    })
}
