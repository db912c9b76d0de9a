//! `Edit` and `Write`: file changes inside the root that land whole or not
//! at all. The new content goes to a temp file in the target's directory,
//! is synced, gets the old file's permissions, and is renamed over the
//! target; a failure or a cancel before the rename leaves the target as it
//! was and removes the temp file. The stop flag is checked just before the
//! rename, so a call reported cancelled has (all but surely) changed nothing.

use std::fs::Permissions;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::Deserialize;

use super::blocking::Stop;
use super::env::ToolLimits;
use super::error::ToolError;
use super::path::{dir_flags, escaped, open_file_beneath, pinning, relative, resolve, walk_error};

/// Prefix of the temp files, so a crash's leftovers are recognisable.
pub const TEMP_PREFIX: &str = ".troupe-write-";

#[derive(Debug, Clone, Deserialize)]
pub struct EditArgs {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default)]
    pub replace_all: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WriteArgs {
    pub path: String,
    pub content: String,
}

/// The directory `dir` (inside `root`, every symlink already resolved by
/// [`resolve`]) opened by walking down from the root one name at a time,
/// none of them a symlink (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), and
/// made where missing when `create`. The descriptor pins the directory:
/// a component swapped for a symlink after `resolve` checked the path (a
/// shell racing the call) fails the walk, and the write cannot follow it
/// out of the root. Without `pin` ([`pinning`]: no `openat2`, or no
/// `/proc`) the folders are made by path and `None` says the path is
/// used as resolved.
fn pinned_dir(
    pin: bool,
    root: &Path,
    dir: &Path,
    create: bool,
    rel: &str,
) -> Result<Option<std::os::fd::OwnedFd>, ToolError> {
    use nix::errno::Errno;
    use nix::fcntl::{OpenHow, ResolveFlag, open, openat2};
    use nix::sys::stat::{Mode, mkdirat};
    if !pin {
        if create {
            std::fs::create_dir_all(dir).map_err(|e| ToolError::io(rel, &e))?;
        }
        return Ok(None);
    }
    let inside = dir.strip_prefix(root).map_err(|_| escaped(rel))?;
    let mut fd =
        open(root, dir_flags(), Mode::empty()).map_err(|e| ToolError::io(rel, &e.into()))?;
    let how = || {
        OpenHow::new()
            // No O_NOFOLLOW: with O_PATH it would open a link itself;
            // RESOLVE_NO_SYMLINKS refuses one anywhere (ELOOP).
            .flags(dir_flags())
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
    };
    for name in inside.components() {
        let std::path::Component::Normal(name) = name else {
            return Err(escaped(rel));
        };
        let next = match openat2(&fd, name, how()) {
            Err(Errno::ENOENT) if create => {
                match mkdirat(&fd, name, Mode::from_bits_truncate(0o777)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(ToolError::io(rel, &e.into())),
                }
                openat2(&fd, name, how())
            }
            other => other,
        };
        fd = next.map_err(|e| walk_error(rel, e))?;
    }
    Ok(Some(fd))
}

/// `path` reached through `dir`'s pinned descriptor: the kernel follows
/// `/proc/self/fd/N` to the directory it holds, whatever its path now is.
fn through(dir: Option<&std::os::fd::OwnedFd>, path: &Path) -> std::path::PathBuf {
    use std::os::fd::AsRawFd;
    match (dir, path.file_name()) {
        (Some(fd), Some(name)) => {
            Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())).join(name)
        }
        _ => path.to_owned(),
    }
}

/// Replaces `path`'s content with `bytes` atomically, in its directory as
/// pinned from `root` ([`pinned_dir`]) when `pin` ([`pinning`]). `keep`
/// are the permissions of the file being replaced; a new file gets 0o666
/// less the umask, as any created file.
fn atomic_write(
    pin: bool,
    root: &Path,
    path: &Path,
    rel: &str,
    bytes: &[u8],
    keep: Option<Permissions>,
    stop: &Stop,
) -> Result<(), ToolError> {
    let io = |e: std::io::Error| ToolError::io(rel, &e);
    let parent = path
        .parent()
        .ok_or_else(|| ToolError::terminal("NotAFile", format!("{rel} has no parent directory")))?;
    let pinned = pinned_dir(pin, root, parent, keep.is_none(), rel)?;
    let target = through(pinned.as_ref(), path);
    let dir = target.parent().unwrap_or(parent).to_owned();
    let path = target.as_path();
    let mut tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .suffix(".tmp")
        .permissions(Permissions::from_mode(0o666))
        .tempfile_in(&dir)
        .map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    if let Some(perms) = keep {
        tmp.as_file().set_permissions(perms).map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io)?;
    // Dropping `tmp` on this early return removes it.
    stop.check()?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

pub fn write(root: &Path, args: &WriteArgs, stop: &Stop) -> Result<String, ToolError> {
    let path = resolve(root, &args.path)?;
    let rel = relative(root, &path);
    let keep = match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => {
            return Err(ToolError::terminal(
                "NotAFile",
                format!("{rel} is a directory; give a file path"),
            ));
        }
        Ok(meta) => Some(meta.permissions()),
        // Its missing folders are made as the write pins its directory.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(ToolError::io(&rel, &e)),
    };
    let created = keep.is_none();
    atomic_write(
        pinning(),
        root,
        &path,
        &rel,
        args.content.as_bytes(),
        keep,
        stop,
    )?;
    Ok(format!(
        "{} {rel} ({} bytes)",
        if created { "created" } else { "overwrote" },
        args.content.len()
    ))
}

pub fn edit(
    root: &Path,
    limits: &ToolLimits,
    args: &EditArgs,
    stop: &Stop,
) -> Result<String, ToolError> {
    if args.old_string.is_empty() {
        return Err(ToolError::invalid_args(
            "`old_string` is empty; give the exact text to replace (use Write to create a file)",
        ));
    }
    if args.old_string == args.new_string {
        return Err(ToolError::invalid_args(
            "`old_string` and `new_string` are the same; nothing would change",
        ));
    }
    let path = resolve(root, &args.path)?;
    let rel = relative(root, &path);
    if std::fs::symlink_metadata(&path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Err(ToolError::terminal(
            "NotFound",
            format!("{rel}: no such file; use Write to create it"),
        ));
    }
    let (mut file, meta) = open_file_beneath(root, &path, &rel, "give a file path")?;
    if meta.len() > limits.edit_file_bytes {
        return Err(ToolError::terminal(
            "FileTooLarge",
            format!(
                "{rel} is {} bytes, over Edit's limit of {}",
                meta.len(),
                limits.edit_file_bytes
            ),
        ));
    }
    // Read no further than the limit: the file may grow after the check
    // (another call of the same response writing it).
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&mut file, limits.edit_file_bytes.saturating_add(1)),
        &mut bytes,
    )
    .map_err(|e| ToolError::io(&rel, &e))?;
    if bytes.len() as u64 > limits.edit_file_bytes {
        return Err(too_large(&rel, "grew", limits.edit_file_bytes));
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        ToolError::terminal(
            "BinaryFile",
            format!("{rel} is not UTF-8 text; Edit changes text files only"),
        )
    })?;
    let count = text.matches(args.old_string.as_str()).count();
    if count == 0 {
        return Err(ToolError::terminal(
            "NoMatch",
            format!(
                "`old_string` was not found in {rel}; Read the file and copy the exact text, including whitespace and line breaks"
            ),
        ));
    }
    if count > 1 && !args.replace_all {
        return Err(ToolError::terminal(
            "AmbiguousMatch",
            format!(
                "`old_string` occurs {count} times in {rel}; add surrounding lines to make it unique, or pass replace_all: true to replace every one"
            ),
        ));
    }
    // The edited text is bound by the same limit, counted before it is
    // made: a short `old_string` replaced everywhere by a long
    // `new_string` would otherwise build gigabytes.
    let grown = (text.len() as u64)
        .saturating_sub((count as u64).saturating_mul(args.old_string.len() as u64))
        .saturating_add(
            (if args.replace_all { count } else { 1 } as u64)
                .saturating_mul(args.new_string.len() as u64),
        );
    if grown > limits.edit_file_bytes {
        return Err(too_large(&rel, "would grow", limits.edit_file_bytes));
    }
    let new_text = if args.replace_all {
        text.replace(args.old_string.as_str(), &args.new_string)
    } else {
        text.replacen(args.old_string.as_str(), &args.new_string, 1)
    };
    atomic_write(
        pinning(),
        root,
        &path,
        &rel,
        new_text.as_bytes(),
        Some(meta.permissions()),
        stop,
    )?;
    Ok(format!(
        "edited {rel}: replaced {count} occurrence{}",
        if count == 1 { "" } else { "s" }
    ))
}

/// `FileTooLarge`: the file `what` (grew, would grow) past Edit's limit.
fn too_large(rel: &str, what: &str, limit: u64) -> ToolError {
    ToolError::terminal(
        "FileTooLarge",
        format!("{rel} {what} over Edit's limit of {limit} bytes"),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_cancel_before_the_rename_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("f.txt"), "old").unwrap();
        let stop = Stop::raised();
        let w = WriteArgs {
            path: "f.txt".to_owned(),
            content: "new".to_owned(),
        };
        assert!(write(&root, &w, &stop).is_err());
        let e = EditArgs {
            path: "f.txt".to_owned(),
            old_string: "old".to_owned(),
            new_string: "new".to_owned(),
            replace_all: false,
        };
        assert!(edit(&root, &ToolLimits::default(), &e, &stop).is_err());
        assert_eq!(std::fs::read_to_string(root.join("f.txt")).unwrap(), "old");
        let names: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f.txt"], "the temp files are removed");
    }

    /// An edit whose result would pass the limit is refused before it is
    /// built: a short `old_string` everywhere, a long `new_string`.
    #[test]
    fn an_edit_that_would_grow_past_the_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("f.txt"), "a\n".repeat(100)).unwrap();
        let limits = ToolLimits {
            edit_file_bytes: 1000,
            ..ToolLimits::default()
        };
        let edit_with = |new: &str, all: bool| {
            let e = EditArgs {
                path: "f.txt".to_owned(),
                old_string: "\n".to_owned(),
                new_string: new.to_owned(),
                replace_all: all,
            };
            edit(&root, &limits, &e, &Stop::lowered())
        };
        use crate::error::HasCode;
        let err = edit_with(&"x".repeat(10), true).unwrap_err();
        assert_eq!(err.code().to_string(), "ToolTerminal/FileTooLarge");
        assert_eq!(
            std::fs::read_to_string(root.join("f.txt")).unwrap(),
            "a\n".repeat(100)
        );
        // 100 × 2 bytes becoming 100 × 5: within the limit.
        assert!(edit_with("\n--\n", true).is_ok());
        assert_eq!(std::fs::metadata(root.join("f.txt")).unwrap().len(), 500);
    }

    /// A folder on the path swapped for a link to outside the root after
    /// the path was checked (a shell racing the call): the write fails,
    /// and nothing lands outside; a new file's missing folders are made.
    #[test]
    fn a_folder_swapped_for_a_link_after_the_check_takes_no_write_outside() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
        let outside = root.parent().unwrap().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let checked = resolve(&root, "sub/f.txt").unwrap();
        std::fs::remove_dir(root.join("sub")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("sub")).unwrap();
        let go = Stop::lowered();
        let written = atomic_write(true, &root, &checked, "sub/f.txt", b"x", None, &go);
        let e = written.unwrap_err();
        assert!(
            matches!(
                e,
                ToolError::Terminal {
                    code: "PathEscapes",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // Through folders that are folders, a new file and its folders.
        let w = WriteArgs {
            path: "a/b/c.txt".to_owned(),
            content: "new".to_owned(),
        };
        write(&root, &w, &go).unwrap();
        // Where the kernel cannot pin (no openat2, or a filter refusing
        // it), the folders are made by path, as before.
        let fallback = root.join("d/e/f.txt");
        atomic_write(false, &root, &fallback, "d/e/f.txt", b"old way", None, &go).unwrap();
        assert_eq!(std::fs::read_to_string(&fallback).unwrap(), "old way");
        assert_eq!(
            std::fs::read_to_string(root.join("a/b/c.txt")).unwrap(),
            "new"
        );
    }
}
