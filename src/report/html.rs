//! The report as one self-contained HTML file: the run's figures, the
//! timeline SVG inline and a table per stage and per parallel group. No
//! scripts, fonts or links to anything outside the file.

use std::fmt::Write;

use super::duration::fmt_duration;
use super::escape::{escape, push_escaped};
use super::summary::stage_summaries;
use super::svg::{SvgOptions, render_svg};
use super::timeline::{Outcome, Timeline};

const CSS: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#263238}\
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:24px 0 4px}\
table{border-collapse:collapse}th,td{padding:3px 10px;border-bottom:1px solid #eceff1;text-align:right;vertical-align:top}\
th:first-child,td:first-child{text-align:left}table.run th{text-align:left;color:#546e7a;font-weight:normal}\
table.run td{text-align:left}.timeline{overflow-x:auto;margin:16px 0}";

/// The report page: `opts` draws the timeline (its `xmlns` is not needed
/// inline and is left out).
pub fn render_html(t: &Timeline, opts: &SvgOptions) -> String {
    render_html_with(t, opts, None)
}

/// The report page with the pipeline's graph (`graph::pipeline_svg`)
/// drawn above the timeline.
pub fn render_html_with(t: &Timeline, opts: &SvgOptions, graph: Option<&str>) -> String {
    let svg = render_svg(
        t,
        &SvgOptions {
            xmlns: false,
            ..*opts
        },
    );
    let pipeline = t.run.pipeline.as_deref().unwrap_or("(pipeline unknown)");
    let mut out = String::with_capacity(svg.len() + 8192);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>troupe report · ");
    push_escaped(&mut out, pipeline);
    out.push_str(" · ");
    push_escaped(&mut out, &t.run.id);
    let _ = write!(out, "</title>\n<style>{CSS}</style>\n</head>\n<body>\n<h1>");
    push_escaped(&mut out, pipeline);
    out.push_str(" · run ");
    push_escaped(&mut out, &t.run.id);
    out.push_str("</h1>\n<table class=\"run\">\n");
    let mut field = |name: &str, value: &str| {
        let _ = writeln!(out, "<tr><th>{name}</th><td>{}</td></tr>", escape(value));
    };
    field("run", &t.run.id);
    field("pipeline", pipeline);
    field("status", t.run.status.as_str());
    if let Some(reason) = &t.run.reason {
        field("reason", reason);
    }
    field("started", &t.run.started_at);
    field("wall time", &fmt_duration(t.wall()));
    field("stage executions", &t.executions.len().to_string());
    field("parallel groups", &t.groups.len().to_string());
    out.push_str("</table>\n");
    if let Some(graph) = graph {
        out.push_str("<h2>Pipeline</h2>\n<div class=\"timeline\">\n");
        out.push_str(graph);
        out.push_str("</div>\n");
    }
    out.push_str("<div class=\"timeline\">\n");
    out.push_str(&svg);
    out.push_str("</div>\n");
    stages_table(&mut out, t);
    groups_table(&mut out, t);
    out.push_str("</body>\n</html>\n");
    out
}

fn stages_table(out: &mut String, t: &Timeline) {
    out.push_str(
        "<h2>Stages</h2>\n<table class=\"stages\">\n<tr><th>stage</th><th>executions</th>\
         <th>ok</th><th>failed</th><th>skipped</th><th>cancelled</th><th>unfinished</th>\
         <th>retries</th><th>median</th><th>max</th><th>model requests</th></tr>\n",
    );
    let dur = |d: Option<i64>| d.map_or_else(|| "–".to_owned(), fmt_duration);
    for s in stage_summaries(t) {
        out.push_str("<tr><td>");
        push_escaped(out, &s.stage);
        let _ = write!(
            out,
            "</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}",
            s.executions(),
            s.count(Outcome::Ok),
            s.count(Outcome::Failed),
            s.count(Outcome::Skipped),
            s.count(Outcome::Cancelled),
            s.count(Outcome::Unfinished),
            s.retries,
            dur(s.median),
            dur(s.max),
            s.requests
        );
        if s.failed_requests > 0 {
            let _ = write!(out, " ({} failed)", s.failed_requests);
        }
        out.push_str("</td></tr>\n");
    }
    out.push_str("</table>\n");
}

fn groups_table(out: &mut String, t: &Timeline) {
    if t.groups.is_empty() {
        return;
    }
    out.push_str(
        "<h2>Parallel groups</h2>\n<table class=\"groups\">\n<tr><th>group</th><th>width</th>\
         <th>cap</th><th>entered</th><th>never started</th><th>ran</th><th>join</th>\
         <th>failed sibling</th></tr>\n",
    );
    for g in &t.groups {
        out.push_str("<tr><td>");
        push_escaped(out, &g.label());
        let ran = fmt_duration(g.ended.unwrap_or(t.end) - g.started);
        let _ = write!(
            out,
            "</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td><td>",
            g.width,
            g.cap,
            g.siblings.len(),
            g.never_started(),
            ran,
            if g.ended.is_none() {
                " (unfinished)"
            } else {
                ""
            }
        );
        push_escaped(out, g.join.as_deref().unwrap_or("–"));
        out.push_str("</td><td>");
        push_escaped(out, g.failed_sibling.as_deref().unwrap_or("–"));
        out.push_str("</td></tr>\n");
    }
    out.push_str("</table>\n");
}
