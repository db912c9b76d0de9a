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

pub async fn page() -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            // The page runs its own script and talks to its own origin only.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        PAGE,
    )
        .into_response()
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
