//! The dashboard `troupe serve` shows at `/`: one page embedded in the
//! binary (no CDN, no build step) that reads the control API the CLI uses:
//! the runs, a run's live counts, its failure, the timeline `troupe
//! report` draws, its pending approvals and questions (a form made from
//! each step's `fields`), and cancel.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::hosted::Hosted;
use super::reply::error;

const PAGE: &str = include_str!("dashboard.html");
const SCRIPT: &str = include_str!("dashboard.js");
const STYLE: &str = include_str!("dashboard.css");
/// The login page's script: it keeps the session the page names in this
/// origin's `localStorage` and goes to the dashboard.
const LOGIN_SCRIPT: &str = "\"use strict\";\n\
const kept = document.querySelector('meta[name=\"troupe-session\"]');\n\
if (kept) localStorage.setItem(\"troupe_session\", kept.content);\n\
location.replace(\"/\");\n";

/// The paths of the dashboard's files: served to anyone, like the page
/// itself (they hold no data; the script asks for that with the session).
pub const FILES: [&str; 4] = ["/", "/dashboard.js", "/dashboard.css", "/login.js"];

/// What the page may load and run: its own files, and no inline script
/// or style but the timeline's `<style>`, allowed by its hash. A run's
/// names reach the page in the timeline and in the API's answers; were
/// one of them ever to slip through as markup, it could neither run
/// script (which could read the session in `localStorage`) nor load
/// anything from elsewhere.
fn page_policy() -> &'static str {
    static POLICY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "default-src 'none'; script-src 'self'; style-src 'self' '{}'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            crate::report::svg_style_source()
        )
    });
    &POLICY
}

/// The login page's policy: its one script, from this origin.
pub const LOGIN_POLICY: &str = "default-src 'none'; script-src 'self'; base-uri 'none'";

pub async fn page() -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, page_policy()),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        PAGE,
    )
        .into_response()
}

/// A file of the page's: `GET /dashboard.js`, `/dashboard.css`, `/login.js`.
fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

pub async fn script() -> Response {
    file("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> Response {
    file("text/css; charset=utf-8", STYLE)
}

pub async fn login_script() -> Response {
    file("text/javascript; charset=utf-8", LOGIN_SCRIPT)
}

/// `GET /v1/runs/{id}/timeline.svg`: the run's timeline as `troupe report
/// --svg` draws it, from its log as far as it was written.
pub async fn timeline(State(hosted): State<Arc<Hosted>>, UrlPath(id): UrlPath<String>) -> Response {
    let run = match hosted.get(&id) {
        Ok(run) => run,
        Err((status, code, message)) => {
            return error(
                StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND),
                code,
                message,
            );
        }
    };
    let path = run.audit_path.clone();
    let drawn = tokio::task::spawn_blocking(move || {
        let file = crate::auditlog::DecodedReader::open(&path).map_err(|e| e.to_string())?;
        let timeline =
            crate::report::Timeline::from_audit(std::io::BufReader::with_capacity(1 << 16, file))
                .map_err(|e| e.to_string())?;
        let options = crate::report::SvgOptions {
            xmlns: false,
            ..crate::report::SvgOptions::default()
        };
        Ok::<_, String>(crate::report::render_svg(&timeline, &options))
    })
    .await;
    match drawn {
        Ok(Ok(svg)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "image/svg+xml")],
            svg,
        )
            .into_response(),
        Ok(Err(why)) => error(
            StatusCode::CONFLICT,
            "Control/NoTimeline",
            format!("the run's log cannot be drawn yet: {why}"),
        ),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Control/ServerError",
            "drawing the timeline failed",
        ),
    }
}
