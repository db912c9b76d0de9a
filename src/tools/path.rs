//! Path confinement: every path a tool touches resolves inside the project
//! root. Paths are resolved component by component the way the kernel does
//! it (`..` steps to the real parent, symlinks are followed, a missing tail
//! is kept as written), so `..`, absolute paths elsewhere and symlinks that
//! lead out are caught before anything is read or written.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use super::error::ToolError;

/// Symlinks followed while resolving one path, as Linux's `MAXSYMLINKS`.
const MAX_SYMLINK_HOPS: usize = 40;

enum Part {
    Root,
    Parent,
    Name(OsString),
}

/// Pushes the parts of `path` so that popping yields them in order.
fn push_parts(stack: &mut Vec<Part>, path: &Path) {
    let parts: Vec<Part> = path
        .components()
        .filter_map(|c| match c {
            Component::RootDir | Component::Prefix(_) => Some(Part::Root),
            Component::ParentDir => Some(Part::Parent),
            Component::Normal(n) => Some(Part::Name(n.to_owned())),
            Component::CurDir => None,
        })
        .collect();
    stack.extend(parts.into_iter().rev());
}

/// Resolves `input` (relative to `root`, or absolute) to an absolute path
/// whose existing part has every symlink resolved, and checks that it lies
/// inside `root`, which must be canonical.
pub fn resolve(root: &Path, input: &str) -> Result<PathBuf, ToolError> {
    if input.contains('\0') {
        return Err(ToolError::invalid_args("`path` contains a NUL byte"));
    }
    let mut stack = Vec::new();
    push_parts(&mut stack, Path::new(input));
    let mut cur = root.to_path_buf();
    // Once a component is missing nothing below it exists, so nothing below
    // it can be a symlink.
    let mut missing = false;
    let mut hops = 0;
    while let Some(part) = stack.pop() {
        match part {
            Part::Root => {
                cur = PathBuf::from("/");
                missing = false;
            }
            Part::Parent => {
                cur.pop();
                if missing {
                    missing = std::fs::symlink_metadata(&cur).is_err();
                }
            }
            Part::Name(name) => {
                let next = cur.join(&name);
                if missing {
                    cur = next;
                    continue;
                }
                match std::fs::symlink_metadata(&next) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        hops += 1;
                        if hops > MAX_SYMLINK_HOPS {
                            return Err(ToolError::terminal(
                                "SymlinkLoop",
                                format!("`{input}`: too many levels of symbolic links"),
                            ));
                        }
                        let target = std::fs::read_link(&next).map_err(|e| {
                            ToolError::terminal(
                                "IoError",
                                format!("`{input}`: cannot read a symbolic link: {e}"),
                            )
                        })?;
                        // A relative target resolves against the link's
                        // directory (`cur`); an absolute one starts at `/`.
                        push_parts(&mut stack, &target);
                    }
                    Ok(_) => cur = next,
                    // Not found, not a directory, no permission: the later
                    // operation on this exact path reports the real error.
                    Err(_) => {
                        missing = true;
                        cur = next;
                    }
                }
            }
        }
    }
    if cur.starts_with(root) {
        Ok(cur)
    } else {
        Err(ToolError::terminal(
            "PathOutsideRoot",
            format!(
                "`{input}` resolves outside the project root; use a path inside the root (relative paths start at the root)"
            ),
        ))
    }
}

/// `path` as the model should write it: relative to `root`, `.` for the
/// root itself.
pub fn relative(root: &Path, path: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => path.to_string_lossy().into_owned(),
    }
}

/// Whether files are opened from the root by descriptor (`openat2`,
/// Linux 5.6 and later, and `/proc/self/fd` to reach a pinned folder by):
/// probed once. A seccomp filter that refuses `openat2` answers EPERM or
/// ENOSYS; then, as without `/proc`, paths are used as resolved.
pub fn pinning() -> bool {
    static PINNING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PINNING.get_or_init(|| {
        use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
        let dir = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let how = OpenHow::new()
            .flags(dir)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let probe =
            open("/", dir, nix::sys::stat::Mode::empty()).and_then(|root| openat2(&root, ".", how));
        probe.is_ok() && Path::new("/proc/self/fd").is_dir()
    })
}

/// The flags of a folder opened only to reach what is under it: no read
/// permission needed, as a path walk needs none.
pub fn dir_flags() -> nix::fcntl::OFlag {
    use nix::fcntl::OFlag;
    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

/// An `openat2` error of a walk from the root, typed: a link where a
/// folder was checked is `PathEscapes`, a file there `NotAFile`.
pub fn walk_error(rel: &str, e: nix::errno::Errno) -> ToolError {
    use nix::errno::Errno;
    match e {
        Errno::ELOOP | Errno::EXDEV => escaped(rel),
        Errno::ENOTDIR => ToolError::terminal(
            "NotAFile",
            format!("{rel}: a part of its path is not a folder"),
        ),
        e => ToolError::io(rel, &e.into()),
    }
}

/// Opens `path` (inside `root`, resolved by [`resolve`]) for reading by
/// walking down from the root with no link followed (`openat2` with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), without waiting on a FIFO,
/// and checks on the descriptor that it is a regular file. A folder
/// swapped for a link since the check (a shell racing the call) is
/// `PathEscapes`, not a read from outside the root. Without
/// [`pinning`] the path is opened as resolved.
pub fn open_file_beneath(
    root: &Path,
    path: &Path,
    rel: &str,
    dir_hint: &str,
) -> Result<(std::fs::File, std::fs::Metadata), ToolError> {
    open_file_beneath_with(pinning(), root, path, rel, dir_hint)
}

fn open_file_beneath_with(
    pin: bool,
    root: &Path,
    path: &Path,
    rel: &str,
    dir_hint: &str,
) -> Result<(std::fs::File, std::fs::Metadata), ToolError> {
    use nix::fcntl::{FcntlArg, OFlag, OpenHow, ResolveFlag, fcntl, open, openat2};
    use nix::sys::stat::Mode;
    // Said before anything is opened: a device is never opened at all.
    let meta = std::fs::metadata(path).map_err(|e| ToolError::io(rel, &e))?;
    require_regular_file(&meta, rel, dir_hint)?;
    let file = if pin {
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW;
        let inside = path.strip_prefix(root).map_err(|_| escaped(rel))?;
        let root_fd =
            open(root, dir_flags(), Mode::empty()).map_err(|e| ToolError::io(rel, &e.into()))?;
        let how = OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let fd = openat2(&root_fd, inside, how).map_err(|e| walk_error(rel, e))?;
        std::fs::File::from(fd)
    } else {
        std::fs::File::open(path).map_err(|e| ToolError::io(rel, &e))?
    };
    let meta = file.metadata().map_err(|e| ToolError::io(rel, &e))?;
    require_regular_file(&meta, rel, dir_hint)?;
    // A regular file: reads as if opened blocking (a FIFO was refused).
    if pin {
        fcntl(&file, FcntlArg::F_SETFL(OFlag::empty()))
            .map_err(|e| ToolError::io(rel, &e.into()))?;
    }
    Ok((file, meta))
}

/// A path that changed into a link between its check and its use.
pub fn escaped(rel: &str) -> ToolError {
    ToolError::terminal(
        "PathEscapes",
        format!(
            "{rel}: a folder on its path changed into a link after it was checked; nothing was read or written"
        ),
    )
}

/// A file a tool reads or rewrites must be a regular file: a directory gets
/// `dir_hint`, and a FIFO or a device (which would block or never end) is
/// refused too.
pub fn require_regular_file(
    meta: &std::fs::Metadata,
    rel: &str,
    dir_hint: &str,
) -> Result<(), ToolError> {
    if meta.is_dir() {
        return Err(ToolError::terminal(
            "NotAFile",
            format!("{rel} is a directory; {dir_hint}"),
        ));
    }
    if !meta.is_file() {
        return Err(ToolError::terminal(
            "NotAFile",
            format!("{rel} is not a regular file"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn code(r: Result<PathBuf, ToolError>) -> String {
        match r {
            Err(ToolError::Terminal { code, .. }) => code.to_owned(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn relative_paths_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("a")).unwrap();
        assert_eq!(resolve(&root, "a/b.txt").unwrap(), root.join("a/b.txt"));
        assert_eq!(resolve(&root, "./a/../c").unwrap(), root.join("c"));
        assert_eq!(resolve(&root, ".").unwrap(), root);
        assert_eq!(resolve(&root, "new/dir/../f").unwrap(), root.join("new/f"));
        let abs = root.join("a").to_string_lossy().into_owned();
        assert_eq!(resolve(&root, &abs).unwrap(), root.join("a"));
    }

    #[test]
    fn escapes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
        std::fs::create_dir(&root).unwrap();
        assert_eq!(code(resolve(&root, "../x")), "PathOutsideRoot");
        assert_eq!(code(resolve(&root, "a/../../x")), "PathOutsideRoot");
        assert_eq!(code(resolve(&root, "/etc/passwd")), "PathOutsideRoot");
        assert_eq!(code(resolve(&root, "a\0b")), "InvalidArguments");
        // A sibling whose name extends the root's is still outside.
        let sibling = format!("{}2/x", root.display());
        assert_eq!(code(resolve(&root, &sibling)), "PathOutsideRoot");
    }

    #[test]
    fn symlinks_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("root");
        std::fs::create_dir_all(root.join("inner")).unwrap();
        std::fs::create_dir(base.join("outside")).unwrap();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, root.join(name)).unwrap();
        };
        link(&base.join("outside"), "out");
        link(Path::new("../outside/new.txt"), "dangling");
        link(Path::new("inner"), "in");
        link(Path::new("loop"), "loop");
        assert_eq!(code(resolve(&root, "out/file")), "PathOutsideRoot");
        assert_eq!(
            code(resolve(&root, "out/missing/deeper")),
            "PathOutsideRoot"
        );
        assert_eq!(code(resolve(&root, "dangling")), "PathOutsideRoot");
        assert_eq!(code(resolve(&root, "loop")), "SymlinkLoop");
        assert_eq!(resolve(&root, "in/x").unwrap(), root.join("inner/x"));
    }

    /// A folder swapped for a link to outside after the path was checked:
    /// the open fails rather than reading the file out there.
    #[test]
    fn a_read_after_a_swap_does_not_leave_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/f.txt"), "inside").unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("f.txt"), "secret").unwrap();
        let checked = resolve(&root, "sub/f.txt").unwrap();
        let (mut file, _) = open_file_beneath(&root, &checked, "sub/f.txt", "").unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut file, &mut text).unwrap();
        assert_eq!(text, "inside");
        std::fs::rename(root.join("sub"), base.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("sub")).unwrap();
        let e = open_file_beneath(&root, &checked, "sub/f.txt", "").unwrap_err();
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
    }
}
