//! Load-time validation: every `Validation/*` code
//! has a failing fixture with an assertion on the code and the location.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Fixture, stage_md};
use troupe::definition::load_pipeline;
use troupe::error::{Diagnostic, ValidationCode as V};

fn errors(f: &Fixture) -> Vec<Diagnostic> {
    match load_pipeline(f.path()) {
        Ok(p) => panic!("expected validation errors, pipeline `{}` loaded", p.id),
        Err(d) => d.0,
    }
}

/// Exactly one diagnostic, with this code, in this file, at this line.
fn single(f: &Fixture, code: V, file: &str, line: u64) -> Diagnostic {
    let errs = errors(f);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let d = errs.into_iter().next().unwrap();
    assert_eq!(d.code, code, "{d:#?}");
    assert_eq!(d.file.as_deref(), Some(f.file(file).as_path()), "{d:#?}");
    assert_eq!(d.line, Some(line), "{d:#?}");
    assert!(d.column.is_some_and(|c| c >= 1), "{d:#?}");
    d
}

#[test]
fn acceptance_01_missing_required_field_names_file_line_and_field() {
    for field in [
        "id",
        "name",
        "allowedTools",
        "completionTool",
        "completionSchema",
        "retryPolicy",
        "turnCap",
        "resolutionPolicy",
    ] {
        let full = stage_md("a", "", "Task: {{ctx.task}}");
        let mut skipping = false;
        let text: String = full
            .lines()
            .filter(|l| {
                if !l.starts_with(' ') {
                    skipping = l.starts_with(&format!("{field}:"));
                }
                !skipping
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let f = Fixture::linear(&[("a.md", &text)]);
        let d = single(&f, V::StageDefinitionInvalid, "a.md", 2);
        assert_eq!(d.field.as_deref(), Some(field));
        assert!(d.message.contains(field), "{}", d.message);
    }
}

#[test]
fn acceptance_02_turn_cap_zero() {
    let f = Fixture::linear(&[(
        "a.md",
        &stage_md("a", "", "x").replace("turnCap: 5", "turnCap: 0"),
    )]);
    let d = single(&f, V::StageDefinitionInvalid, "a.md", 14);
    assert_eq!(d.field.as_deref(), Some("turnCap"));
}

#[test]
fn acceptance_03_undeclared_ctx_field() {
    let f = Fixture::linear(&[(
        "a.md",
        &stage_md("a", "", "line one\nUse {{ctx.nope}} here"),
    )]);
    let d = single(&f, V::StageCtxUnresolved, "a.md", 18);
    assert_eq!(d.column, Some(5));
    assert!(d.message.contains("nope"));
}

#[test]
fn acceptance_04_env_namespace_is_forbidden() {
    let f = Fixture::linear(&[("a.md", &stage_md("a", "", "Home: {{env.HOME}}"))]);
    let d = single(&f, V::TemplateNamespaceForbidden, "a.md", 17);
    assert_eq!(d.column, Some(7));
}

#[test]
fn reserved_ctx_fields_and_stage_fields_are_not_addressable() {
    for body in [
        "{{ctx.attempts}}",
        "{{ctx.host.x}}",
        "{{stage.turnCap}}",
        "{{stage.id.x}}",
    ] {
        let f = Fixture::linear(&[("a.md", &stage_md("a", "", body))]);
        single(&f, V::TemplateNamespaceForbidden, "a.md", 17);
    }
}

#[test]
fn ctx_item_outside_a_map_sibling_is_unresolved() {
    let f = Fixture::linear(&[("a.md", &stage_md("a", "", "{{ctx.item}}"))]);
    single(&f, V::StageCtxUnresolved, "a.md", 17);
}

#[test]
fn acceptance_05_invalid_completion_schema() {
    for schema in [
        "completionSchema: { type: objekt }",
        "completionSchema: [1, 2]",
        "completionSchema: { type: string }",
    ] {
        let text = stage_md("a", "", "x").replace(
            "completionSchema:\n  type: object\n  required: [summary]\n  properties:\n    summary: { type: string }",
            schema,
        );
        let f = Fixture::linear(&[("a.md", &text)]);
        let d = single(&f, V::StageCompletionSchemaInvalid, "a.md", 6);
        assert_eq!(d.field.as_deref(), Some("completionSchema"));
    }
}

#[test]
fn invalid_inputs_schema() {
    let f = Fixture::linear(&[(
        "a.md",
        &stage_md("a", "inputsSchema: { required: nope }\n", "x"),
    )]);
    single(&f, V::StageInputsSchemaInvalid, "a.md", 16);
}

#[test]
fn acceptance_06_completion_tool_collides_with_builtin() {
    let f = Fixture::linear(&[(
        "a.md",
        &stage_md("a", "", "x").replace("completionTool: submit_a", "completionTool: Read"),
    )]);
    let d = single(&f, V::CompletionToolCollision, "a.md", 5);
    assert_eq!(d.column, Some(17));
}

#[test]
fn acceptance_07_join_undeclared_or_own_sibling() {
    let yaml = |join: &str| {
        format!(
            "id: demo\nentry: a\nstages:\n  a: a.md\n  b: b.md\n  c: c.md\n  d: d.md\nnext:\n  a: {{ parallel: [b, c], join: {join} }}\n"
        )
    };
    let files = [
        ("a.md", stage_md("a", "", "x")),
        ("b.md", stage_md("b", "", "x")),
        ("c.md", stage_md("c", "", "x")),
        ("d.md", stage_md("d", "", "x")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(n, c)| (*n, c.as_str())).collect();
    let f = Fixture::new(&yaml("zzz"), &files);
    let d = single(&f, V::StageJoinDangling, "pipeline.yaml", 9);
    assert!(d.message.contains("zzz"));
    let f = Fixture::new(&yaml("c"), &files);
    let d = single(&f, V::StageJoinDangling, "pipeline.yaml", 9);
    assert!(d.message.contains("own siblings"));
    let f = Fixture::new(&yaml("d"), &files);
    assert!(load_pipeline(f.path()).is_ok());
    // map: the join may not be the mapped stage
    let map = "id: demo\nentry: a\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: { parallel: { map: b, over: \"[1, 2]\" }, join: b }\n";
    let f = Fixture::new(map, &files[..2]);
    single(&f, V::StageJoinDangling, "pipeline.yaml", 7);
}

#[test]
fn acceptance_08_three_independent_errors_all_reported() {
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  b: b.md\n  c: c.md\nnext:\n  a: { parallel: [b, c], join: nowhere }\n",
        &[
            (
                "a.md",
                &stage_md("a", "", "x").replace("turnCap: 5", "turnCap: 0"),
            ),
            ("b.md", &stage_md("b", "", "{{ctx.nope}}")),
            ("c.md", &stage_md("c", "", "x")),
        ],
    );
    let mut codes: Vec<V> = errors(&f).into_iter().map(|d| d.code).collect();
    codes.sort_by_key(|c| c.name());
    assert_eq!(
        codes,
        vec![
            V::StageCtxUnresolved,
            V::StageDefinitionInvalid,
            V::StageJoinDangling
        ]
    );
}

#[test]
fn acceptance_09_unknown_frontmatter_keys_are_ignored() {
    let f = Fixture::linear(&[(
        "a.md",
        &stage_md(
            "a",
            "owner: platform-team\nx-custom: { nested: [1, 2] }\n",
            "Task: {{ctx.task}}",
        ),
    )]);
    let p = load_pipeline(f.path()).expect("loads");
    assert_eq!(p.stages.len(), 2);
}

/// A completion schema that leaves out `type` describes an object all the
/// same (a payload is a tool call's arguments): it is sent with `type:
/// object`, which OpenAI requires of a tool's parameters.
#[test]
fn a_completion_schema_without_a_type_is_sent_as_an_object() {
    let f = Fixture::linear(&[(
        "a.md",
        &stage_md("a", "", "Task: {{ctx.task}}")
            .replace("completionSchema:\n  type: object\n", "completionSchema:\n"),
    )]);
    let p = load_pipeline(f.path()).expect("loads");
    let Some(troupe::definition::StageKind::Llm(def)) = p.stage("a").map(|s| &s.kind) else {
        panic!("an LLM stage");
    };
    assert_eq!(def.completion_schema.document()["type"], "object");
    assert!(def.completion_schema.document()["properties"].is_object());
}

#[test]
fn stage_id_mismatch() {
    let f = Fixture::linear(&[("b.md", &stage_md("bee", "", "x"))]);
    let d = single(&f, V::StageIdMismatch, "b.md", 2);
    assert!(d.message.contains("bee"));
}

#[test]
fn non_kebab_ids_are_rejected() {
    let f = Fixture::linear(&[(
        "b.md",
        &stage_md("b", "", "x").replace("id: b", "id: Build_B"),
    )]);
    let errs = errors(&f);
    assert!(
        errs.iter().any(|d| d.code == V::StageDefinitionInvalid
            && d.field.as_deref() == Some("id")
            && d.line == Some(2)),
        "{errs:#?}"
    );
    let f = Fixture::new(
        "id: Demo\nentry: a\nstages:\n  a: a.md\n",
        &[("a.md", &stage_md("a", "", "x"))],
    );
    single(&f, V::PipelineInvalid, "pipeline.yaml", 1);
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  Bad_Id: a.md\n",
        &[("a.md", &stage_md("a", "", "x"))],
    );
    single(&f, V::PipelineInvalid, "pipeline.yaml", 5);
}

#[test]
fn unknown_tool_points_at_the_list_item() {
    let f = Fixture::linear(&[(
        "a.md",
        &stage_md("a", "", "x").replace(
            "allowedTools: [Read]",
            "allowedTools:\n  - Read\n  - read_file",
        ),
    )]);
    let d = single(&f, V::UnknownTool, "a.md", 6);
    assert!(d.message.contains("read_file"));
    let f = Fixture::linear(&[(
        "a.md",
        &stage_md("a", "", "x").replace("allowedTools: [Read]", "allowedTools: [grep]"),
    )]);
    let d = single(&f, V::UnknownTool, "a.md", 4);
    assert!(d.hint.as_deref().unwrap_or("").contains("Grep"), "{d:?}");
}

#[test]
fn static_parallel_needs_two_distinct_stages() {
    let files = [
        ("a.md", stage_md("a", "", "x")),
        ("b.md", stage_md("b", "", "x")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(n, c)| (*n, c.as_str())).collect();
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: { parallel: [b] }\n",
        &files,
    );
    single(&f, V::InvalidParallelPlan, "pipeline.yaml", 7);
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: { parallel: [b, b] }\n",
        &files,
    );
    single(&f, V::InvalidParallelPlan, "pipeline.yaml", 7);
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: { join: b }\n",
        &files,
    );
    single(&f, V::InvalidParallelPlan, "pipeline.yaml", 7);
}

#[test]
fn caps_and_visits_below_one() {
    let a = stage_md("a", "", "x");
    for (key, line) in [
        ("parallelCap: 0", 3),
        ("maxVisits: -2", 3),
        ("parallelCap: lots", 3),
    ] {
        let f = Fixture::new(
            &format!("id: demo\nentry: a\n{key}\nstages:\n  a: a.md\n"),
            &[("a.md", &a)],
        );
        single(&f, V::PipelineInvalid, "pipeline.yaml", line);
    }
}

#[test]
fn unknown_step_kind_and_unknown_stage_references() {
    let a = stage_md("a", "", "x");
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  s:\n    kind: teleport\n",
        &[("a.md", &a)],
    );
    single(&f, V::UnknownStepKind, "pipeline.yaml", 6);
    let f = Fixture::new(
        "id: demo\nentry: zed\nstages:\n  a: a.md\n",
        &[("a.md", &a)],
    );
    single(&f, V::UnknownStage, "pipeline.yaml", 2);
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  r:\n    kind: switch\n    on: \"ctx.x\"\n    cases: { yes: a, no: ghost }\nnext:\n  a: r\n  phantom: end\n",
        &[("a.md", &a)],
    );
    let errs = errors(&f);
    let unknown: Vec<(u64, &str)> = errs
        .iter()
        .filter(|d| d.code == V::UnknownStage)
        .map(|d| (d.line.unwrap(), d.message.as_str()))
        .collect();
    assert_eq!(unknown.len(), 2, "{errs:#?}");
    assert!(unknown.iter().any(|(l, m)| *l == 8 && m.contains("ghost")));
    assert!(
        unknown
            .iter()
            .any(|(l, m)| *l == 11 && m.contains("phantom"))
    );
}

#[test]
fn routers_have_no_next_entry() {
    let a = stage_md("a", "", "x");
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  r: { kind: if_else, condition: \"true\", then: a, else: a }\nnext:\n  a: r\n  r: a\n",
        &[("a.md", &a)],
    );
    single(&f, V::PipelineInvalid, "pipeline.yaml", 8);
}

#[test]
fn expressions_must_parse_and_be_strings() {
    let a = stage_md("a", "", "x");
    let b = stage_md("b", "", "{{ctx.item}}");
    let files = [("a.md", a.as_str()), ("b.md", b.as_str())];
    // map over something that is not an expression
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: { parallel: { map: b, over: [1, 2] } }\n",
        &files,
    );
    single(&f, V::ExpressionInvalid, "pipeline.yaml", 7);
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: { parallel: { map: b, over: \"ctx.items[\" } }\n",
        &files,
    );
    single(&f, V::ExpressionInvalid, "pipeline.yaml", 7);
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\nassert:\n  a: [\"size(parsed.x) > 0\", \"secret == 1\"]\n",
        &files[..1],
    );
    let d = single(&f, V::ExpressionInvalid, "pipeline.yaml", 6);
    assert!(d.message.contains("secret"));
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\ngates:\n  a: { when: \"ctx.x ==\" }\n",
        &files[..1],
    );
    single(&f, V::ExpressionInvalid, "pipeline.yaml", 6);
}

#[test]
fn template_syntax_in_print_content() {
    let a = stage_md("a", "", "x");
    let f = Fixture::new(
        "id: demo\nentry: a\nstages:\n  a: a.md\n  p: { kind: print, content: \"x {{ctx.y\" }\nnext:\n  a: p\n",
        &[("a.md", &a)],
    );
    single(&f, V::TemplateSyntax, "pipeline.yaml", 5);
}

#[test]
fn stage_file_outside_the_pipeline_folder() {
    let outer = tempfile::tempdir().unwrap();
    let pipeline = outer.path().join("p");
    std::fs::create_dir(&pipeline).unwrap();
    std::fs::write(outer.path().join("a.md"), stage_md("a", "", "x")).unwrap();
    std::fs::write(
        pipeline.join("pipeline.yaml"),
        "id: demo\nentry: a\nstages:\n  a: ../a.md\n",
    )
    .unwrap();
    let errs = load_pipeline(&pipeline).unwrap_err().0;
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].code, V::StageFileOutsidePipeline);
    assert_eq!(errs[0].line, Some(4));
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(outer.path().join("a.md"), pipeline.join("link.md")).unwrap();
        std::fs::write(
            pipeline.join("pipeline.yaml"),
            "id: demo\nentry: a\nstages:\n  a: link.md\n",
        )
        .unwrap();
        assert_eq!(
            load_pipeline(&pipeline).unwrap_err().0[0].code,
            V::StageFileOutsidePipeline
        );
    }
}

#[test]
fn oversized_stage_files_are_rejected_without_reading_them() {
    let f = Fixture::linear(&[]);
    // A 50 MB sparse file: rejected by size before any read.
    let big = std::fs::File::create(f.file("b.md")).unwrap();
    big.set_len(50 * 1024 * 1024).unwrap();
    let errs = errors(&f);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].code, V::StageFileTooLarge);
    assert_eq!(errs[0].file.as_deref(), Some(f.file("b.md").as_path()));
}

#[test]
fn missing_and_binary_stage_files_are_unreadable() {
    let yaml = "id: demo\nentry: a\nstages:\n  a: a.md\n";
    let f = Fixture::new(yaml, &[]);
    single(&f, V::StageFileUnreadable, "pipeline.yaml", 4);
    let f = Fixture::new(yaml, &[]);
    std::fs::write(f.file("a.md"), [0xff, 0xfe, 0x00, 0x9f, 0x80]).unwrap();
    let errs = errors(&f);
    assert_eq!(errs[0].code, V::StageFileUnreadable);
    assert!(errs[0].message.contains("UTF-8"));
}

#[cfg(unix)]
#[test]
fn a_fifo_stage_file_is_unreadable_not_waited_on() {
    // Opening a FIFO to read waits for a writer; none comes.
    let yaml = "id: demo\nentry: a\nstages:\n  a: a.md\n";
    let f = Fixture::new(yaml, &[]);
    let made = std::process::Command::new("mkfifo")
        .arg(f.file("a.md"))
        .status()
        .unwrap();
    assert!(made.success());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(errors(&f));
    });
    // A guard, not a measure: the load returns at once or never.
    let errs = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the load returned rather than waiting on the FIFO");
    assert_eq!(errs[0].code, V::StageFileUnreadable);
    assert!(errs[0].message.contains("not a regular file"), "{errs:#?}");
}

#[test]
fn malformed_yaml_of_every_kind_is_a_located_error() {
    let a = stage_md("a", "", "x");
    let cases: [(&str, u64); 5] = [
        ("id: demo\nid: again\nentry: a\nstages:\n  a: a.md\n", 2),
        ("id: demo\nentry: a\nstages:\n\ta: a.md\n", 4),
        ("id: [unclosed\n", 1),
        ("- just\n- a list\n", 1),
        ("id: demo\nentry: 7\nstages:\n  a: a.md\n", 2),
    ];
    for (yaml, line) in cases {
        let f = Fixture::new(yaml, &[("a.md", &a)]);
        let errs = errors(&f);
        assert!(
            errs.iter().all(|d| d.code == V::PipelineInvalid),
            "{yaml}: {errs:#?}"
        );
        assert_eq!(errs[0].line, Some(line), "{yaml}: {errs:#?}");
    }
}

#[test]
fn alias_bomb_in_pipeline_yaml_is_rejected() {
    let mut yaml = String::from(
        "id: demo\nentry: a\nstages:\n  a: a.md\nx0: &x0 [a, a, a, a, a, a, a, a, a, a]\n",
    );
    for i in 1..25 {
        let p = i - 1;
        yaml.push_str(&format!(
            "x{i}: &x{i} [*x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}]\n"
        ));
    }
    let f = Fixture::new(&yaml, &[("a.md", &stage_md("a", "", "x"))]);
    assert_eq!(errors(&f)[0].code, V::PipelineInvalid);
}

#[test]
fn missing_folder_or_pipeline_file() {
    let errs = load_pipeline(std::path::Path::new("/definitely/not/here"))
        .unwrap_err()
        .0;
    assert_eq!(errs[0].code, V::PipelineUnreadable);
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(
        load_pipeline(empty.path()).unwrap_err().0[0].code,
        V::PipelineUnreadable
    );
    // A pipeline.yaml that is there but not text is the pipeline's problem,
    // not a stage file's.
    std::fs::write(empty.path().join("pipeline.yaml"), b"id: \xff\xfe\n").unwrap();
    let errs = load_pipeline(empty.path()).unwrap_err().0;
    assert_eq!(errs[0].code, V::PipelineUnreadable, "{errs:?}");
    assert!(errs[0].message.contains("not UTF-8"), "{errs:?}");
}

#[test]
fn bundled_pipelines_validate() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("stages");
    for (name, stages) in [
        ("code-review", 6),
        ("ralph", 6),
        ("fanout", 3),
        ("triage", 7),
    ] {
        let p = load_pipeline(&root.join(name)).unwrap_or_else(|e| panic!("{name}: {:#?}", e.0));
        assert_eq!(p.id, name);
        assert_eq!(p.stages.len(), stages, "{name}");
    }
}

#[test]
fn provider_block_is_read_and_each_wrong_key_is_located() {
    let yaml = "id: demo\nentry: a\nctx:\n  task: { required: true }\nstages:\n  a: a.md\nprovider:\n  kind: openai\n  baseUrl: http://127.0.0.1:8080/v1\n  model: qwen\n  apiKeyEnv: MY_KEY\n  stream: false\n  maxInflight: 4\n  requestTimeout: 2m\n";
    let ok = Fixture::new(yaml, &[("a.md", &stage_md("a", "", "x"))]);
    let p = load_pipeline(ok.path()).unwrap();
    let block = p.provider.unwrap();
    assert_eq!(block.kind, Some(troupe::definition::ProviderKind::Openai));
    assert_eq!(block.model.as_deref(), Some("qwen"));
    assert_eq!(block.api_key_env.as_deref(), Some("MY_KEY"));
    assert_eq!(block.stream, Some(false));
    assert_eq!(block.max_inflight, Some(4));
    assert_eq!(
        block.request_timeout,
        Some(std::time::Duration::from_secs(120))
    );

    let bad = "id: demo\nentry: a\nctx:\n  task: { required: true }\nstages:\n  a: a.md\nprovider:\n  kind: anthropic\n  baseUrl: localhost:8080\n  apiKey: sk-1\n  modle: x\n  requestTimeout: soon\n";
    let f = Fixture::new(bad, &[("a.md", &stage_md("a", "", "x"))]);
    let errs = errors(&f);
    let located: Vec<(Option<String>, Option<u64>)> =
        errs.iter().map(|d| (d.field.clone(), d.line)).collect();
    let expect = [
        ("provider.kind", 8),
        ("provider.baseUrl", 9),
        ("provider.apiKey", 10),
        ("provider.modle", 11),
        ("provider.requestTimeout", 12),
    ];
    assert_eq!(
        located,
        expect.map(|(f, l)| (Some(f.to_owned()), Some(l))),
        "{errs:#?}"
    );
    let codes: Vec<V> = errs.iter().map(|d| d.code).collect();
    assert_eq!(
        codes,
        [
            V::PipelineInvalid,
            V::PipelineInvalid,
            V::PipelineInvalid,
            V::UnknownKey,
            V::PipelineInvalid
        ]
    );
    assert_eq!(
        errs[3]
            .hint
            .as_deref()
            .map(|h| h.starts_with("did you mean `model`?")),
        Some(true),
        "{:?}",
        errs[3]
    );
    assert!(
        !format!("{errs:?}").contains("sk-1"),
        "a literal key is not echoed"
    );
}

// ------------------------------------------------ unknown keys and caps

#[test]
fn unknown_keys_anywhere_in_pipeline_yaml_are_refused_with_a_did_you_mean() {
    let yaml = "id: demo\nentry: a\nparallelcap: 4\nctx:\n  task: { required: true, defualt: x }\nstages:\n  a: a.md\n  b: b.md\n  c: c.md\n  r: { kind: print, content: hi, contnet: typo }\nnext:\n  a: { parallel: [b, c], join: r, cpa: 2 }\n  r: end\ngates:\n  b: { when: \"true\", otherwise: defer, unless: x }\n";
    let f = Fixture::new(
        yaml,
        &[
            ("a.md", &stage_md("a", "", "Task: {{ctx.task}}")),
            ("b.md", &stage_md("b", "", "x")),
            ("c.md", &stage_md("c", "", "x")),
        ],
    );
    let errs = errors(&f);
    let found: Vec<(&str, u64, Option<&str>)> = errs
        .iter()
        .map(|d| {
            assert_eq!(d.code, V::UnknownKey, "{d:#?}");
            (
                d.field.as_deref().unwrap(),
                d.line.unwrap(),
                d.hint.as_deref(),
            )
        })
        .collect();
    let fields: Vec<(&str, u64)> = found.iter().map(|(f, l, _)| (*f, *l)).collect();
    assert_eq!(
        fields,
        [
            ("parallelcap", 3),
            ("ctx.task.defualt", 5),
            ("stages.r.contnet", 10),
            ("next.a.cpa", 12),
            ("gates.b.unless", 15),
        ]
    );
    let hint = |field: &str| found.iter().find(|f| f.0 == field).unwrap().2.unwrap();
    assert!(hint("parallelcap").starts_with("did you mean `parallelCap`?"));
    assert!(hint("ctx.task.defualt").starts_with("did you mean `default`?"));
    assert!(hint("stages.r.contnet").starts_with("did you mean `content`?"));
    assert!(hint("next.a.cpa").starts_with("did you mean `cap`?"));
    assert!(!hint("gates.b.unless").starts_with("did you mean"));
}

#[test]
fn a_fan_out_takes_its_own_cap_on_static_and_map_plans() {
    let yaml = "id: demo\nentry: a\nparallelCap: 8\nstages:\n  a: a.md\n  b: b.md\n  c: c.md\n  w: w.md\nnext:\n  a: { parallel: [b, c], cap: 1 }\n  b: { parallel: { map: w, over: \"[1, 2, 3]\", cap: 2 } }\n  c: { parallel: { map: w, over: \"[1]\" }, cap: 16 }\n";
    let f = Fixture::new(
        yaml,
        &[
            ("a.md", &stage_md("a", "", "x")),
            ("b.md", &stage_md("b", "", "x")),
            ("c.md", &stage_md("c", "", "x")),
            ("w.md", &stage_md("w", "", "{{ctx.item}}")),
        ],
    );
    let p = load_pipeline(f.path()).unwrap();
    let cap_of = |id: &str| match p.next_of(id) {
        Some(troupe::definition::Next::Parallel(plan)) => plan.cap,
        other => panic!("{other:?}"),
    };
    assert_eq!(cap_of("a"), Some(1));
    assert_eq!(cap_of("b"), Some(2));
    assert_eq!(cap_of("c"), Some(16));
    let plan = match p.next_of("c") {
        Some(troupe::definition::Next::Parallel(plan)) => plan.clone(),
        _ => unreachable!(),
    };
    assert_eq!(plan.effective_cap(8), 8, "the run's cap bounds a fan-out's");
    assert_eq!(plan.effective_cap(32), 16);

    let twice = "id: demo\nentry: a\nstages:\n  a: a.md\n  w: w.md\nnext:\n  a: { parallel: { map: w, over: \"[1]\", cap: 2 }, cap: 3 }\n";
    let f = Fixture::new(
        twice,
        &[
            ("a.md", &stage_md("a", "", "x")),
            ("w.md", &stage_md("w", "", "{{ctx.item}}")),
        ],
    );
    let d = single(&f, V::InvalidParallelPlan, "pipeline.yaml", 7);
    assert!(d.message.contains("cap is given twice"), "{d:#?}");
}

/// One bad part of a fan-out's `next` entry does not hide another: a
/// `over:` that is not CEL and a `join:` that names no stage are both
/// said at once.
#[test]
fn a_bad_over_does_not_hide_a_dangling_join() {
    let f = Fixture::new(
        "id: p\nentry: a\nstages:\n  a: { kind: print, content: x }\n  b: { kind: print, content: y }\nnext:\n  a: { parallel: { map: b, over: \"ctx.items.map(\" }, join: nosuch }\n  b: end\n",
        &[],
    );
    let codes: Vec<V> = errors(&f).into_iter().map(|d| d.code).collect();
    assert!(codes.contains(&V::ExpressionInvalid), "{codes:?}");
    assert!(codes.contains(&V::StageJoinDangling), "{codes:?}");
}
