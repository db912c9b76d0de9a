//! Why a log cannot be read: [`AuditError`] for a file, and the
//! decoder's [`Fault`] before it knows the file's path.

use std::io;
use std::path::{Path, PathBuf};

use super::write::FORMAT;

/// Why a log cannot be read. Code `Store/AuditCorrupt`; for a file that
/// cannot be read at all `Store/WriteFailed`, the code the store gives
/// any file it cannot use.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{}: not a troupe audit log (it does not begin with the log's header)", path.display())]
    Foreign { path: PathBuf },
    #[error(
        "{}: written by a newer troupe (log format {found}; this troupe reads format {FORMAT})",
        path.display()
    )]
    Newer { path: PathBuf, found: u32 },
    #[error("{}: at byte {offset}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl AuditError {
    /// As the error of a `Read` of the log's lines: a file that cannot be
    /// read is its own error, anything else `InvalidData` with this
    /// error's text.
    pub fn into_io(self) -> io::Error {
        match self {
            AuditError::Io { source, .. } => source,
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        }
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            AuditError::Io { .. } => "Store/WriteFailed",
            _ => "Store/AuditCorrupt",
        }
    }

    pub(super) fn io(path: &Path) -> impl Fn(io::Error) -> AuditError + '_ {
        move |source| AuditError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// What the decoder found wrong, before the path is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fault {
    Foreign,
    Newer(u32),
    Corrupt { offset: u64, reason: String },
}

impl Fault {
    pub(super) fn at(self, path: &Path) -> AuditError {
        let path = path.to_owned();
        match self {
            Fault::Foreign => AuditError::Foreign { path },
            Fault::Newer(found) => AuditError::Newer { path, found },
            Fault::Corrupt { offset, reason } => AuditError::Corrupt {
                path,
                offset,
                reason,
            },
        }
    }
}
