//! Fuzzes the scripted provider's `script.yaml`, checked against each
//! bundled pipeline, then renders the parsed turns.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use troupe::definition::Pipeline;
use troupe::provider::script::{Reply, Script};

fn pipelines() -> &'static [Pipeline] {
    static PIPELINES: OnceLock<Vec<Pipeline>> = OnceLock::new();
    PIPELINES.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stages");
        ["code-review", "fanout", "ralph", "triage"]
            .iter()
            .filter_map(|p| troupe::definition::load_pipeline(&root.join(p)).ok())
            .collect()
    })
}

fuzz_target!(|text: &str| {
    for pipeline in pipelines() {
        let Ok(script) = Script::parse_str(Path::new("script.yaml"), text, pipeline) else {
            continue;
        };
        for stage in &pipeline.stages {
            for index in [None, Some(0), Some(17)] {
                let Some(turns) = script.for_execution(&stage.id, index) else {
                    continue;
                };
                for turn in &turns.turns {
                    render(&turn.reply);
                }
            }
        }
    }
});

/// Renders a turn with every placeholder answering a small number.
fn render(reply: &Reply) {
    let resolve = |_: &[troupe::definition::template::Segment]| Ok(serde_json::Value::from(3));
    match reply {
        Reply::Text(t) => {
            let _ = t.render_with(resolve);
        }
        Reply::Calls(calls) => {
            for call in calls {
                same_both_ways(&call.args, &resolve);
            }
        }
        Reply::Complete(v) => same_both_ways(v, &resolve),
        Reply::Fail { .. } => {}
    }
}

/// What the offline provider writes (`render_json`) is the value `render`
/// builds, serialized: the same bytes, or the same error.
fn same_both_ways(
    t: &troupe::provider::script::ValueTemplate,
    resolve: &dyn Fn(&[troupe::definition::template::Segment]) -> Result<serde_json::Value, String>,
) {
    let direct = t.render_json(resolve);
    let through_value = t
        .render(resolve)
        .map(|v| troupe::definition::template::json_text(&v));
    assert_eq!(direct, through_value);
}
