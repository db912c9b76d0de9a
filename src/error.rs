//! Error classes and stable codes (`Class/Code`) shared by every layer, and
//! the located validation diagnostic.
//!
//! Every error a user or a model can see maps, by an exhaustive match, to one
//! of eight classes and a stable code. The CLI maps outcomes to exit codes.

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

/// A position in a source file, 1-based. `line == 0` means unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Pos {
    pub line: u64,
    pub column: u64,
}

impl Pos {
    pub fn new(line: u64, column: u64) -> Self {
        Self { line, column }
    }

    /// Shifts a position found in an embedded document (frontmatter) by the
    /// number of lines that precede it in the file.
    pub fn offset_lines(self, lines: u64) -> Self {
        if self.line == 0 {
            self
        } else {
            Self::new(self.line + lines, self.column)
        }
    }
}

/// The error classes: the contract's eight, plus `Budget` (a run's token
/// or cost budget ran out), `Store` (the run store on disk) and
/// `Distributed` (siblings run by workers over NATS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ErrorClass {
    Validation,
    ProviderTransient,
    ProviderCapability,
    ToolTransient,
    ToolTerminal,
    Session,
    Cancellation,
    ExtensionHost,
    Budget,
    /// The run store on disk: run folders and their audit logs.
    Store,
    /// Runs spread over workers through NATS.
    Distributed,
    /// An MCP server the pipeline declares could not start, answer or
    /// list its tools, or lacks a tool a stage allows.
    Mcp,
    /// The control API: a run that cannot be reached or refuses a call.
    Control,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Validation => "Validation",
            ErrorClass::ProviderTransient => "ProviderTransient",
            ErrorClass::ProviderCapability => "ProviderCapability",
            ErrorClass::ToolTransient => "ToolTransient",
            ErrorClass::ToolTerminal => "ToolTerminal",
            ErrorClass::Session => "Session",
            ErrorClass::Cancellation => "Cancellation",
            ErrorClass::ExtensionHost => "ExtensionHost",
            ErrorClass::Budget => "Budget",
            ErrorClass::Store => "Store",
            ErrorClass::Distributed => "Distributed",
            ErrorClass::Mcp => "Mcp",
            ErrorClass::Control => "Control",
        }
    }
}

/// A stable error code: a class and a name, shown as `Class/Name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Code {
    pub class: ErrorClass,
    pub name: &'static str,
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.class.as_str(), self.name)
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `code: message`, the code said once: a message that already starts
/// with it (a diagnostic's, another layer's error) is left as it is.
pub fn with_code(code: &str, message: &str) -> String {
    if message
        .strip_prefix(code)
        .is_some_and(|rest| rest.starts_with(':'))
    {
        message.to_owned()
    } else {
        format!("{code}: {message}")
    }
}

/// An error with the chain of its causes, each said once (`error sending
/// request: client error (Connect): Connection refused`): what a client
/// library's top-level message leaves to its sources.
pub fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut message = String::new();
    let mut source = Some(err);
    while let Some(e) = source {
        let text = e.to_string();
        if !text.is_empty() && !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
        source = e.source();
    }
    message
}

/// A URL as given (parsed or not), as an error may quote it: without
/// what could be a secret in it (a user and password before `@`, a query,
/// a fragment).
pub fn url_shown(raw: &str) -> String {
    let raw = raw.trim();
    let raw = raw.split(['?', '#']).next().unwrap_or(raw);
    let (scheme, rest) = raw.split_once("://").unwrap_or(("", raw));
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    if scheme.is_empty() {
        rest.to_owned()
    } else {
        format!("{scheme}://{rest}")
    }
}

/// Anything that carries a stable code.
pub trait HasCode {
    fn code(&self) -> Code;
}

/// Why a pipeline failed to load. Each variant is one stable
/// `Validation/...` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValidationCode {
    /// The pipeline folder or its `pipeline.yaml` cannot be read.
    PipelineUnreadable,
    /// `pipeline.yaml` is not valid YAML or has a wrong shape.
    PipelineInvalid,
    /// A stage file fails the stage-definition rules (its
    /// frontmatter fields, their types and values).
    StageDefinitionInvalid,
    /// A stage file cannot be read: missing, not a file, not UTF-8.
    StageFileUnreadable,
    /// A stage file resolves outside the pipeline folder.
    StageFileOutsidePipeline,
    /// A stage file is larger than 1 MiB.
    StageFileTooLarge,
    /// The `stages:` key differs from the stage file's `id`.
    StageIdMismatch,
    /// A stage id is referenced but not declared.
    UnknownStage,
    /// An inline step has an unknown `kind`.
    UnknownStepKind,
    /// `allowedTools` names a tool no built-in or configured tool has.
    UnknownTool,
    /// `completionTool` equals a registered tool's name.
    CompletionToolCollision,
    /// A static `parallel` list has fewer than two stages, or a plan is malformed.
    InvalidParallelPlan,
    /// A `join` names no declared stage, or one of its own siblings.
    StageJoinDangling,
    /// A CEL expression does not parse.
    ExpressionInvalid,
    /// A CEL expression failed at run time (missing key, wrong type).
    ExpressionFailed,
    /// A template placeholder names an undeclared ctx field.
    StageCtxUnresolved,
    /// A template placeholder is outside `ctx.*` / `stage.*`, or names a
    /// reserved non-addressable field (`ctx.attempts`, `ctx.host`).
    TemplateNamespaceForbidden,
    /// A template has an unclosed `{{` or a malformed placeholder.
    TemplateSyntax,
    /// A template placeholder had no value at render time.
    TemplateUnresolved,
    /// `completionSchema` is not a valid JSON Schema.
    StageCompletionSchemaInvalid,
    /// `inputsSchema` is not a valid JSON Schema.
    StageInputsSchemaInvalid,
    /// An upstream result fails the stage's `inputsSchema` at run time.
    StageInputsInvalid,
    /// `pipeline.yaml` has a key troupe does not know (a typo, or a key in
    /// the wrong place): refused, so nothing is silently ignored.
    UnknownKey,
    /// A `--ctx` value, a required ctx field or a CLI flag is wrong.
    InputInvalid,
    /// A `script.yaml` for the scripted provider is malformed.
    ScriptInvalid,
    /// A `hooks:` entry in pipeline.yaml is malformed (slot, kind, command,
    /// timeout, tools).
    HookInvalid,
}

impl ValidationCode {
    pub fn name(self) -> &'static str {
        match self {
            ValidationCode::PipelineUnreadable => "PipelineUnreadable",
            ValidationCode::PipelineInvalid => "PipelineInvalid",
            ValidationCode::StageDefinitionInvalid => "StageDefinitionInvalid",
            ValidationCode::StageFileUnreadable => "StageFileUnreadable",
            ValidationCode::StageFileOutsidePipeline => "StageFileOutsidePipeline",
            ValidationCode::StageFileTooLarge => "StageFileTooLarge",
            ValidationCode::StageIdMismatch => "StageIdMismatch",
            ValidationCode::UnknownStage => "UnknownStage",
            ValidationCode::UnknownStepKind => "UnknownStepKind",
            ValidationCode::UnknownTool => "UnknownTool",
            ValidationCode::CompletionToolCollision => "CompletionToolCollision",
            ValidationCode::InvalidParallelPlan => "InvalidParallelPlan",
            ValidationCode::StageJoinDangling => "StageJoinDangling",
            ValidationCode::ExpressionInvalid => "ExpressionInvalid",
            ValidationCode::ExpressionFailed => "ExpressionFailed",
            ValidationCode::StageCtxUnresolved => "StageCtxUnresolved",
            ValidationCode::TemplateNamespaceForbidden => "TemplateNamespaceForbidden",
            ValidationCode::TemplateSyntax => "TemplateSyntax",
            ValidationCode::TemplateUnresolved => "TemplateUnresolved",
            ValidationCode::StageCompletionSchemaInvalid => "StageCompletionSchemaInvalid",
            ValidationCode::StageInputsSchemaInvalid => "StageInputsSchemaInvalid",
            ValidationCode::StageInputsInvalid => "StageInputsInvalid",
            ValidationCode::UnknownKey => "UnknownKey",
            ValidationCode::InputInvalid => "InputInvalid",
            ValidationCode::ScriptInvalid => "ScriptInvalid",
            ValidationCode::HookInvalid => "HookInvalid",
        }
    }
}

impl HasCode for ValidationCode {
    fn code(&self) -> Code {
        Code {
            class: ErrorClass::Validation,
            name: self.name(),
        }
    }
}

/// One located validation problem: what, where, and how to fix it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnostic {
    #[serde(serialize_with = "serialize_code")]
    pub code: ValidationCode,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

fn serialize_code<S: serde::Serializer>(code: &ValidationCode, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&code.code())
}

impl Diagnostic {
    pub fn new(code: ValidationCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            file: None,
            line: None,
            column: None,
            field: None,
            hint: None,
        }
    }

    pub fn file(mut self, file: impl Into<PathBuf>) -> Self {
        self.file = Some(file.into());
        self
    }

    /// Sets the position; an unknown position (line 0) is left out.
    pub fn at(mut self, pos: Pos) -> Self {
        if pos.line > 0 {
            self.line = Some(pos.line);
            self.column = Some(pos.column);
        }
        self
    }

    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl HasCode for Diagnostic {
    fn code(&self) -> Code {
        self.code.code()
    }
}

impl fmt::Display for Diagnostic {
    /// `file:line:col: Validation/Code: message (field `f`)` then the hint.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            if let (Some(line), Some(column)) = (self.line, self.column) {
                write!(f, ":{line}:{column}")?;
            }
            write!(f, ": ")?;
        }
        write!(f, "{}: {}", self.code.code(), self.message)?;
        if let Some(field) = &self.field {
            write!(f, " (field `{field}`)")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// Every problem found while loading a pipeline, reported all at once.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{} validation error(s)", .0.len())]
pub struct Diagnostics(pub Vec<Diagnostic>);
