//! Errors of the config layer. They know nothing of HTTP or exit codes.

use std::path::PathBuf;

/// One problem in a config file: the dotted key, the line when known, and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigProblem {
    pub key: String,
    pub line: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{} (line {line}): {}", self.key, self.message),
            None => write!(f, "{}: {}", self.key, self.message),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no config file at {path} ({how}); run `ctx init` to create one, or pass --config <file>")]
    NotFound { path: PathBuf, how: &'static str },

    #[error("cannot read config file {path}: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}:{line}:{column}: TOML syntax error: {message}")]
    Syntax { path: PathBuf, line: usize, column: usize, message: String },

    #[error("{path} has {} problem(s):\n{}", problems.len(), list(problems))]
    Invalid { path: PathBuf, problems: Vec<ConfigProblem> },
}

impl ConfigError {
    /// Every problem this error reports, for `ctx schema check`.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        match self {
            ConfigError::Invalid { problems, .. } => problems.clone(),
            ConfigError::Syntax { line, message, .. } => {
                vec![ConfigProblem { key: "(syntax)".into(), line: Some(*line), message: message.clone() }]
            }
            other => vec![ConfigProblem { key: "(file)".into(), line: None, message: other.to_string() }],
        }
    }
}

fn list(problems: &[ConfigProblem]) -> String {
    problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n")
}
