//! Draws a [`Timeline`] as SVG: a time axis, one row per execution (groups
//! with their siblings under a header, wide groups binned), and a strip of
//! running executions over time with each group's cap.
//!
//! The output is a pure function of the timeline and the options (no
//! clock, no hash order), so the same log gives the same bytes; its size
//! is bounded by the row budget and the pixel width, not by the run.

use std::fmt::Write;

use super::concurrency::Concurrency;
use super::duration::{fmt_duration, fmt_tick, tick_step};
use super::escape::{escape, push_escaped, shorten};
use super::layout::{Bin, Row, RowBudget, rows};
use super::timeline::{Execution, Group, Micros, Outcome, Role, Timeline};

/// How to draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvgOptions {
    /// Picture width in pixels (at least 600).
    pub width: u32,
    pub rows: RowBudget,
    /// Write `xmlns` (a standalone `.svg` file needs it; SVG inline in
    /// HTML does not).
    pub xmlns: bool,
}

impl Default for SvgOptions {
    fn default() -> Self {
        SvgOptions {
            width: 1200,
            rows: RowBudget::default(),
            xmlns: true,
        }
    }
}

const LABEL_W: f64 = 340.0;
const RIGHT_PAD: f64 = 20.0;
const HEADER_H: f64 = 82.0;
const ROW_H: f64 = 18.0;
const STRIP_GAP: f64 = 34.0;
const STRIP_H: f64 = 90.0;
const FOOT_H: f64 = 26.0;
/// Characters of a row label that fit the label column.
const LABEL_CHARS: usize = 54;

const STYLE: &str = "text{font:11px sans-serif;fill:#263238}\
.title{font:bold 14px sans-serif}.sub{fill:#546e7a}\
.ok{fill:#43a047}.skipped{fill:#9e9e9e}.unfinished{fill:#8e24aa}\
.cancelled{fill:#fb8c00}.failed{fill:#e53935}\
.grid{stroke:#eceff1}.axis{stroke:#90a4ae}\
.wait{stroke:#b0bec5;stroke-dasharray:2 2}\
.retry{stroke:#000;stroke-width:1.5}\
.approval{fill:url(#troupe-hatch)}\
.span{stroke:#546e7a;stroke-width:2}.group text,.group{font-weight:bold}\
.running{fill:#90caf9;stroke:#1e88e5}\
.cap{stroke:#c62828;stroke-dasharray:5 3}.captext{fill:#c62828}";

/// The timeline's `<style>` as a content security policy names it
/// (`sha256-` and the base64 of its digest): the dashboard draws the
/// timeline inline under a policy that allows no other inline style.
pub fn svg_style_source() -> String {
    use sha2::Digest;
    format!("sha256-{}", base64(&sha2::Sha256::digest(STYLE.as_bytes())))
}

/// Standard base64, padded (RFC 4648 §4), as a policy's hash is written.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The timeline as an SVG document.
pub fn render_svg(t: &Timeline, opts: &SvgOptions) -> String {
    let rows = rows(t, opts.rows);
    let concurrency = Concurrency::of(t);
    let width = f64::from(opts.width.max(600));
    let scale = Scale::new(t, width);
    let rows_h = rows.len() as f64 * ROW_H;
    let strip_top = HEADER_H + rows_h + STRIP_GAP;
    let height = strip_top + STRIP_H + FOOT_H;

    let mut out = String::with_capacity(4096 + rows.len() * 400 + opts.width as usize * 16);
    let _ = writeln!(
        out,
        "<svg{} class=\"troupe-timeline\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">",
        if opts.xmlns {
            " xmlns=\"http://www.w3.org/2000/svg\""
        } else {
            ""
        },
        num(width),
        num(height),
        num(width),
        num(height)
    );
    let _ = write!(
        out,
        "<style>{STYLE}</style>\n<defs><pattern id=\"troupe-hatch\" width=\"6\" height=\"6\" \
         patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">\
         <rect width=\"6\" height=\"6\" fill=\"#fff\" fill-opacity=\"0.5\"/>\
         <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#fff\" stroke-width=\"3\"/>\
         </pattern></defs>\n"
    );
    header(&mut out, t, &concurrency);
    legend(&mut out);
    axis(&mut out, &scale, HEADER_H - 6.0, height - FOOT_H + 4.0);
    for (i, row) in rows.iter().enumerate() {
        let y = HEADER_H + i as f64 * ROW_H;
        match row {
            Row::Execution { exec, sibling } => {
                if let Some(e) = t.execution(*exec) {
                    execution_row(&mut out, t, &scale, *exec, e, *sibling, y);
                }
            }
            Row::Group { group } => {
                if let Some(g) = t.groups.get(*group as usize) {
                    group_row(&mut out, t, &scale, g, y);
                }
            }
            Row::Bin(bin) => bin_row(&mut out, t, &scale, bin, y),
            Row::Omitted { rows, executions } => {
                let _ = writeln!(
                    out,
                    "<g class=\"row omitted\"><text x=\"8\" y=\"{}\" class=\"sub\">… {rows} more rows ({executions} executions) not drawn</text></g>",
                    num(y + 13.0)
                );
            }
        }
    }
    strip(&mut out, t, &scale, &concurrency, strip_top);
    out.push_str("</svg>\n");
    out
}

/// Maps times to x positions.
struct Scale {
    x0: f64,
    x1: f64,
    span: Micros,
}

impl Scale {
    fn new(t: &Timeline, width: f64) -> Scale {
        Scale {
            x0: LABEL_W,
            x1: width - RIGHT_PAD,
            span: t.end.max(1),
        }
    }

    fn x(&self, t: Micros) -> f64 {
        let t = t.clamp(0, self.span);
        self.x0 + (self.x1 - self.x0) * (t as f64 / self.span as f64)
    }

    /// Whole pixel columns of the plot.
    fn columns(&self) -> usize {
        (self.x1 - self.x0).max(1.0) as usize
    }
}

/// A coordinate with one decimal; never `-0.0`.
fn num(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    if r == 0.0 {
        "0".to_owned()
    } else if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

fn header(out: &mut String, t: &Timeline, c: &Concurrency) {
    out.push_str("<text x=\"8\" y=\"20\" class=\"title\">");
    push_escaped(
        out,
        t.run.pipeline.as_deref().unwrap_or("(pipeline unknown)"),
    );
    out.push_str(" · run ");
    push_escaped(out, &t.run.id);
    let _ = write!(
        out,
        " · {} · wall {}",
        escape(t.run.status.as_str()),
        fmt_duration(t.wall())
    );
    out.push_str("</text>\n<text x=\"8\" y=\"38\" class=\"sub\">started ");
    push_escaped(out, &t.run.started_at);
    let _ = write!(
        out,
        " · {} executions · {} parallel group{} · peak {} running",
        t.executions.len(),
        t.groups.len(),
        if t.groups.len() == 1 { "" } else { "s" },
        c.peak
    );
    if let Some(reason) = &t.run.reason {
        out.push_str(" · ");
        push_escaped(out, &shorten(reason, 110));
    }
    out.push_str("</text>\n");
}

fn legend(out: &mut String) {
    let y = 52.0;
    let mut x = 8.0;
    out.push_str("<g class=\"legend\">");
    for o in Outcome::ALL {
        let _ = write!(
            out,
            "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"10\" class=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>",
            num(x),
            num(y),
            o.as_str(),
            num(x + 18.0),
            num(y + 9.0),
            o.as_str()
        );
        x += 26.0 + o.as_str().len() as f64 * 6.5;
    }
    let _ = write!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"22\" height=\"10\" class=\"ok\"/><rect x=\"{}\" y=\"{}\" width=\"22\" height=\"10\" class=\"approval\"/><text x=\"{}\" y=\"{}\">approval wait</text>",
        num(x),
        num(y),
        num(x),
        num(y),
        num(x + 26.0),
        num(y + 9.0)
    );
    x += 26.0 + 13.0 * 6.5;
    let _ = write!(
        out,
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"retry\"/><text x=\"{}\" y=\"{}\">retry</text>",
        num(x + 4.0),
        num(y - 1.0),
        num(x + 4.0),
        num(y + 11.0),
        num(x + 10.0),
        num(y + 9.0)
    );
    x += 10.0 + 5.0 * 6.5 + 8.0;
    let _ = write!(
        out,
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"wait\"/><text x=\"{}\" y=\"{}\">waiting for a cap slot</text>",
        num(x),
        num(y + 5.0),
        num(x + 22.0),
        num(y + 5.0),
        num(x + 26.0),
        num(y + 9.0)
    );
    out.push_str("</g>\n");
}

/// Ticks and labels along the top, grid lines down to `bottom`.
fn axis(out: &mut String, s: &Scale, top: f64, bottom: f64) {
    let step = tick_step(s.span, 8);
    out.push_str("<g class=\"time-axis\">");
    let _ = write!(
        out,
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"axis\"/>",
        num(s.x0),
        num(top),
        num(s.x1),
        num(top)
    );
    let mut t = 0;
    while t <= s.span {
        let x = num(s.x(t));
        let _ = write!(
            out,
            "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" class=\"grid\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            num(top),
            num(bottom),
            num(top - 3.0),
            fmt_tick(t, step)
        );
        t += step;
    }
    out.push_str("</g>\n");
}

fn open_row(out: &mut String, class: &str, y: f64, label: &str, indent: f64) {
    let _ = write!(
        out,
        "<g class=\"row {class}\"><text x=\"{}\" y=\"{}\">",
        num(8.0 + indent),
        num(y + 13.0)
    );
    push_escaped(out, &shorten(label, LABEL_CHARS - (indent / 6.0) as usize));
    out.push_str("</text>");
}

fn title(out: &mut String, text: &str) {
    out.push_str("<title>");
    push_escaped(out, text);
    out.push_str("</title>");
}

/// The bar of `[from, to)`, at least one pixel wide.
fn bar(out: &mut String, s: &Scale, y: f64, from: Micros, to: Micros, class: &str) {
    let x = s.x(from);
    let w = (s.x(to) - x).max(1.0);
    let _ = write!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"12\" class=\"{class}\"/>",
        num(x),
        num(y + 3.0),
        num(w)
    );
}

/// The faint line of a sibling waiting for its cap slot.
fn wait_line(out: &mut String, s: &Scale, y: f64, from: Micros, to: Micros) {
    if to > from {
        let _ = write!(
            out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"wait\"/>",
            num(s.x(from)),
            num(y + 9.0),
            num(s.x(to)),
            num(y + 9.0)
        );
    }
}

fn retry_tick(out: &mut String, x: f64, y: f64) {
    let x = num(x);
    let _ = write!(
        out,
        "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" class=\"retry\"/>",
        num(y + 1.0),
        num(y + 17.0)
    );
}

fn approval_segment(out: &mut String, s: &Scale, y: f64, from: Micros, to: Micros) {
    bar(out, s, y, from, to, "approval");
}

fn execution_row(
    out: &mut String,
    t: &Timeline,
    s: &Scale,
    exec: u32,
    e: &Execution,
    sibling: bool,
    y: f64,
) {
    let label = t.execution_label(e);
    let class = if sibling { "sibling" } else { "exec" };
    open_row(out, class, y, &label, if sibling { 14.0 } else { 0.0 });
    let end = e.end_or(t.end);
    let group = match e.role {
        Role::Sibling => e.group.and_then(|g| t.groups.get(g as usize)),
        Role::Sequential | Role::Join => None,
    };
    let waited = group.map(|g| (e.entered - g.started).max(0));
    if let Some(g) = group {
        wait_line(out, s, y, g.started, e.entered);
    }
    bar(out, s, y, e.entered, end, e.outcome.as_str());
    for a in t.approvals_of(exec) {
        approval_segment(out, s, y, a.from, a.to.unwrap_or(end).min(end));
    }
    for r in t.retries_of(exec) {
        retry_tick(out, s.x(r.at), y);
    }
    let mut tip = format!(
        "{label}: {}, {}",
        e.outcome.as_str(),
        fmt_duration(end - e.entered)
    );
    if e.ended.is_none() {
        tip.push_str(" so far");
    }
    if let Some(w) = waited {
        tip.push_str(&format!(", waited {} for a slot", fmt_duration(w)));
    }
    tip.push_str(&format!(
        ", {} model request{}",
        e.requests,
        if e.requests == 1 { "" } else { "s" }
    ));
    if e.retries > 0 {
        tip.push_str(&format!(
            ", {} retr{}",
            e.retries,
            plural_y(e.retries.into())
        ));
    }
    let approvals = t.approvals_of(exec);
    if !approvals.is_empty() {
        let waited: Micros = approvals
            .iter()
            .map(|a| a.to.unwrap_or(end).min(end) - a.from)
            .sum();
        tip.push_str(&format!(
            ", {} approval wait{} ({})",
            approvals.len(),
            if approvals.len() == 1 { "" } else { "s" },
            fmt_duration(waited)
        ));
    }
    title(out, &tip);
    out.push_str("</g>\n");
}

fn plural_y(n: u64) -> &'static str {
    if n == 1 { "y" } else { "ies" }
}

/// `worker[40] · cap 8, 32 never started`, `test + lint · cap 4`.
pub(crate) fn group_label(g: &Group) -> String {
    let mut label = format!("{} · cap {}", g.label(), g.cap);
    let never = g.never_started();
    if never > 0 {
        label.push_str(&format!(", {never} never started"));
    }
    label
}

fn group_row(out: &mut String, t: &Timeline, s: &Scale, g: &Group, y: f64) {
    let label = group_label(g);
    open_row(out, "group", y, &label, 0.0);
    let end = g.ended.unwrap_or(t.end);
    let (x0, x1) = (num(s.x(g.started)), num(s.x(end).max(s.x(g.started) + 1.0)));
    let _ = write!(
        out,
        "<line x1=\"{x0}\" y1=\"{}\" x2=\"{x1}\" y2=\"{}\" class=\"span\"/>\
         <line x1=\"{x0}\" y1=\"{}\" x2=\"{x0}\" y2=\"{}\" class=\"span\"/>\
         <line x1=\"{x1}\" y1=\"{}\" x2=\"{x1}\" y2=\"{}\" class=\"span\"/>",
        num(y + 9.0),
        num(y + 9.0),
        num(y + 4.0),
        num(y + 14.0),
        num(y + 4.0),
        num(y + 14.0)
    );
    let mut tip = format!(
        "{label}; {} sibling{} planned; turn {} ran {}",
        g.width,
        if g.width == 1 { "" } else { "s" },
        g.turn_id,
        fmt_duration(end - g.started)
    );
    if g.ended.is_none() {
        tip.push_str(" (no SessionTurnEnd)");
    }
    if let Some(j) = &g.join {
        tip.push_str(&format!("; join {j}"));
    }
    if let Some(f) = &g.failed_sibling {
        tip.push_str(&format!("; failed sibling {f}"));
    }
    title(out, &tip);
    out.push_str("</g>\n");
}

/// `998 ok, 2 cancelled`.
pub(crate) fn outcome_counts(counts: &[u64; 5]) -> String {
    let mut parts = Vec::new();
    for o in Outcome::ALL {
        let n = counts[o.slot()];
        if n > 0 {
            parts.push(format!("{n} {}", o.as_str()));
        }
    }
    parts.join(", ")
}

fn bin_row(out: &mut String, t: &Timeline, s: &Scale, b: &Bin, y: f64) {
    let Some(g) = t.groups.get(b.group as usize) else {
        return;
    };
    let siblings = g.siblings.get(b.first..=b.last).unwrap_or_default();
    let stage = siblings
        .first()
        .and_then(|&e| t.execution(e))
        .map_or("?", |e| t.stage_name(e.stage));
    let label = format!(
        "{stage} #{}–#{} · {} ({})",
        b.min_index,
        b.max_index,
        b.size(),
        outcome_counts(&b.counts)
    );
    open_row(out, "bin", y, &label, 14.0);
    wait_line(out, s, y, g.started, b.entered);
    bar(out, s, y, b.entered, b.ended, b.worst.as_str());
    // Approval waits and retries of every sibling, merged per pixel so a
    // bin draws at most one mark per column.
    let mut spans: Vec<(i64, i64)> = Vec::new();
    let mut ticks: Vec<i64> = Vec::new();
    for &exec in siblings {
        let end = t.execution(exec).map_or(t.end, |e| e.end_or(t.end));
        for a in t.approvals_of(exec) {
            let to = a.to.unwrap_or(end).min(end);
            spans.push((s.x(a.from).floor() as i64, s.x(to).ceil() as i64));
        }
        ticks.extend(t.retries_of(exec).iter().map(|r| s.x(r.at).round() as i64));
    }
    spans.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for (a, z) in spans {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(z),
            _ => merged.push((a, z)),
        }
    }
    for (a, z) in merged {
        let _ = write!(
            out,
            "<rect x=\"{a}\" y=\"{}\" width=\"{}\" height=\"12\" class=\"approval\"/>",
            num(y + 3.0),
            (z - a).max(1)
        );
    }
    ticks.sort_unstable();
    ticks.dedup();
    for x in ticks {
        retry_tick(out, x as f64, y);
    }
    let mut tip = format!(
        "{label}: from {} to {}",
        fmt_duration(b.entered),
        fmt_duration(b.ended)
    );
    if b.retries > 0 {
        tip.push_str(&format!(", {} retr{}", b.retries, plural_y(b.retries)));
    }
    title(out, &tip);
    out.push_str("</g>\n");
}

/// Running executions over time as a step area (the most in each pixel
/// column), with each group's cap as a dashed line.
fn strip(out: &mut String, t: &Timeline, s: &Scale, c: &Concurrency, top: f64) {
    let base = top + STRIP_H;
    let max_cap = t.groups.iter().map(|g| g.cap).max().unwrap_or(0);
    let y_max = f64::from(c.peak.max(max_cap).max(1));
    let y = |v: u32| base - STRIP_H * f64::from(v) / y_max;
    let _ = write!(
        out,
        "<g class=\"strip\"><text x=\"8\" y=\"{}\" class=\"title\">running executions</text>\
         <text x=\"8\" y=\"{}\" class=\"sub\">peak {} at once; dashed: a group's cap</text>\
         <line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"axis\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">0</text>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        num(top + 14.0),
        num(top + 30.0),
        c.peak,
        num(s.x0),
        num(base),
        num(s.x1),
        num(base),
        num(s.x0 - 4.0),
        num(base),
        num(s.x0 - 4.0),
        num(top + 9.0),
        y_max as u32
    );
    let columns = c.columns(0, s.span, s.columns());
    let px_per_col = (s.x1 - s.x0) / columns.len().max(1) as f64;
    let mut d = format!("M{},{}", num(s.x0), num(base));
    let mut current = 0u32;
    for (i, &v) in columns.iter().enumerate() {
        if v != current {
            let x = num(s.x0 + i as f64 * px_per_col);
            let _ = write!(d, "H{x}V{}", num(y(v)));
            current = v;
        }
    }
    let _ = write!(d, "H{}V{}Z", num(s.x1), num(base));
    let _ = write!(out, "<path d=\"{d}\" class=\"running\"/>");
    for g in &t.groups {
        let end = g.ended.unwrap_or(t.end);
        let (x0, x1) = (s.x(g.started), s.x(end).max(s.x(g.started) + 1.0));
        let _ = write!(
            out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" class=\"cap\"/>\
             <text x=\"{}\" y=\"{}\" class=\"captext\">cap {}</text>",
            num(x0),
            num(y(g.cap)),
            num(x1),
            num(y(g.cap)),
            num(x0 + 2.0),
            num(y(g.cap) - 2.0),
            g.cap
        );
    }
    out.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648s() {
        // RFC 4648 §10's vectors.
        for (text, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(text.as_bytes()), encoded, "{text:?}");
        }
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), "+/+/");
    }

    #[test]
    fn the_style_source_is_the_digest_of_what_the_svg_holds() {
        use sha2::Digest;
        let log = include_str!("../../tests/fixtures/report/runs/run-1/audit.jsonl");
        let timeline = Timeline::from_audit(log.as_bytes()).expect("the fixture reads");
        let svg = render_svg(&timeline, &SvgOptions::default());
        let inline = svg
            .split("<style>")
            .nth(1)
            .and_then(|rest| rest.split("</style>").next())
            .expect("a <style> element");
        assert_eq!(inline, STYLE);
        // The empty string's SHA-256, as browsers name it in their
        // console when a policy refuses an empty <style>.
        assert_eq!(
            base64(&sha2::Sha256::digest(b"")),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
        assert!(svg_style_source().starts_with("sha256-"));
    }
}
