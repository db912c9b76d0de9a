//! The tool manifest of a stage, part of its contract: its allowed tools
//! plus the stage-local completion channel, which every LLM stage has.

use super::model::StageDefinition;
use super::tool_catalog::{ToolSpec, builtin};

/// The description given to the completion channel.
pub fn completion_description(def: &StageDefinition) -> String {
    format!(
        "Finish the stage `{}`: call `{}` exactly once, as the only tool call in your response, with the stage result as arguments.",
        def.name, def.completion_tool
    )
}

/// Allowed built-in tools in declaration order, then the completion
/// channel.
pub fn stage_manifest(def: &StageDefinition) -> Vec<ToolSpec> {
    stage_manifest_with(def, Vec::new())
}

/// Allowed built-in tools in declaration order, then `mcp` (the allowed
/// tools of the run's MCP servers, as they list them), then the completion
/// channel.
pub fn stage_manifest_with(def: &StageDefinition, mcp: Vec<ToolSpec>) -> Vec<ToolSpec> {
    let mut tools: Vec<ToolSpec> = def
        .allowed_tools
        .iter()
        .filter_map(|t| builtin(t))
        .collect();
    tools.extend(mcp);
    tools.push(ToolSpec {
        name: def.completion_tool.to_string(),
        description: completion_description(def),
        parameters: def.completion_schema.document().clone(),
    });
    tools
}
