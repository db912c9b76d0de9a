//! Loads a pipeline folder into the immutable model: reads pipeline.yaml and
//! every stage file (bounded in size, confined to the folder), then
//! cross-checks stage references, joins and template placeholders. Every
//! problem is reported at once.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fields::FieldReader;
use super::model::{FORBIDDEN_CTX, Next, Pipeline, RESERVED_CTX, Stage, StageKind};
use super::pipeline_file::{PipelineDoc, StageSource, read_pipeline};
use super::stage_file::{ParsedStage, normalize_text, parse_stage_file};
use super::template::Template;
use super::yaml;
use crate::error::{Diagnostic, Diagnostics, Pos, ValidationCode};

/// Largest stage file or pipeline.yaml accepted.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The pipeline file inside a pipeline folder.
pub const PIPELINE_FILE: &str = "pipeline.yaml";

/// Loads the pipeline at `path` (its folder, or its pipeline.yaml) with the
/// built-in tool set.
pub fn load_pipeline(path: &Path) -> Result<Pipeline, Diagnostics> {
    load_pipeline_with(path, &super::tool_catalog::is_builtin)
}

/// Loads a pipeline; `is_tool` says which tool names are registered.
pub fn load_pipeline_with(
    path: &Path,
    is_tool: &dyn Fn(&str) -> bool,
) -> Result<Pipeline, Diagnostics> {
    let (dir, file) = locate(path).map_err(|d| Diagnostics(vec![*d]))?;
    let text = read_bounded(&file, ValidationCode::PipelineUnreadable)
        .map_err(|(code, message)| Diagnostics(vec![Diagnostic::new(code, message).file(&file)]))?;
    load_pipeline_text(&dir, &file, &text, is_tool)
}

/// Loads a pipeline from the text of its pipeline.yaml (`file` names it in
/// diagnostics); stage files are read from `dir`. The file-based loaders
/// end here; fuzzing and tests call it with text that is not on disk.
pub fn load_pipeline_text(
    dir: &Path,
    file: &Path,
    text: &str,
    is_tool: &dyn Fn(&str) -> bool,
) -> Result<Pipeline, Diagnostics> {
    let mut diags = Vec::new();
    let (dir, file) = (dir.to_owned(), file.to_owned());
    let text = normalize_text(text);
    let root = yaml::parse(&text).map_err(|e| {
        Diagnostics(vec![
            Diagnostic::new(
                ValidationCode::PipelineInvalid,
                format!("not valid YAML: {}", e.message),
            )
            .file(&file)
            .at(e.pos)
            .hint("indent with spaces, not tabs; quote strings containing `: ` or `#`"),
        ])
    })?;
    let doc = {
        let mut r = FieldReader::new(&file, 0, ValidationCode::PipelineInvalid, &mut diags);
        read_pipeline(&root, &mut r)
    };
    // `<server>__<tool>` of a declared server passes here; whether the
    // server has that tool is checked once it runs (`tools::mcp`).
    let servers = &doc.mcp_servers;
    let is_tool = &|name: &str| is_tool(name) || super::mcp::declares(name, servers);
    let mut stages = Vec::with_capacity(doc.stages.len());
    for entry in &doc.stages {
        match &entry.source {
            StageSource::Inline(kind) => stages.push(Stage {
                id: entry.id.clone(),
                kind: kind.clone(),
            }),
            StageSource::File { rel, pos } => {
                if let Some(parsed) =
                    load_stage_file(&dir, &file, &entry.id, rel, *pos, is_tool, &mut diags)
                {
                    stages.push(Stage {
                        id: entry.id.clone(),
                        kind: StageKind::Llm(Arc::new(parsed.definition)),
                    });
                }
            }
        }
    }
    for (stage, tool, pos) in &doc.tool_steps {
        if !is_tool(tool) {
            diags.push(
                Diagnostic::new(
                    ValidationCode::UnknownTool,
                    format!("tool step `{stage}` calls unknown tool `{tool}`"),
                )
                .file(&file)
                .at(*pos)
                .field(format!("stages.{stage}.tool"))
                .hint("a built-in tool (Read, Grep, Glob, Edit, Write, Bash, Echo) or `<server>__<tool>` of a server under `mcpServers:`"),
            );
        }
    }
    // A guard whose `tools:` names no tool would never run, silently: a
    // typo or a name of no declared server is refused as an unknown tool.
    for (i, hook) in doc.hooks.iter().enumerate() {
        for tool in hook.tools.iter().filter(|t| !is_tool(t)) {
            diags.push(
                Diagnostic::new(
                    ValidationCode::UnknownTool,
                    format!("hook `{}` names unknown tool `{tool}`", hook.name),
                )
                .file(&file)
                .field(format!("hooks[{i}].tools"))
                .hint("a built-in tool (Read, Grep, Glob, Edit, Write, Bash, Echo), `<server>__<tool>` or `<server>__*` of a server under `mcpServers:`"),
            );
        }
    }
    cross_check(&doc, &stages, &file, &mut diags);
    if !diags.is_empty() {
        return Err(Diagnostics(diags));
    }
    let entry = doc.entry.unwrap_or_default();
    let id = doc.id.unwrap_or_default();
    Ok(Pipeline {
        name: doc.name.unwrap_or_else(|| id.clone()),
        id,
        dir,
        entry,
        parallel_cap: doc.parallel_cap,
        max_visits: doc.max_visits,
        ctx: doc.ctx,
        stages,
        next: doc.next,
        asserts: doc.asserts,
        gates: doc.gates,
        hooks: doc.hooks,
        provider: doc.provider,
        mcp_servers: doc.mcp_servers,
    })
}

/// Accepts a folder or a path to its pipeline.yaml.
fn locate(path: &Path) -> Result<(PathBuf, PathBuf), Box<Diagnostic>> {
    let unreadable = |message: String, hint: &str| {
        Box::new(
            Diagnostic::new(ValidationCode::PipelineUnreadable, message)
                .file(path)
                .hint(hint),
        )
    };
    if path.is_dir() {
        let file = path.join(PIPELINE_FILE);
        if file.is_file() {
            Ok((path.to_owned(), file))
        } else {
            Err(unreadable(
                format!("no {PIPELINE_FILE} in this folder"),
                "a pipeline is a folder with a pipeline.yaml and one .md file per LLM stage",
            ))
        }
    } else if path.is_file() {
        let dir = path
            .parent()
            .map(Path::to_owned)
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        Ok((dir, path.to_owned()))
    } else {
        Err(unreadable(
            "no such pipeline folder".to_owned(),
            "pass the folder that holds pipeline.yaml, e.g. stages/code-review",
        ))
    }
}

/// Reads at most MAX_FILE_BYTES of UTF-8 text.
/// Reads a file of at most 1 MiB of UTF-8; a file that cannot be read (or
/// is not a regular file, or not UTF-8) is `unreadable` (the pipeline's or
/// a stage file's code).
fn read_bounded(
    file: &Path,
    unreadable_code: ValidationCode,
) -> Result<String, (ValidationCode, String)> {
    let unreadable = |e: std::io::Error| (unreadable_code, format!("cannot read: {e}"));
    // Opened without waiting: opening a FIFO to read waits for a writer,
    // forever if none comes, before it could be told from a file. (On a
    // regular file the flag changes nothing.)
    let handle = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(file)
            .map_err(unreadable)?
    };
    let meta = handle.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err((unreadable_code, "not a regular file".to_owned()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err((
            ValidationCode::StageFileTooLarge,
            format!(
                "file is {} bytes; the limit is {MAX_FILE_BYTES} (1 MiB)",
                meta.len()
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // take() guards against a file that grows between stat and read.
    handle
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err((
            ValidationCode::StageFileTooLarge,
            format!("file is over the {MAX_FILE_BYTES}-byte (1 MiB) limit"),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        (
            unreadable_code,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

fn load_stage_file(
    dir: &Path,
    pipeline_file: &Path,
    id: &str,
    rel: &str,
    pos: Pos,
    is_tool: &dyn Fn(&str) -> bool,
    diags: &mut Vec<Diagnostic>,
) -> Option<ParsedStage> {
    let field = format!("stages.{id}");
    let at_ref = |code: ValidationCode, message: String, hint: &str| {
        Diagnostic::new(code, message)
            .file(pipeline_file)
            .at(pos)
            .field(&field)
            .hint(hint)
    };
    let path = dir.join(rel);
    let (Ok(canonical_dir), Ok(canonical)) = (dir.canonicalize(), path.canonicalize()) else {
        diags.push(at_ref(
            ValidationCode::StageFileUnreadable,
            format!("stage file `{rel}` not found"),
            "paths are relative to the pipeline folder",
        ));
        return None;
    };
    if !canonical.starts_with(&canonical_dir) {
        diags.push(at_ref(ValidationCode::StageFileOutsidePipeline, format!("stage file `{rel}` is outside the pipeline folder"), "keep every stage file inside the pipeline folder (no `..`, absolute paths or symlinks out)"));
        return None;
    }
    let text = match read_bounded(&canonical, ValidationCode::StageFileUnreadable) {
        Ok(text) => text,
        Err((code, message)) => {
            diags.push(Diagnostic::new(code, message).file(&path));
            return None;
        }
    };
    let parsed = parse_stage_file(&path, &text, is_tool, diags)?;
    if parsed.definition.id != id {
        diags.push(
            Diagnostic::new(
                ValidationCode::StageIdMismatch,
                format!(
                    "`stages.{id}` points at a file whose id is `{}`",
                    parsed.definition.id
                ),
            )
            .file(&path)
            .at(parsed.id_pos)
            .field("id")
            .hint("the key under `stages:` and the file's `id` must be the same"),
        );
        return None;
    }
    Some(parsed)
}

/// Checks everything that spans files: stage references, joins, routers,
/// template placeholders.
fn cross_check(doc: &PipelineDoc, stages: &[Stage], file: &Path, diags: &mut Vec<Diagnostic>) {
    let declared = |id: &str| doc.declared.iter().any(|s| s == id);
    let at = |code: ValidationCode, pos: Pos, field: &str, message: String, hint: &str| {
        Diagnostic::new(code, message)
            .file(file)
            .at(pos)
            .field(field)
            .hint(hint)
    };
    let known = doc
        .stages
        .iter()
        .map(|s| s.id.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let unknown_hint = format!("declared stages: {known}");
    for r in doc.refs.iter().chain(&doc.next_keys) {
        if !declared(&r.id) {
            diags.push(at(
                ValidationCode::UnknownStage,
                r.pos,
                &r.field,
                format!("unknown stage `{}`", r.id),
                &unknown_hint,
            ));
        }
    }
    for key in &doc.next_keys {
        if let Some(stage) = stages.iter().find(|s| s.id == key.id)
            && stage.kind.is_router()
        {
            diags.push(at(
                ValidationCode::PipelineInvalid,
                key.pos,
                &key.field,
                format!(
                    "`{}` is a {} step and routes by itself",
                    key.id,
                    stage.kind.kind_name()
                ),
                "remove its `next` entry; its cases/branches say where to go",
            ));
        }
    }
    for join in &doc.joins {
        if !declared(&join.join) {
            diags.push(at(
                ValidationCode::StageJoinDangling,
                join.pos,
                &join.field,
                format!("join `{}` names no declared stage", join.join),
                &unknown_hint,
            ));
        } else if join.siblings.contains(&join.join) {
            diags.push(at(
                ValidationCode::StageJoinDangling,
                join.pos,
                &join.field,
                format!("join `{}` is one of its own siblings", join.join),
                "the join runs after the siblings; name a different stage",
            ));
        }
    }
    for (from, next) in &doc.next {
        if let Next::Parallel(plan) = next {
            for id in plan.siblings.stages() {
                if let Some(stage) = stages.iter().find(|s| &s.id == id)
                    && stage.kind.is_router()
                {
                    let pos = doc
                        .next_keys
                        .iter()
                        .find(|k| &k.id == from)
                        .map_or(Pos::default(), |k| k.pos);
                    diags.push(at(
                        ValidationCode::InvalidParallelPlan,
                        pos,
                        &format!("next.{from}"),
                        format!("sibling `{id}` is a {} step", stage.kind.kind_name()),
                        "a parallel sibling is one stage execution; route after the join instead",
                    ));
                }
            }
        }
    }
    for stage in stages {
        let map_target = doc.map_targets.contains(&stage.id);
        match &stage.kind {
            StageKind::Llm(def) => {
                let body = def.body.source();
                let mut cursor = LineCursor::new(body);
                let mut locate = |offset: usize| {
                    let (line, column) = cursor.at(offset);
                    Pos::new(line + def.body_line - 1, column)
                };
                check_placeholders(&def.body, doc, map_target, &def.file, &mut locate, diags);
            }
            StageKind::Print { content } => {
                let pos = doc
                    .print_templates
                    .iter()
                    .find(|(id, _)| id == &stage.id)
                    .map_or(Pos::default(), |(_, p)| *p);
                check_placeholders(content, doc, map_target, file, &mut |_| pos, diags);
            }
            _ => {}
        }
    }
}

fn check_placeholders(
    template: &Template,
    doc: &PipelineDoc,
    map_target: bool,
    file: &Path,
    locate: &mut dyn FnMut(usize) -> Pos,
    diags: &mut Vec<Diagnostic>,
) {
    for ph in template.placeholders() {
        let at = locate(ph.offset);
        let report = |code: ValidationCode, message: String, hint: &str| {
            Diagnostic::new(code, message)
                .file(file)
                .at(at)
                .field("body")
                .hint(hint)
        };
        let text = &ph.text;
        match (ph.namespace(), ph.field()) {
            ("ctx", Some(field)) if FORBIDDEN_CTX.contains(&field) => diags.push(report(
                ValidationCode::TemplateNamespaceForbidden,
                format!("`{{{{{text}}}}}`: ctx.{field} is not addressable in templates"),
                "retry reasons arrive as messages, not through the prompt; the host API is not a value",
            )),
            ("ctx", Some("item" | "index")) if !map_target => diags.push(report(
                ValidationCode::StageCtxUnresolved,
                format!("`{{{{{text}}}}}`: ctx.item and ctx.index exist only in `map` siblings"),
                "this stage is not the target of any `parallel: {map: ..., over: ...}`",
            )),
            ("ctx", Some(field)) if RESERVED_CTX.contains(&field) => {}
            ("ctx", Some(field)) if doc.ctx.iter().any(|f| f.name == field) => {}
            ("ctx", Some(field)) => diags.push(report(
                ValidationCode::StageCtxUnresolved,
                format!("`{{{{{text}}}}}`: ctx field `{field}` is not declared"),
                &format!("declare it under `ctx:` in pipeline.yaml, e.g. `ctx: {{ {field}: {{ required: true }} }}`"),
            )),
            ("stage", Some("id" | "name")) if ph.path.len() == 2 => {}
            ("ctx" | "stage", _) => diags.push(report(
                ValidationCode::TemplateNamespaceForbidden,
                format!("`{{{{{text}}}}}` is not an addressable placeholder"),
                "use ctx.<field>, ctx.upstream[i].parsed.<path>, stage.id or stage.name",
            )),
            (ns, _) => diags.push(report(
                ValidationCode::TemplateNamespaceForbidden,
                format!("`{{{{{text}}}}}`: namespace `{ns}` is not allowed"),
                "templates may read only ctx.* and stage.*; environment values never reach a prompt",
            )),
        }
    }
}

/// Line and column (1-based, columns in characters) of increasing byte
/// offsets in one text, found in one pass: `line_col` per placeholder
/// rescanned the text from its start, so a 1 MiB body of placeholders took
/// quadratic time to validate.
struct LineCursor<'t> {
    text: &'t str,
    offset: usize,
    line: u64,
    column: u64,
}

impl<'t> LineCursor<'t> {
    fn new(text: &'t str) -> Self {
        Self {
            text,
            offset: 0,
            line: 1,
            column: 1,
        }
    }

    /// The position of `offset` (clamped to the text, rounded down to a
    /// character boundary); an offset behind the last one restarts the walk.
    fn at(&mut self, offset: usize) -> (u64, u64) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        if offset < self.offset {
            *self = Self::new(self.text);
        }
        for c in self.text[self.offset..offset].chars() {
            if c == '\n' {
                self.line += 1;
                self.column = 1;
            } else {
                self.column += 1;
            }
        }
        self.offset = offset;
        (self.line, self.column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::template::line_col;

    #[test]
    fn line_cursor_agrees_with_line_col() {
        let text = "ab\ncdé{{x}}\n\n😀 {{y}}\nlast";
        let boundaries: Vec<usize> = (0..=text.len())
            .filter(|i| text.is_char_boundary(*i))
            .collect();
        let mut cursor = LineCursor::new(text);
        for &offset in &boundaries {
            assert_eq!(cursor.at(offset), line_col(text, offset), "{offset}");
        }
        // Going back restarts the walk.
        assert_eq!(cursor.at(4), line_col(text, 4));
    }
}
