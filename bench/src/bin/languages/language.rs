//! The languages measured, and how each is named in the report.

use clap::ValueEnum;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Language {
    Rust,
    C,
    Go,
    Python,
    Node,
}

impl Language {
    pub(crate) const ALL: [Language; 5] = [
        Language::Rust,
        Language::C,
        Language::Go,
        Language::Python,
        Language::Node,
    ];

    /// As on the command line and in the JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::C => "c",
            Language::Go => "go",
            Language::Python => "python",
            Language::Node => "node",
        }
    }

    /// As in the report's tables.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Language::Rust => "Rust",
            Language::C => "C",
            Language::Go => "Go",
            Language::Python => "Python",
            Language::Node => "Node.js",
        }
    }
}
