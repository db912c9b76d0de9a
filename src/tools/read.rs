//! `Read`: a text file inside the root as numbered lines (`cat -n` style),
//! a window of `offset`/`limit` lines, long lines cut, and a note saying how
//! to read on when the output stops before the file does.

use std::fmt::Write as _;
use std::io::BufReader;
use std::path::Path;

use serde::Deserialize;

use super::blocking::Stop;
use super::env::ToolLimits;
use super::error::ToolError;
use super::lines::{looks_binary, read_line_capped, text_capped};
use super::path::{open_file_beneath, relative, resolve};

#[derive(Debug, Clone, Deserialize)]
pub struct ReadArgs {
    pub path: String,
    pub offset: Option<u64>,
    pub limit: Option<u64>,
}

/// Why the output stopped before the end of the file.
enum Stopped {
    /// `limit` lines were shown.
    Limit,
    /// The output reached its byte cap.
    OutputCap,
}

pub fn read(
    root: &Path,
    limits: &ToolLimits,
    args: &ReadArgs,
    stop: &Stop,
) -> Result<String, ToolError> {
    let path = resolve(root, &args.path)?;
    let rel = relative(root, &path);
    let (file, _) = open_file_beneath(root, &path, &rel, "use Glob to list its files")?;
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    if looks_binary(&mut reader).map_err(|e| ToolError::io(&rel, &e))? {
        return Err(ToolError::terminal(
            "BinaryFile",
            format!("{rel} is a binary file; Read shows text files only"),
        ));
    }
    let offset = args.offset.unwrap_or(1).max(1);
    let limit = args
        .limit
        .unwrap_or(limits.read_default_lines as u64)
        .max(1);
    // Bytes kept per line: enough for `read_line_chars` characters of UTF-8.
    let line_cap = limits.read_line_chars.saturating_mul(4);

    let mut out = String::new();
    let mut buf = Vec::new();
    let mut line_no: u64 = 0;
    let mut last_shown: u64 = 0;
    let mut any_cut = false;
    let mut stopped: Option<Stopped> = None;
    // Bytes read after the output stopped, only to count the file's lines.
    let mut scanned: u64 = 0;
    let mut total_known = true;
    loop {
        stop.check()?;
        let cap = if stopped.is_some() { 0 } else { line_cap };
        let Some(line) =
            read_line_capped(&mut reader, &mut buf, cap).map_err(|e| ToolError::io(&rel, &e))?
        else {
            break;
        };
        line_no += 1;
        if stopped.is_some() {
            scanned += line.consumed as u64;
            if scanned > limits.read_scan_bytes {
                total_known = false;
                break;
            }
            continue;
        }
        if line_no < offset {
            continue;
        }
        if line_no - offset >= limit {
            stopped = Some(Stopped::Limit);
            continue;
        }
        let (text, cut) = text_capped(&buf, limits.read_line_chars, line.cut);
        let mut entry = format!("{line_no:>6}\t{text}");
        if cut {
            any_cut = true;
            entry.push_str(" … [line cut]");
        }
        entry.push('\n');
        if !out.is_empty() && out.len() + entry.len() > limits.read_output_bytes {
            stopped = Some(Stopped::OutputCap);
            continue;
        }
        out.push_str(&entry);
        last_shown = line_no;
    }

    let total = if total_known {
        format!("{line_no}")
    } else {
        format!("more than {line_no}")
    };
    if line_no == 0 {
        return Ok(format!("[{rel} is empty]"));
    }
    if last_shown == 0 {
        return Ok(format!(
            "[{rel} has {total} lines; offset {offset} is past the end]"
        ));
    }
    let mut notes = Vec::new();
    if any_cut {
        notes.push(format!(
            "lines longer than {} characters were cut",
            limits.read_line_chars
        ));
    }
    match stopped {
        Some(Stopped::Limit) => notes.push(format!(
            "showing lines {offset}-{last_shown} of {total}; call Read with offset={} to read on",
            last_shown + 1
        )),
        Some(Stopped::OutputCap) => notes.push(format!(
            "output cap of {} bytes reached: showing lines {offset}-{last_shown} of {total}; call Read with offset={} to read on",
            limits.read_output_bytes,
            last_shown + 1
        )),
        None => {}
    }
    if !notes.is_empty() {
        let _ = write!(out, "[{}]", notes.join("; "));
    }
    Ok(out)
}
