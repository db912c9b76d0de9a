//! A server's tool listing: each tool's name, description and input schema
//! as the server declared it, the schema compiled once to check arguments
//! before a call leaves troupe. A schema that is not a valid JSON Schema
//! object is a typed error at discovery, not a surprise at the first call.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::Value;

use super::McpError;
use crate::definition::ToolSpec;
use crate::tools::ToolError;

/// One listed tool.
#[derive(Debug)]
pub struct McpTool {
    /// The server's own name for it.
    pub name: String,
    pub description: String,
    pub schema: Value,
    validator: jsonschema::Validator,
}

/// Bytes of a tool's description a model is sent, at most (every request
/// that offers the tool carries it); longer is cut.
const MOST_DESCRIPTION: usize = 4096;

/// Bytes of a tool's inputSchema (as JSON), at most; a larger one makes
/// the tool unusable (left out with a warning, as a bad schema is).
const MOST_SCHEMA: usize = 64 * 1024;

impl McpTool {
    /// Reads one entry of `tools/list` (its JSON).
    pub fn from_listed(server: &str, tool: &Value) -> Result<McpTool, McpError> {
        // Offered to a model as `server__tool`: a function name of at
        // most 64 letters, digits, `_` and `-` (what OpenAI accepts).
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| {
                crate::definition::fields::is_tool_name(&crate::definition::mcp::tool_name(
                    server, n,
                ))
            })
            .ok_or_else(|| {
                McpError::new(
                    "InvalidListing",
                    format!(
                        "MCP server `{server}` lists a tool whose name cannot be offered to a model as `{server}__<name>` (at most 64 letters, digits, _ and -): {}",
                        short(tool)
                    ),
                )
            })?
            .to_owned();
        // A tool that can only be called as a task (MCP's tasks, which
        // troupe does not run) fails every plain call: not offered.
        if tool
            .pointer("/execution/taskSupport")
            .and_then(Value::as_str)
            == Some("required")
        {
            return Err(McpError::new(
                "InvalidListing",
                format!(
                    "MCP server `{server}` lists tool `{name}` as callable only as a task (execution.taskSupport: required), which troupe does not run"
                ),
            ));
        }
        let schema = tool.get("inputSchema").cloned().unwrap_or(Value::Null);
        // Sent with every request that offers the tool.
        let schema_bytes = schema.to_string().len();
        if schema_bytes > MOST_SCHEMA {
            return Err(McpError::new(
                "InvalidSchema",
                format!(
                    "MCP server `{server}` lists tool `{name}` whose inputSchema takes {schema_bytes} bytes, over the {MOST_SCHEMA} troupe sends a model"
                ),
            ));
        }
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(McpError::new(
                "InvalidSchema",
                format!(
                    "MCP server `{server}` lists tool `{name}` whose inputSchema is not an object schema"
                ),
            ));
        }
        let validator = jsonschema::validator_for(&schema).map_err(|e| {
            McpError::new(
                "InvalidSchema",
                format!(
                    "MCP server `{server}` lists tool `{name}` with an invalid inputSchema: {e}"
                ),
            )
        })?;
        let mut description = tool
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if description.len() > MOST_DESCRIPTION {
            description.truncate(super::result::char_floor(&description, MOST_DESCRIPTION));
            description.push_str(" […]");
        }
        Ok(McpTool {
            name,
            description,
            schema,
            validator,
        })
    }

    /// The tool as a model sees it, under `full_name`.
    pub fn spec(&self, full_name: &str) -> ToolSpec {
        ToolSpec {
            name: full_name.to_owned(),
            description: self.description.clone(),
            parameters: self.schema.clone(),
        }
    }

    /// Checks arguments against the tool's schema; the model reads every
    /// problem with its place.
    pub fn check_args(&self, args: &Value) -> Result<(), ToolError> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(args)
            .take(5)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("{at}: {e}")
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ToolError::invalid_args(format!(
                "arguments do not match `{}`'s schema: {}",
                self.name,
                problems.join("; ")
            )))
        }
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 200 {
        format!("{}…", &s[..super::result::char_floor(&s, 200)])
    } else {
        s
    }
}

/// What a server listed: the tools troupe can offer, and those it
/// cannot (a name no model accepts, a schema that is not one), each with
/// why. One unusable tool does not cost the server's others.
#[derive(Debug, Default)]
pub struct Listed {
    pub tools: Vec<McpTool>,
    pub unusable: Vec<(String, McpError)>,
}

impl Listed {
    /// Reads the entries of `tools/list` (their JSON).
    pub fn from_entries(server: &str, entries: &[Value]) -> Listed {
        let mut listed = Listed::default();
        for entry in entries {
            match McpTool::from_listed(server, entry) {
                Ok(tool) => listed.tools.push(tool),
                Err(e) => {
                    let name = entry
                        .get("name")
                        .and_then(Value::as_str)
                        .map_or_else(|| short(entry), str::to_owned);
                    listed.unusable.push((name, e));
                }
            }
        }
        listed
    }
}

/// The tools of one server, by name.
#[derive(Debug, Default)]
pub struct Listing {
    tools: BTreeMap<String, Arc<McpTool>>,
    unusable: BTreeMap<String, McpError>,
    /// Bumped on every refresh.
    pub generation: u64,
}

impl Listing {
    pub fn new(listed: Listed, generation: u64) -> Listing {
        Listing {
            tools: listed
                .tools
                .into_iter()
                .map(|t| (t.name.clone(), Arc::new(t)))
                .collect(),
            unusable: listed.unusable.into_iter().collect(),
            generation,
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<McpTool>> {
        self.tools.get(name).cloned()
    }

    /// Why a listed tool cannot be offered, when it cannot.
    pub fn unusable(&self, name: &str) -> Option<&McpError> {
        self.unusable.get(name)
    }

    /// Every listed tool that cannot be offered, with why.
    pub fn unusable_tools(&self) -> impl Iterator<Item = (&String, &McpError)> {
        self.unusable.iter()
    }

    pub fn tools(&self) -> impl Iterator<Item = &Arc<McpTool>> {
        self.tools.values()
    }

    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

/// The latest listing of a server, shared by its connection (which
/// refreshes it) and the calls (which read it). Each `tools/list_changed`
/// the server sends is a ticket; a listing is asked for under the ticket
/// current when it starts, and installed only if no listing asked for
/// later is already in: two listings that overlap (a call's refresh, the
/// notification's own) cannot put the older list back.
#[derive(Debug, Default)]
pub struct ListingCell {
    /// The listing, and the ticket it was asked for under.
    current: RwLock<(Arc<Listing>, u64)>,
    /// Notifications so far.
    asked: AtomicU64,
    /// A listing for a notification is under way (they coalesce: a
    /// server that sends thousands gets a few listings, not thousands).
    listing: AtomicBool,
}

impl ListingCell {
    pub fn get(&self) -> Arc<Listing> {
        Arc::clone(&self.read().0)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, (Arc<Listing>, u64)> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The server said its list changed; a fresh listing is on its way.
    pub fn mark_stale(&self) {
        self.asked.fetch_add(1, Ordering::SeqCst);
    }

    /// The ticket a listing starting now is asked for under.
    pub fn ticket(&self) -> u64 {
        self.asked.load(Ordering::SeqCst)
    }

    /// A fresh listing (asked for under `ticket`) could not be had: the
    /// current one stays, and is no longer taken as stale up to it.
    pub fn keep_stale_listing(&self, ticket: u64) {
        let mut cell = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cell.1 = cell.1.max(ticket);
    }

    /// Whether the server said its list changed since the listing in.
    pub fn is_stale(&self) -> bool {
        self.read().1 < self.ticket()
    }

    /// Claims the listing for notifications; `false` when one is under
    /// way already (it lists again for what came meanwhile).
    pub fn claim(&self) -> bool {
        !self.listing.swap(true, Ordering::SeqCst)
    }

    /// Lets the claim go.
    pub fn release(&self) {
        self.listing.store(false, Ordering::SeqCst);
    }

    /// Installs `listed`, asked for under `ticket`, one generation on;
    /// not if a listing asked for later is already in.
    pub fn replace(&self, listed: Listed, ticket: u64) {
        let mut cell = self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ticket < cell.1 {
            return;
        }
        let generation = cell.0.generation + 1;
        *cell = (Arc::new(Listing::new(listed, generation)), ticket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(name: &str) -> Listed {
        Listed::from_entries(
            "s",
            &[json!({"name": name, "inputSchema": {"type": "object"}})],
        )
    }

    /// A long description is cut; a schema too large to send with every
    /// request makes its tool unusable, not the server.
    #[test]
    fn long_descriptions_are_cut_and_huge_schemas_refused() {
        let long = "é".repeat(MOST_DESCRIPTION);
        let tool = McpTool::from_listed(
            "s",
            &json!({"name": "t", "description": long, "inputSchema": {"type": "object"}}),
        )
        .unwrap();
        assert!(tool.description.len() <= MOST_DESCRIPTION + 8);
        assert!(tool.description.ends_with(" […]"));
        let wide: serde_json::Map<String, Value> = (0..MOST_SCHEMA / 16)
            .map(|i| (format!("property_{i:06}"), json!({"type": "string"})))
            .collect();
        let listed = Listed::from_entries(
            "s",
            &[
                json!({"name": "huge", "inputSchema": {"type": "object", "properties": wide}}),
                json!({"name": "fine", "inputSchema": {"type": "object"}}),
            ],
        );
        assert_eq!(listed.tools.len(), 1);
        assert_eq!(listed.unusable.len(), 1);
        assert_eq!(listed.unusable[0].1.code, "InvalidSchema");
    }

    /// A tool callable only as a task is not offered (every plain call
    /// of it fails); one that may be called either way is.
    #[test]
    fn a_tool_that_must_run_as_a_task_is_not_offered() {
        let listed = Listed::from_entries(
            "s",
            &[
                json!({"name": "research", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}}),
                json!({"name": "either", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}}),
            ],
        );
        assert_eq!(listed.tools.len(), 1);
        assert_eq!(listed.tools[0].name, "either");
        assert_eq!(listed.unusable[0].0, "research");
        assert!(listed.unusable[0].1.message.contains("task"));
    }

    /// Two listings that overlap: the one asked for after the later
    /// notification stays in, whichever finishes last.
    #[test]
    fn an_older_listing_finishing_last_does_not_put_its_list_back() {
        let cell = ListingCell::default();
        cell.replace(one("first"), cell.ticket());
        assert!(!cell.is_stale());
        cell.mark_stale();
        let older = cell.ticket();
        cell.mark_stale();
        let newer = cell.ticket();
        assert!(cell.is_stale());
        cell.replace(one("newer"), newer);
        assert!(!cell.is_stale());
        cell.replace(one("older"), older);
        assert_eq!(cell.get().len(), 1);
        assert!(cell.get().get("newer").is_some(), "{:?}", cell.get());
        // A failed listing leaves the list and is not stale up to it.
        cell.mark_stale();
        let failed = cell.ticket();
        cell.keep_stale_listing(failed);
        assert!(!cell.is_stale());
        // One claim at a time.
        assert!(cell.claim());
        assert!(!cell.claim());
        cell.release();
        assert!(cell.claim());
    }
}
