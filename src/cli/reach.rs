//! Where a client command finds a `troupe serve`: `--server`, else
//! `$TROUPE_SERVER`, else the project's socket beside the runs folder.

use std::path::{Path, PathBuf};

use crate::control::client::Target;

/// The server socket's name beside the runs folder.
pub const SERVER_SOCKET: &str = "troupe.sock";

/// The project's server socket for `runs_dir`: `troupe.sock` beside it.
pub fn project_socket(runs_dir: &Path) -> PathBuf {
    runs_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join(SERVER_SOCKET)
}

/// The server a client command should use: `--server`, else
/// `$TROUPE_SERVER`, else the project's socket when a server answers
/// there. A TCP server's token is `$TROUPE_TOKEN`, else `.troupe/token`.
pub fn server_for(
    explicit: Option<&str>,
    runs_dir: &Path,
) -> Result<Option<Target>, crate::control::ControlError> {
    let named = explicit
        .map(str::to_owned)
        .or_else(|| crate::environ::var("TROUPE_SERVER").filter(|s| !s.is_empty()));
    let token = || {
        crate::environ::var("TROUPE_TOKEN").or_else(|| {
            let file = project_socket(runs_dir).with_file_name("token");
            std::fs::read_to_string(file)
                .ok()
                .map(|t| t.trim().to_owned())
        })
    };
    match named {
        Some(text) => Target::parse(&text, token()).map(Some),
        None => {
            let socket = project_socket(runs_dir);
            Ok(std::os::unix::net::UnixStream::connect(&socket)
                .is_ok()
                .then_some(Target::Unix(socket)))
        }
    }
}
