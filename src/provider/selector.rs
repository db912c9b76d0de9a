//! Selecting stage executions by name: `stage` (every execution of it) or
//! `stage#N` (sibling N), as `script.yaml` keys and `--fail-sibling` write
//! them.

/// Selects executions: `stage` (every execution of it) or `stage#N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub stage: String,
    pub index: Option<usize>,
}

impl Selector {
    /// Parses `worker#17` or `review`.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let (stage, index) = match text.split_once('#') {
            Some((s, i)) => (
                s,
                Some(i.parse::<usize>().map_err(|_| {
                    format!("`{text}`: the part after `#` must be a sibling index")
                })?),
            ),
            None => (text, None),
        };
        if stage.is_empty() {
            return Err(format!("`{text}` names no stage"));
        }
        Ok(Selector {
            stage: stage.to_owned(),
            index,
        })
    }

    /// Whether the execution of `stage` (sibling `index`) is selected.
    pub fn matches(&self, stage: &str, index: Option<usize>) -> bool {
        self.stage == stage && (self.index.is_none() || self.index == index)
    }
}

impl std::fmt::Display for Selector {
    /// The text `parse` reads back: `worker#17` or `review`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}#{i}", self.stage),
            None => f.write_str(&self.stage),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        assert_eq!(
            Selector::parse("worker#17").unwrap(),
            Selector {
                stage: "worker".into(),
                index: Some(17)
            }
        );
        assert_eq!(Selector::parse("review").unwrap().index, None);
        assert!(Selector::parse("worker#x").is_err());
        assert!(Selector::parse("#3").is_err());
        assert!(
            Selector::parse("worker#3")
                .unwrap()
                .matches("worker", Some(3))
        );
        assert!(
            !Selector::parse("worker#3")
                .unwrap()
                .matches("worker", Some(4))
        );
    }
}
