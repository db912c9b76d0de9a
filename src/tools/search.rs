//! `Grep` and `Glob`: walks under the root that respect `.gitignore` (and
//! `.ignore`, skip hidden files, never follow symlinks), in a stable order,
//! with capped output and a note when results were left out. Walks check
//! the stop flag on every entry, so a cancelled call stops promptly.

use std::io::BufReader;
use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};
use ignore::WalkBuilder;
use regex::RegexBuilder;
use serde::Deserialize;

use super::blocking::Stop;
use super::env::ToolLimits;
use super::error::ToolError;
use super::lines::{looks_binary, read_line_capped, text_capped};
use super::path::{open_file_beneath, relative, resolve};

/// Upper bound on `max_results`, whatever the call asks.
const MAX_RESULTS: usize = 5000;
/// Bytes of one line that `Grep` matches against.
const GREP_LINE_BYTES: usize = 64 * 1024;
/// Compiled size bound of a `Grep` regex (regex's own default is 10 MiB).
const REGEX_SIZE_LIMIT: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone, Deserialize)]
pub struct GrepArgs {
    pub pattern: String,
    pub path: Option<String>,
    pub glob: Option<String>,
    #[serde(default)]
    pub case_insensitive: bool,
    pub max_results: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GlobArgs {
    pub pattern: String,
    pub path: Option<String>,
    pub max_results: Option<u64>,
}

/// A glob as the tools read it: a pattern without `/` matches a file name
/// at any depth (as in `.gitignore`); one with `/` matches the path
/// relative to the search directory. `*` never crosses `/`; `**` does.
struct FileGlob {
    matcher: GlobMatcher,
    name_only: bool,
}

impl FileGlob {
    fn new(field: &str, pattern: &str) -> Result<FileGlob, ToolError> {
        let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
        if pattern.starts_with('/') {
            return Err(ToolError::invalid_args(format!(
                "`{field}` is matched against paths relative to the search directory; drop the leading `/`"
            )));
        }
        let glob = GlobBuilder::new(pattern)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| ToolError::invalid_args(format!("`{field}` is not a valid glob: {e}")))?;
        Ok(FileGlob {
            matcher: glob.compile_matcher(),
            name_only: !pattern.contains('/'),
        })
    }

    /// `rel`: the path relative to the search directory.
    fn matches(&self, rel: &Path) -> bool {
        if self.name_only {
            rel.file_name()
                .is_some_and(|name| self.matcher.is_match(Path::new(name)))
        } else {
            self.matcher.is_match(rel)
        }
    }
}

fn max_results(limits: &ToolLimits, asked: Option<u64>) -> usize {
    asked
        .map_or(limits.search_default_results, |n| {
            usize::try_from(n).unwrap_or(MAX_RESULTS)
        })
        .clamp(1, MAX_RESULTS)
}

/// The regular files under `base`, in a stable order (by name, depth first),
/// honouring ignore files; `visit` returns false to stop the walk.
fn walk_files(
    base: &Path,
    stop: &Stop,
    mut visit: impl FnMut(&Path) -> Result<bool, ToolError>,
) -> Result<(), ToolError> {
    let walk = WalkBuilder::new(base)
        .standard_filters(true)
        // Respect .gitignore in a folder that is not (yet) a git repository.
        .require_git(false)
        // The user's global excludes would make results machine-dependent.
        .git_global(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .build();
    for entry in walk {
        stop.check()?;
        // Unreadable directories and broken ignore files are skipped.
        let Ok(entry) = entry else { continue };
        if entry.file_type().is_some_and(|t| t.is_file()) && !visit(entry.path())? {
            break;
        }
    }
    Ok(())
}

/// `file` relative to the search base, which globs match against; a file
/// given as the base itself is its own name.
fn relative_to_base<'a>(base: &Path, file: &'a Path) -> &'a Path {
    match file.strip_prefix(base) {
        Ok(rel) if rel.as_os_str().is_empty() => file.file_name().map_or(rel, Path::new),
        Ok(rel) => rel,
        Err(_) => file,
    }
}

/// The directory (or file) to search: `path` resolved inside the root.
fn search_base(root: &Path, path: Option<&str>) -> Result<std::path::PathBuf, ToolError> {
    let base = resolve(root, path.unwrap_or("."))?;
    let rel = relative(root, &base);
    std::fs::metadata(&base).map_err(|e| ToolError::io(&rel, &e))?;
    Ok(base)
}

pub fn grep(
    root: &Path,
    limits: &ToolLimits,
    args: &GrepArgs,
    stop: &Stop,
) -> Result<String, ToolError> {
    let regex = RegexBuilder::new(&args.pattern)
        .case_insensitive(args.case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| ToolError::invalid_args(format!("`pattern` is not a valid regex: {e}")))?;
    let filter = args
        .glob
        .as_deref()
        .map(|g| FileGlob::new("glob", g))
        .transpose()?;
    let base = search_base(root, args.path.as_deref())?;
    let max = max_results(limits, args.max_results);

    let mut results: Vec<String> = Vec::new();
    let mut capped = false;
    let mut skipped_large = 0usize;
    let mut buf = Vec::new();
    walk_files(&base, stop, |file| {
        let rel_base = relative_to_base(&base, file);
        if filter.as_ref().is_some_and(|f| !f.matches(rel_base)) {
            return Ok(true);
        }
        // Opened as Read opens a file: beneath the root, through no link,
        // never a FIFO or device (a file swapped for one mid-walk is
        // skipped, not followed or waited on).
        let rel = relative(root, file);
        let Ok((f, meta)) = open_file_beneath(root, file, &rel, "") else {
            return Ok(true);
        };
        if meta.len() > limits.grep_file_bytes {
            skipped_large += 1;
            return Ok(true);
        }
        let mut reader = BufReader::with_capacity(64 * 1024, f);
        if looks_binary(&mut reader).unwrap_or(true) {
            return Ok(true);
        }
        let mut line_no = 0u64;
        loop {
            if line_no.is_multiple_of(4096) {
                stop.check()?;
            }
            // A read error mid-file ends that file, not the search.
            let Ok(Some(line)) = read_line_capped(&mut reader, &mut buf, GREP_LINE_BYTES) else {
                break;
            };
            line_no += 1;
            let text = String::from_utf8_lossy(&buf);
            if !regex.is_match(&text) {
                continue;
            }
            if results.len() == max {
                capped = true;
                return Ok(false);
            }
            let (shown, cut) = text_capped(text.as_bytes(), limits.grep_line_chars, line.cut);
            let marker = if cut { " … [line cut]" } else { "" };
            results.push(format!("{rel}:{line_no}: {shown}{marker}"));
        }
        Ok(true)
    })?;

    let mut out = if results.is_empty() {
        format!("no matches for /{}/", args.pattern)
    } else {
        results.join("\n")
    };
    let mut notes = Vec::new();
    if capped {
        notes.push(format!(
            "results capped at {max}; narrow the pattern, `path` or `glob`, or raise `max_results`"
        ));
    }
    if skipped_large > 0 {
        notes.push(format!(
            "{skipped_large} file(s) over {} bytes were not searched",
            limits.grep_file_bytes
        ));
    }
    if !notes.is_empty() {
        out.push_str(&format!("\n[{}]", notes.join("; ")));
    }
    Ok(out)
}

pub fn glob(
    root: &Path,
    limits: &ToolLimits,
    args: &GlobArgs,
    stop: &Stop,
) -> Result<String, ToolError> {
    let pattern = FileGlob::new("pattern", &args.pattern)?;
    let base = search_base(root, args.path.as_deref())?;
    let max = max_results(limits, args.max_results);
    let mut found: Vec<String> = Vec::new();
    let mut total = 0usize;
    walk_files(&base, stop, |file| {
        if pattern.matches(relative_to_base(&base, file)) {
            total += 1;
            if found.len() < max {
                found.push(relative(root, file));
            }
        }
        Ok(true)
    })?;
    found.sort();
    if found.is_empty() {
        return Ok(format!("no files match `{}`", args.pattern));
    }
    let mut out = found.join("\n");
    if total > found.len() {
        out.push_str(&format!(
            "\n[showing {} of {total} files; narrow the pattern or `path`, or raise `max_results`]",
            found.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn code(r: Result<String, ToolError>) -> String {
        match r {
            Err(ToolError::Terminal { code, .. }) => code.to_owned(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn walks_stop_when_the_call_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(root.join("a.txt"), "x\n").unwrap();
        let limits = ToolLimits::default();
        let grep_args = GrepArgs {
            pattern: "x".to_owned(),
            path: None,
            glob: None,
            case_insensitive: false,
            max_results: None,
        };
        let glob_args = GlobArgs {
            pattern: "*".to_owned(),
            path: None,
            max_results: None,
        };
        let stop = Stop::raised();
        assert_eq!(
            code(grep(&root, &limits, &grep_args, &stop)),
            "ToolCancelled"
        );
        assert_eq!(
            code(glob(&root, &limits, &glob_args, &stop)),
            "ToolCancelled"
        );
    }

    #[test]
    fn name_globs_match_at_any_depth() {
        let g = FileGlob::new("glob", "*.rs").unwrap();
        assert!(g.matches(Path::new("a/b/c.rs")));
        let g = FileGlob::new("glob", "./src/*.rs").unwrap();
        assert!(g.matches(Path::new("src/c.rs")));
        assert!(!g.matches(Path::new("src/a/c.rs")));
        assert!(FileGlob::new("glob", "/src/*.rs").is_err());
    }
}
