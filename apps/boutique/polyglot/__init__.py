"""Four of the boutique's services in the languages of Google's original demo, each with its
zerohop SDK: ``email`` and ``recommendation`` (this package, Python), ``currency.js``
(Node.js) and ``shipping/`` (Go). ``chain-polyglot.yaml`` runs them in place of the Rust
ones; see README.md ("The original's languages")."""
