//! The runtimes a starter can run under (Python, Node.js): the command to look for, the SDK's
//! minimum version, the packages that give one, and how to ask an interpreter about itself.

use super::super::Lang;

/// The runtime of a starter that runs under an interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::new) enum Runtime {
    Python,
    Node,
}

impl Runtime {
    pub(in crate::new) fn of(lang: Lang) -> Option<Runtime> {
        match lang {
            Lang::Python => Some(Runtime::Python),
            Lang::Node => Some(Runtime::Node),
            Lang::Rust | Lang::C | Lang::Go => None,
        }
    }

    /// The command looked for on PATH, then in /usr/bin and /usr/local/bin.
    pub(super) fn command(self) -> &'static str {
        match self {
            Runtime::Python => "python3",
            Runtime::Node => "node",
        }
    }

    pub(super) fn title(self) -> &'static str {
        match self {
            Runtime::Python => "Python",
            Runtime::Node => "Node.js",
        }
    }

    /// The SDK's minimum version (sdk/python/pyproject.toml, sdk/node/package.json).
    pub(super) fn minimum(self) -> (u32, u32) {
        match self {
            Runtime::Python => (3, 11),
            Runtime::Node => (18, 0),
        }
    }

    pub(super) fn show_version(self, (major, minor): (u32, u32)) -> String {
        match self {
            Runtime::Python => format!("{major}.{minor}"),
            Runtime::Node if minor == 0 => format!("{major}"),
            Runtime::Node => format!("{major}.{minor}"),
        }
    }

    /// The Debian packages that give one.
    pub(super) fn debian(self) -> &'static str {
        match self {
            Runtime::Python => "apt-get install python3 python3-pip",
            Runtime::Node => "apt-get install nodejs npm",
        }
    }

    /// The arguments that make it print what [`parse_probe`](super::probe::parse_probe) reads.
    pub(super) fn probe_args(self) -> [&'static str; 2] {
        match self {
            Runtime::Python => [
                "-c",
                "import os, sys\n\
                 print(sys.executable)\n\
                 print(sys.version_info[0], sys.version_info[1])\n\
                 print(sys.prefix)\n\
                 print(sys.base_prefix)\n\
                 print(os.path.dirname(os.__file__))",
            ],
            Runtime::Node => [
                "-p",
                "[process.execPath, process.versions.node.split('.').slice(0, 2).join(' ')]\
                 .join('\\n')",
            ],
        }
    }
}
