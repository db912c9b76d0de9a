//! A pipeline's graph drawn as SVG for the HTML report: the stages in
//! ranks by their distance from the start (the Next table's edges, as
//! `troupe show --mermaid` has them), an edge forward drawn straight down,
//! an edge back (a loop, a retry) curved along the right side, each with
//! its label (a router's value, a fan-out's list and cap, a join).

use std::collections::{HashMap, VecDeque};
use std::fmt::Write;

use super::escape::escape;
use crate::definition::Pipeline;
use crate::definition::graph::{END, START, edges, kind_label};

const NODE_W: f64 = 190.0;
const NODE_H: f64 = 44.0;
const GAP_X: f64 = 40.0;
const GAP_Y: f64 = 64.0;
const PAD: f64 = 20.0;
/// Room on the right for edges that go back.
const BACK_W: f64 = 90.0;

/// The pipeline as an SVG picture (no `xmlns`: it goes inline in HTML).
pub fn pipeline_svg(p: &Pipeline) -> String {
    let edges = edges(p);
    let mut rank: HashMap<&str, usize> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut queue = VecDeque::from([START]);
    rank.insert(START, 0);
    while let Some(node) = queue.pop_front() {
        order.push(node);
        for (from, to, _) in &edges {
            if from == node && !rank.contains_key(to.as_str()) {
                rank.insert(to.as_str(), rank[node] + 1);
                queue.push_back(to.as_str());
            }
        }
    }
    // Stages no edge reaches still show, below the rest.
    let deepest = rank.values().copied().max().unwrap_or(0);
    for stage in &p.stages {
        if !rank.contains_key(stage.id.as_str()) {
            rank.insert(stage.id.as_str(), deepest + 1);
            order.push(stage.id.as_str());
        }
    }
    let ranks = rank.values().copied().max().unwrap_or(0) + 1;
    let mut rows: Vec<Vec<&str>> = vec![Vec::new(); ranks];
    for node in &order {
        rows[rank[node]].push(node);
    }
    let widest = rows.iter().map(Vec::len).max().unwrap_or(1) as f64;
    let width = PAD * 2.0 + widest * NODE_W + (widest - 1.0) * GAP_X + BACK_W;
    let height = PAD * 2.0 + ranks as f64 * NODE_H + (ranks as f64 - 1.0) * GAP_Y;
    let mut at: HashMap<&str, (f64, f64)> = HashMap::new();
    for (r, row) in rows.iter().enumerate() {
        let n = row.len() as f64;
        let row_w = n * NODE_W + (n - 1.0) * GAP_X;
        let left = PAD + ((width - BACK_W - PAD * 2.0) - row_w) / 2.0;
        for (i, node) in row.iter().enumerate() {
            let x = left + i as f64 * (NODE_W + GAP_X);
            let y = PAD + r as f64 * (NODE_H + GAP_Y);
            at.insert(node, (x, y));
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg class=\"pipeline\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"system-ui,sans-serif\" font-size=\"12\">\
<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0L10,5L0,10z\" fill=\"#607d8b\"/></marker></defs>"
    );
    for (from, to, label) in &edges {
        let (Some(&(x1, y1)), Some(&(x2, y2))) = (at.get(from.as_str()), at.get(to.as_str()))
        else {
            continue;
        };
        let forward = rank[to.as_str()] > rank[from.as_str()];
        let (path, lx, ly) = if forward {
            let (sx, sy, ex, ey) = (x1 + NODE_W / 2.0, y1 + NODE_H, x2 + NODE_W / 2.0, y2);
            (
                format!("M{sx:.1},{sy:.1}L{ex:.1},{ey:.1}"),
                (sx + ex) / 2.0 + 4.0,
                (sy + ey) / 2.0,
            )
        } else {
            let (sx, sy, ex, ey) = (
                x1 + NODE_W,
                y1 + NODE_H / 2.0,
                x2 + NODE_W,
                y2 + NODE_H / 2.0,
            );
            let bend = sx.max(ex) + BACK_W * 0.7;
            (
                format!("M{sx:.1},{sy:.1}C{bend:.1},{sy:.1} {bend:.1},{ey:.1} {ex:.1},{ey:.1}"),
                bend - 10.0,
                (sy + ey) / 2.0,
            )
        };
        let dash = if label == "join" {
            " stroke-dasharray=\"4 3\""
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "<path d=\"{path}\" fill=\"none\" stroke=\"#607d8b\"{dash} marker-end=\"url(#arrow)\"/>"
        );
        if !label.is_empty() {
            let _ = writeln!(
                out,
                "<text x=\"{lx:.1}\" y=\"{ly:.1}\" fill=\"#455a64\" font-size=\"11\">{}</text>",
                escape(label)
            );
        }
    }
    for (node, &(x, y)) in &at {
        let (title, kind, fill) = match *node {
            START => ("start".to_owned(), String::new(), "#eceff1"),
            END => ("end".to_owned(), String::new(), "#eceff1"),
            id => {
                let label = kind_label(p, id);
                let (title, kind) = label.split_once('\n').unwrap_or((id, ""));
                (title.to_owned(), kind.to_owned(), "#e3f2fd")
            }
        };
        let _ = write!(
            out,
            "<g><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{NODE_W}\" height=\"{NODE_H}\" rx=\"8\" fill=\"{fill}\" stroke=\"#90a4ae\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-weight=\"600\">{}</text>",
            x + NODE_W / 2.0,
            y + if kind.is_empty() { 26.0 } else { 18.0 },
            escape(&title)
        );
        if !kind.is_empty() {
            let kind: String = kind.chars().take(30).collect();
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#546e7a\" font-size=\"11\">{}</text>",
                x + NODE_W / 2.0,
                y + 34.0,
                escape(&kind)
            );
        }
        out.push_str("</g>\n");
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_and_edge_is_drawn_and_text_is_escaped() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("pipeline.yaml"),
            "id: g\nentry: a\nstages:\n  a: { kind: print, content: \"<b>\" }\n  b: { kind: print, content: x }\nnext:\n  a: b\n  b: end\n",
        )
        .expect("write");
        let p = crate::definition::load_pipeline(dir.path()).expect("valid");
        let svg = pipeline_svg(&p);
        assert_eq!(svg.matches("<rect").count(), 4, "start, a, b, end");
        assert_eq!(svg.matches("marker-end").count(), 3, "start→a, a→b, b→end");
        assert!(!svg.contains("<b>"));
    }
}
