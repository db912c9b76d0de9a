//! Who may use a server's TCP listener: a bearer token (`.troupe/token`,
//! mode 0600, made on first start), or for the dashboard a session got
//! through a one-time login link. The session is not a cookie: a browser
//! sends a cookie of `127.0.0.1` to every port of it, so any other local
//! web server the browser visited got the session, and with it the API
//! (found by review). The login page puts the session in the page's
//! `localStorage`, which is its origin's alone (the port included), and
//! the dashboard sends it as the `X-Troupe-Session` header, which no other
//! site's page can send here either. A state-changing request carried by
//! it must also say `X-Troupe-Csrf: 1` and, when it says its `Origin`,
//! come from the server's own. A session unused for [`SESSION_IDLE`] is
//! over, and `troupe dashboard` asks the server for a new login link,
//! which voids the last one. The dashboard's page itself (`GET /`) holds
//! nothing secret and is served to anyone who reaches the listener. The
//! Unix socket needs none of this: its mode (0600) is the check.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::reply::error;

/// The header the dashboard's session rides on.
const SESSION_HEADER: &str = "x-troupe-session";

/// How long a dashboard session lasts unused.
pub const SESSION_IDLE: Duration = Duration::from_secs(12 * 60 * 60);

/// The token and the dashboard's sessions.
#[derive(Debug)]
pub struct Auth {
    token: String,
    /// The login link's secret, good once.
    once: Mutex<Option<String>>,
    /// Each session's secret, with when it was last used.
    sessions: Mutex<HashMap<String, Instant>>,
}

/// 32 random bytes, hex.
pub fn random_hex() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The token in `path`, made (mode 0600) when there is none. A file
/// others may read is refused: the token would not be a secret.
pub fn load_or_make_token(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::metadata(path) {
        Ok(meta) => {
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(format!(
                    "{} may be read by others (mode {:o}): chmod 600 it",
                    path.display(),
                    meta.permissions().mode() & 0o777
                ));
            }
            let token = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let token = token.trim().to_owned();
            if token.len() < 16 {
                return Err(format!(
                    "{} holds no token (at least 16 characters)",
                    path.display()
                ));
            }
            Ok(token)
        }
        Err(_) => {
            let token = random_hex().map_err(|e| format!("cannot make a token: {e}"))?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            if let Err(e) = std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes()) {
                // Not left half written: the next start would call it a
                // file with no token, hiding why.
                let _ = std::fs::remove_file(path);
                return Err(format!("cannot write {}: {e}", path.display()));
            }
            Ok(token)
        }
    }
}

impl Auth {
    pub fn new(token: String) -> std::io::Result<Arc<Auth>> {
        Ok(Arc::new(Auth {
            token,
            once: Mutex::new(Some(random_hex()?)),
            sessions: Mutex::new(HashMap::new()),
        }))
    }

    /// The path of the one-time login link (`/login?once=…`); `None` once
    /// it was used.
    pub fn login_path(&self) -> Option<String> {
        self.once
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|once| format!("/login?once={once}"))
    }

    fn bearer_ok(&self, headers: &HeaderMap) -> bool {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| same(t.trim(), &self.token))
    }

    /// A new login link (its path), good once; the last one no longer is.
    pub fn fresh_login(&self) -> std::io::Result<String> {
        let once = random_hex()?;
        let path = format!("/login?once={once}");
        *self.once.lock().unwrap_or_else(PoisonError::into_inner) = Some(once);
        Ok(path)
    }

    /// Whether the request's session header names a session used within
    /// [`SESSION_IDLE`] (now used again); sessions past it are let go.
    fn session_ok(&self, headers: &HeaderMap) -> bool {
        let Some(id) = headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        self.session_at(id.trim(), Instant::now())
    }

    fn session_at(&self, id: &str, now: Instant) -> bool {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|_, used| now.saturating_duration_since(*used) < SESSION_IDLE);
        match sessions.get_mut(id) {
            Some(used) => {
                *used = now;
                true
            }
            None => false,
        }
    }

    /// Trades the login link's secret for a session, once: a page that
    /// keeps it in its origin's `localStorage` and goes to the dashboard.
    fn login(&self, query: Option<&str>) -> Response {
        let given = query
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("once=")))
            .unwrap_or_default();
        let mut once = self.once.lock().unwrap_or_else(PoisonError::into_inner);
        let good = once.as_deref().is_some_and(|o| same(given, o));
        if !good {
            return error(
                StatusCode::UNAUTHORIZED,
                "Control/Unauthorized",
                "this login link is not valid (it works once): `troupe dashboard` prints a new one, or send the token as a bearer",
            );
        }
        *once = None;
        let Ok(session) = random_hex() else {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Control/ServerError",
                "cannot make a session",
            );
        };
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(session.clone(), Instant::now());
        // The session is hex (`random_hex`): nothing in it needs escaping.
        // The page's script is a file of its own (`/login.js`): the policy
        // allows no inline script.
        let page = format!(
            "<!doctype html><meta charset=\"utf-8\"><title>troupe</title><meta name=\"troupe-session\" content=\"{session}\"><script src=\"/login.js\"></script>"
        );
        (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
                (header::REFERRER_POLICY, "no-referrer"),
                (
                    header::CONTENT_SECURITY_POLICY,
                    super::dashboard::LOGIN_POLICY,
                ),
            ],
            page,
        )
            .into_response()
    }
}

/// The TCP listener's gate: every request but the login link needs the
/// bearer token or a session; a session's state-changing requests need
/// the CSRF header and the server's own origin.
pub async fn gate(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    if request.uri().path() == "/login" {
        return auth.login(request.uri().query());
    }
    // The dashboard's page and its files: no data, its script asks for
    // that with the session.
    if super::dashboard::FILES.contains(&request.uri().path())
        && matches!(*request.method(), Method::GET | Method::HEAD)
    {
        return next.run(request).await;
    }
    let headers = request.headers();
    if auth.bearer_ok(headers) {
        return next.run(request).await;
    }
    if !auth.session_ok(headers) {
        let mut refused = error(
            StatusCode::UNAUTHORIZED,
            "Control/Unauthorized",
            "send `Authorization: Bearer <token>` (the token is in .troupe/token), or open the login link `troupe serve` printed",
        );
        refused.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
        return refused;
    }
    let safe = matches!(*request.method(), Method::GET | Method::HEAD);
    if !safe && !same_origin(headers) {
        return error(
            StatusCode::FORBIDDEN,
            "Control/CrossSite",
            "a state-changing request with the dashboard's session must send `X-Troupe-Csrf: 1` from the dashboard's own origin",
        );
    }
    next.run(request).await
}

/// `X-Troupe-Csrf: 1`, and an `Origin` (when sent) that is this host.
fn same_origin(headers: &HeaderMap) -> bool {
    let flagged = headers
        .get("x-troupe-csrf")
        .is_some_and(|v| v.as_bytes() == b"1");
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_ok = match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => host.is_some_and(|h| origin == format!("http://{h}")),
    };
    flagged && origin_ok
}

/// Compares secrets in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_compares_whole_secrets() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        assert!(!same("", "a"));
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        let made = load_or_make_token(&path).expect("made");
        assert_eq!(made.len(), 64);
        assert_eq!(load_or_make_token(&path).expect("read"), made);
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(
            load_or_make_token(&path)
                .expect_err("refused")
                .contains("chmod 600")
        );
    }

    #[test]
    fn a_session_unused_past_its_idle_time_is_over_and_a_new_link_voids_the_last() {
        let auth = Auth::new("t".repeat(64)).expect("auth");
        let first = auth.login_path().expect("a link");
        let start = Instant::now();
        auth.sessions
            .lock()
            .expect("lock")
            .insert("s".to_owned(), start);
        let later = start + SESSION_IDLE / 2;
        assert!(auth.session_at("s", later), "used within its idle time");
        assert!(
            auth.session_at("s", later + SESSION_IDLE / 2 + Duration::from_secs(1)),
            "its idle time counts from its last use"
        );
        assert!(
            !auth.session_at("s", later + SESSION_IDLE * 2),
            "unused past it"
        );
        assert!(auth.sessions.lock().expect("lock").is_empty(), "let go");
        assert!(!auth.session_at("nobody", start));

        let fresh = auth.fresh_login().expect("fresh");
        assert_ne!(fresh, first);
        assert_eq!(auth.login_path().as_deref(), Some(fresh.as_str()));
        let once = |path: &str| path.split_once("once=").map(|(_, o)| o.to_owned());
        let refused = auth.login(Some(&format!("once={}", once(&first).expect("once"))));
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let taken = auth.login(Some(&format!("once={}", once(&fresh).expect("once"))));
        assert_eq!(taken.status(), StatusCode::OK);
        assert!(
            taken.headers().get(header::SET_COOKIE).is_none(),
            "no cookie"
        );
    }

    #[test]
    fn the_csrf_check_wants_the_header_and_the_own_origin() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:7000".parse().expect("h"));
        assert!(!same_origin(&h));
        h.insert("x-troupe-csrf", "1".parse().expect("h"));
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, "http://evil.example".parse().expect("h"));
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, "http://127.0.0.1:7000".parse().expect("h"));
        assert!(same_origin(&h));
    }
}
