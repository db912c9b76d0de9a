//! What a server is given and asks: its secrets kept out of what troupe
//! records, its forms (elicitation) answered, declined or withdrawn.

use super::*;

#[test]
fn an_elicitation_goes_to_the_answers_file_and_is_declined_when_headless() {
    let yaml = format!(
        "id: t\nentry: ask\nmcpServers:\n{}stages:\n  ask: {{ kind: tool, tool: srv__elicit }}\nnext:\n  ask: end\n",
        fault_block("srv", Path::new(STATS), &[], "")
    );
    // Headless, no rule: declined, audited as such.
    let project = project(&yaml, &[]);
    let (out, summary, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = parsed(&summary, "ask")["text"].as_str().unwrap().to_owned();
    assert_eq!(text, "no answer: decline");
    let answered: Vec<&Value> = events(&audit, "InteractionAnswered");
    assert_eq!(answered.len(), 1, "{audit:#?}");
    assert_eq!(answered[0]["kind"], "elicitation");
    assert_eq!(answered[0]["outcome"], "declined");
    assert_eq!(answered[0]["by"], "noInteractor");
    // An answers file's elicit rule fills the form.
    std::fs::write(
        project.path().join("answers.yaml"),
        "answers:\n  - { elicit: srv, answer: approve, content: { name: Ada } }\n",
    )
    .unwrap();
    let (out, summary, audit) = run(&project, &["--answers", "answers.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = parsed(&summary, "ask")["text"].as_str().unwrap().to_owned();
    assert_eq!(text, r#"got: {"name": "Ada"}"#);
    let raised = events(&audit, "InteractionRaised");
    assert_eq!(raised[0]["message"], "Who is asking?");
    let answered = events(&audit, "InteractionAnswered");
    assert_eq!(answered[0]["outcome"], "accepted");
    assert_eq!(answered[0]["by"], "answers:answers.yaml");
    // Content that does not fit the server's form is never sent: the rule
    // is passed over (and said), and the next one answers, or no one.
    for (rules, said_back, by) in [
        (
            "answers:\n  - { elicit: srv, answer: approve, content: { age: 3 } }\n",
            "no answer: decline",
            "noInteractor",
        ),
        (
            "answers:\n  - { elicit: srv, answer: approve, content: \"yes\" }\n",
            "no answer: decline",
            "noInteractor",
        ),
    ] {
        std::fs::write(project.path().join("answers.yaml"), rules).unwrap();
        let second = project.path().join("second.yaml");
        std::fs::write(&second, "answers:\n  - { elicit: '*', answer: deny }\n").unwrap();
        let (out, summary, audit) = run(&project, &["--answers", "answers.yaml"]);
        assert_eq!(out.status.code(), Some(0), "{rules}: {}", said(&out));
        let text = parsed(&summary, "ask")["text"].as_str().unwrap().to_owned();
        assert_eq!(text, said_back, "{rules}");
        let answered = events(&audit, "InteractionAnswered");
        assert_eq!(answered[0]["by"], by, "{rules}");
        assert!(
            answered[0]["unfit"]
                .as_str()
                .unwrap()
                .contains("answers.yaml#0"),
            "{:?}",
            answered[0]
        );
        // A later file's rule is asked next.
        let (_, _, audit) = run(
            &project,
            &["--answers", "answers.yaml", "--answers", "second.yaml"],
        );
        let answered = events(&audit, "InteractionAnswered");
        assert_eq!(answered[0]["by"], "answers:second.yaml", "{rules}");
    }
}

/// A form whose call ended (here its timeout) is withdrawn at once, even
/// though the server never withdraws its question: no one is left asked
/// about a call that no longer waits for the answer. (The elicitor is
/// one that never answers, as a person who walked away.)
#[test]
fn a_form_is_withdrawn_when_the_call_that_asked_ends() {
    use std::sync::Arc;
    use std::sync::mpsc::{Sender, channel};
    use troupe::tools::mcp::{
        ElicitAnswer, ElicitRequest, Elicitor, ElicitorSlot, McpPool, McpStart,
    };

    /// Never answers; says when its form is let go.
    #[derive(Debug)]
    struct Never(Sender<()>);
    struct LetGo(Sender<()>);
    impl Drop for LetGo {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    impl Elicitor for Never {
        fn elicit(&self, _: ElicitRequest) -> futures::future::BoxFuture<'static, ElicitAnswer> {
            let let_go = LetGo(self.0.clone());
            Box::pin(async move {
                let _let_go = let_go;
                std::future::pending::<ElicitAnswer>().await
            })
        }
    }
    let yaml = format!(
        "id: t\nentry: ask\nmcpServers:\n{}stages:\n  ask: {{ kind: tool, tool: srv__elicit }}\nnext:\n  ask: end\n",
        fault_block("srv", Path::new(STATS), &[], "    timeout: 1s\n")
    );
    let project = project(&yaml, &[]);
    let pipeline = troupe::definition::load_pipeline(&project.path().join("p")).unwrap();
    let (tell, let_go) = channel();
    let elicitor = Arc::new(ElicitorSlot::default());
    elicitor.set(Arc::new(Never(tell)));
    let start = McpStart {
        root: project.path().to_owned(),
        sandbox: None,
        log_dir: None,
        start_timeout: std::time::Duration::from_secs(30),
        deny_network: false,
        elicitor,
    };
    let pool = McpPool::start(&pipeline.mcp_servers, &start).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let called = rt.block_on(pool.call(
        "srv__elicit",
        &serde_json::json!({}),
        &tokio_util::sync::CancellationToken::new(),
    ));
    assert!(called.is_err(), "{called:?}");
    // Let go while the connection lives on (before the pool is dropped).
    let_go
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the form still waits");
    drop(pool);
}

/// A server that says its environment: the value of a variable its
/// `env:` names reaches neither the summary nor the store nor the audit
/// log (a tool step's result is the stage's), as docs/mcp.md promises.
#[test]
fn a_value_the_server_was_given_is_redacted_from_what_it_says() {
    let secret = "troupe-test-secret-0123456789";
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: {{ kind: tool, tool: srv__env, args: {{ name: TROUPE_TEST_MCP_SECRET }} }}\nnext:\n  s: end\n",
        fault_block(
            "srv",
            Path::new(STATS),
            &[],
            "    env: [TROUPE_TEST_MCP_SECRET]\n"
        )
    );
    let project = project(&yaml, &[]);
    let out = project
        .troupe()
        .args(["run", "p", "--json", "--headless"])
        .env("TROUPE_TEST_MCP_SECRET", secret)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let summary = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!summary.contains(secret), "the summary holds the value");
    let v: Value = serde_json::from_str(&summary).unwrap();
    // The step's result is the server's structured content.
    assert_eq!(
        v["results"][0]["parsed"]["value"], "[redacted]",
        "{summary}"
    );
    let log = troupe::auditlog::read_text(&project.path().join(v["auditPath"].as_str().unwrap()))
        .unwrap();
    assert!(!log.contains(secret), "the audit log holds the value");
    let shown = project.output(&["runs", "show", v["runId"].as_str().unwrap(), "--json"]);
    assert!(
        !String::from_utf8_lossy(&shown.stdout).contains(secret),
        "the store holds the value"
    );
}

/// `--no-sandbox` hands shells every variable, but an MCP server still
/// gets only the scrubbed environment and the names its `env:` lists: the
/// API key is not among them.
#[test]
fn a_server_under_no_sandbox_gets_no_variable_it_did_not_name() {
    let key = "sk-troupe-test-key-0123456789";
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: {{ kind: tool, tool: srv__env, args: {{ name: OPENAI_API_KEY }} }}\nnext:\n  s: end\n",
        fault_block(
            "srv",
            Path::new(STATS),
            &[],
            "    env: [TROUPE_TEST_NEVER_SET]\n"
        )
    );
    let project = project(&yaml, &[]);
    let out = project
        .troupe()
        .args(["run", "p", "--json", "--headless", "--no-sandbox"])
        .env("OPENAI_API_KEY", key)
        .env_remove("TROUPE_TEST_NEVER_SET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results"][0]["parsed"]["value"], "", "{v}");
    // A name its env: lists that is not set is said, not passed over.
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("`TROUPE_TEST_NEVER_SET` (in its env:) is not set"),
        "{}",
        said(&out)
    );
}
